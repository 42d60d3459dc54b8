"""The cost of one cycle: its expected wall time and the tokens it emits per row.

For a candidate (chain, window) and a batch, one cycle is predicted exactly under the model's inputs by
carrying the distribution of proposal lengths up the chain:

- level 1 (the drafter) makes W forward passes: the first feeds its pending tokens, the others one token
  (for a batch of one row, whose drafter looks ahead, the others cost a measured fraction of that);
- level j verifies what level j - 1 handed up. A row whose incoming proposal has l tokens accepts m of
  them with probability a_0 ... a_(m-1) (1 - a_m) (all l with probability a_0 ... a_(l-1)), where a_i
  is the pair's acceptance at draft position i, and hands up m + 1 tokens. Its forward feeds 1 pending
  token plus the proposal, and the batch is padded to its longest row, so the pass costs
  t_j(B, 1 + max_b l_b); rows are independent, so P(max <= l) = prod_b P(l_b <= l);
- the target's hand-up is what the cycle emits.

T_eff = E[cost] / E[emitted]: the expected wall time per emitted token of a row. Every cycle also costs
the router's own work and one round trip per level, measured live and added here.

Approximations, each small and stated: the drafter's first pass feeds 1 + max(0, emitted - W) tokens
(the tokens emitted last cycle that it has not cached, assuming last cycle ran the same chain); an
intermediate verifier feeds 1 pending token; acceptance at a position does not depend on the others'
outcomes beyond the prefix rule (positions are measured as conditional rates, so this is exact for the
mean of each position but ignores correlation between rows of one batch).
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np

LatencyFn = Callable[[str, int, int], float]          # (model, batch size, tokens per row) -> ns
OverheadFn = Callable[[str, int], float]              # (model, forward passes in the call) -> ns
DraftScaleFn = Callable[[str, int], float]            # (drafter, window) -> its later passes over single-token ones


@dataclass(frozen=True)
class RowGroup:
    """Rows of one decoding mode in the batch, and their acceptance per level pair of the chain."""

    rows: int
    acceptance: Sequence[Sequence[float]]   # per verifier level j = 2..n: a_i for i = 0..max proposal - 1


@dataclass(frozen=True)
class Prediction:
    chain: tuple[str, ...]
    window: int
    batch_size: int
    cost_ns: float                 # expected wall time of one cycle
    emitted: float                 # expected tokens emitted per row
    level_ns: tuple[float, ...]    # expected wall time per level, router overhead excluded
    checks: tuple[tuple[float, float], ...] = ()  # per verifier level: (E[accepted], E[positions checked]) per row
    emitted_var: float = 0.0       # variance of the tokens one row emits in a cycle
    emitted_dist: tuple[float, ...] = ()   # P(a row emits n tokens in a cycle), n = 0, 1, ... (rows mixed)

    @property
    def t_eff_ns(self) -> float:
        return self.cost_ns / self.emitted

    @property
    def tokens_per_s(self) -> float:
        return self.batch_size * self.emitted / self.cost_ns * 1e9

    def scaled_cost_ns(self, scales: Mapping[str, float]) -> float:
        """The cycle's cost with each level's time multiplied by its model's scale (1 when not given)."""
        return self.cost_ns + sum(ns * (scales.get(m, 1.0) - 1.0) for ns, m in zip(self.level_ns, self.chain))

    def scaled(self, scales: Mapping[str, float]) -> Prediction:
        """The same cycle with each level's time multiplied by its model's scale."""
        level_ns = tuple(ns * scales.get(m, 1.0) for ns, m in zip(self.level_ns, self.chain))
        return dataclasses.replace(self, cost_ns=self.scaled_cost_ns(scales), level_ns=level_ns)


def accepted_distribution(incoming: Sequence[float], rates: Sequence[float]) -> tuple[list[float], float]:
    """Distribution of the hand-up length (accepted + 1) given the distribution of incoming lengths.

    incoming[l] = P(proposal has l tokens); out[m + 1] = P(m accepted). rates[i] is the acceptance at
    position i given all earlier positions were accepted. Also returns the expected number of positions
    checked (up to and including the first rejection), the denominator of a measured acceptance rate.
    """
    out = [0.0] * (len(incoming) + 1)
    tried = 0.0
    for length, p_len in enumerate(incoming):
        if p_len == 0.0:
            continue
        reach = p_len                      # P(first `m` positions accepted)
        for m in range(length):
            a = rates[m] if m < len(rates) else rates[-1]
            tried += reach
            out[m + 1] += reach * (1.0 - a)
            reach *= a
        out[length + 1] += reach
    return out, tried


def _cdf(dist: Sequence[float]) -> list[float]:
    total, out = 0.0, []
    for p in dist:
        total += p
        out.append(min(total, 1.0))
    return out


def expected_batch_cost(dists: Sequence[tuple[Sequence[float], int]], cost: Callable[[int], float]) -> float:
    """E[cost(max over rows of the length)]: `dists` holds (length distribution, rows) per row group."""
    cdfs = [(_cdf(d), n) for d, n in dists if n > 0]
    longest = max(len(c) for c, _ in cdfs)
    expected, below = 0.0, 0.0
    for length in range(longest):
        at_most = 1.0
        for c, n in cdfs:
            at_most *= (c[length] if length < len(c) else 1.0) ** n
        p = at_most - below
        if p > 1e-12:
            expected += p * cost(length)
        below = at_most
    return expected


def predict(chain: Sequence[str], window: int, groups: Sequence[RowGroup], latency: LatencyFn,
            overhead: OverheadFn, cycle_overhead_ns: float = 0.0, target_block: int = 1,
            draft_scale: DraftScaleFn | None = None) -> Prediction:
    """Expected cost and emitted tokens of one cycle of `chain` at `window` over the rows of `groups`.
    A target-only cycle (window 0) is one call in which the target drafts `target_block` tokens of its own.
    `draft_scale`: for a batch of one row, what the drafter's W - 1 later passes cost in single-token
    passes (a drafter drafting for one row looks ahead; `draft_passes`); 1 when not given."""
    chain = tuple(chain)
    batch = sum(g.rows for g in groups)
    if batch < 1:
        raise ValueError("a prediction needs at least one row")
    if len(chain) == 1:
        (model,) = chain
        block = max(1, target_block)
        level_ns = (block * latency(model, batch, 1) + overhead(model, block),)
        return Prediction(chain, 0, batch, level_ns[0] + cycle_overhead_ns, float(block), level_ns,
                          emitted_dist=(0.0,) * block + (1.0,))
    # lengths per group, level by level: level 1 proposes exactly W tokens
    incoming = [[0.0] * window + [1.0] for _ in groups]
    verify_ns, checks = [], []
    for level, model in enumerate(chain[1:]):
        verify_ns.append(expected_batch_cost([(d, g.rows) for d, g in zip(incoming, groups)],
                                             lambda length, m=model: latency(m, batch, 1 + length))
                         + overhead(model, 1))
        steps = [accepted_distribution(d, g.acceptance[level]) for d, g in zip(incoming, groups)]
        incoming = [out for out, _ in steps]
        accepted = sum(g.rows * sum((n - 1) * p for n, p in enumerate(out) if n) for (out, _), g in zip(steps, groups))
        tried = sum(g.rows * t for (_, t), g in zip(steps, groups))
        checks.append((accepted / batch, tried / batch))
    emitted_dists = incoming
    drafter = chain[0]
    # the drafter's first pass feeds the emitted tokens it has not cached: it cached W - 1 of its own
    first_dists = []
    for d in emitted_dists:
        pending = [0.0] * (len(d) + 1)
        for n, p in enumerate(d):
            pending[1 + max(0, n - window)] += p
        first_dists.append(pending)
    later = draft_scale(drafter, window) if draft_scale is not None and batch == 1 else 1.0
    draft_ns = (expected_batch_cost([(d, g.rows) for d, g in zip(first_dists, groups)],
                                    lambda k: latency(drafter, batch, k))
                + later * (window - 1) * latency(drafter, batch, 1) + overhead(drafter, window))
    emitted = sum(g.rows * sum(n * p for n, p in enumerate(d)) for d, g in zip(emitted_dists, groups)) / batch
    square = sum(g.rows * sum(n * n * p for n, p in enumerate(d)) for d, g in zip(emitted_dists, groups)) / batch
    mixed = [0.0] * max(len(d) for d in emitted_dists)
    for d, g in zip(emitted_dists, groups):
        for n, p in enumerate(d):
            mixed[n] += g.rows * p / batch
    level_ns = (draft_ns, *verify_ns)
    return Prediction(chain, window, batch, sum(level_ns) + cycle_overhead_ns, emitted, level_ns, tuple(checks),
                      max(0.0, square - emitted * emitted), tuple(mixed))


def _acceptance_matrices(rates: Sequence[Sequence[float]], longest: int) -> tuple[np.ndarray, np.ndarray]:
    """accepted_distribution as a matrix over proposal lengths 0 .. `longest`, for each row group's rates:
    T[g, l, m + 1] = P(a proposal of l tokens hands up m + 1), and the expected positions checked for
    each l (tried[g, l])."""
    return _group_matrices(tuple(map(tuple, rates)), longest)


@functools.lru_cache(maxsize=1024)
def _group_matrices(rates: tuple[tuple[float, ...], ...], longest: int) -> tuple[np.ndarray, np.ndarray]:
    """`_acceptance_matrices` of the groups' rates, kept (read-only) for the next plan that prices the same
    pairs at the same shifts: a plan prices every chain, and a pair's rates recur in the plans for other
    matches of the lookup's rows and other records' shifts of other pairs."""
    matrices = [_acceptance_matrix(r, longest) for r in rates]
    t, tried = np.stack([t for t, _ in matrices]), np.stack([tried for _, tried in matrices])
    t.flags.writeable = tried.flags.writeable = False
    return t, tried


@functools.lru_cache(maxsize=1024)
def _acceptance_matrix(rates: tuple[float, ...], longest: int) -> tuple[np.ndarray, np.ndarray]:
    """One row group's (T[l, m + 1], tried[l]) of `_acceptance_matrices`, kept (read-only) for every chain
    through the same pair at the same shift."""
    a = np.array([rates[m] if m < len(rates) else rates[-1] for m in range(longest + 1)])
    reach = np.ones_like(a)                                # P(the first m positions accepted)
    reach[1:] = np.cumprod(a)[:-1]
    ended = reach * (1.0 - a)                              # P(m accepted, then a rejection)
    lengths = np.arange(longest + 1)
    below = lengths[None, :] < lengths[:, None]            # [l, m]: m < l
    t = np.zeros((longest + 1, longest + 2))
    t[:, 1:] = np.where(below, ended[None, :], 0.0)
    t[lengths, lengths + 1] = reach
    tried = np.zeros_like(a)                               # sum over m < l of P(reach m)
    tried[1:] = np.cumsum(reach)[:-1]
    t.flags.writeable = tried.flags.writeable = False
    return t, tried


def _expected_max_cost(dists: np.ndarray, rows: np.ndarray, cost: np.ndarray) -> np.ndarray:
    """expected_batch_cost for every candidate at once: `dists[g, k, l]` is the probability that a row of
    group g has length l under candidate k, `rows[g]` the group's rows; `cost[l]` is the cost of a pass
    whose longest row has l tokens. Lengths below 1e-12 of probability are skipped as
    expected_batch_cost skips them."""
    cdf = np.minimum(np.cumsum(dists, axis=2), 1.0)
    if len(rows) == 1:   # one group (a lone row, or rows that all match alike): no product over groups
        at_most = cdf[0] if rows[0] == 1 else cdf[0] ** rows[0]
    else:
        at_most = np.prod(cdf ** rows[:, None, None], axis=0)
    p = at_most.copy()
    p[:, 1:] -= at_most[:, :-1]
    p[p <= 1e-12] = 0.0
    return p @ cost


def predict_windows(chain: Sequence[str], windows: Sequence[int], groups: Sequence[RowGroup],
                    latency: LatencyFn, overhead: OverheadFn, cycle_overhead_ns: float = 0.0,
                    target_block: int = 1, draft_scale: DraftScaleFn | None = None) -> list[Prediction]:
    """[predict(chain, w, ...) for w in windows], computed for all the windows and row groups at once:
    the same expectations (to rounding), carried up the chain as one length distribution per group and
    window (an array of groups x windows x lengths). A plan needs every chain at every window, and a
    batch priced by its rows' lookup matches has a group per match length (`predict` stays the
    reference the tests hold this to)."""
    chain = tuple(chain)
    if len(chain) == 1 or not windows:
        return [predict(chain, w, groups, latency, overhead, cycle_overhead_ns, target_block, draft_scale)
                for w in windows]
    batch = sum(g.rows for g in groups)
    if batch < 1:
        raise ValueError("a prediction needs at least one row")
    rows = np.array([g.rows for g in groups], dtype=float)
    ws = np.asarray(windows)
    k = np.arange(len(ws))
    longest = int(ws.max())
    width = longest + len(chain)          # hand-up lengths 0 .. longest + levels
    incoming = np.zeros((len(groups), len(ws), width))
    incoming[:, k, ws] = 1.0              # level 1 proposes exactly W tokens, for every group
    verify_ns, checks = [], []
    handed_up = np.maximum(np.arange(width) - 1, 0)   # tokens accepted of a hand-up of n
    for level, model in enumerate(chain[1:]):
        top = longest + level             # the longest incoming proposal at this level
        cost = np.zeros(width)
        cost[:top + 1] = pass_costs(latency, model, batch, top + 1)
        verify_ns.append(_expected_max_cost(incoming, rows, cost) + overhead(model, 1))
        t, t_tried = _acceptance_matrices([g.acceptance[level] for g in groups], top)
        out = np.zeros_like(incoming)
        out[:, :, :top + 2] = incoming[:, :, :top + 1] @ t
        accepted = rows @ (out @ handed_up)
        tried = rows @ (incoming[:, :, :top + 1] @ t_tried[:, :, None])[:, :, 0]
        incoming = out
        checks.append((accepted / batch, tried / batch))
    drafter = chain[0]
    single = latency(drafter, batch, 1)
    # the drafter's first pass feeds the emitted tokens it has not cached: it cached W - 1 of its own
    # (1 token when the cycle emitted at most W, else 1 + the emitted past W)
    first = np.zeros((len(groups), len(ws), width + 1))
    first[:, :, 1] = np.cumsum(incoming, axis=2)[:, k, ws]
    for i, w in enumerate(windows):
        first[:, i, 2:width - w + 1] = incoming[:, i, w + 1:]
    draft_cost = np.zeros(width + 1)
    draft_cost[1:] = pass_costs(latency, drafter, batch, width)
    first_ns = _expected_max_cost(first, rows, draft_cost)
    lengths = np.arange(width)
    mixed = (rows @ incoming.reshape(len(groups), -1)).reshape(len(ws), width) / batch
    emitted = mixed @ lengths
    square = mixed @ (lengths * lengths)
    out = []
    verify_ns = np.array(verify_ns).T.tolist()                      # [window][level]
    checks = np.array(checks).transpose(2, 0, 1).tolist()          # [window][level][2]
    rows = zip(windows, first_ns.tolist(), verify_ns, checks, emitted.tolist(), square.tolist(), mixed.tolist())
    for w, first_w, verify_w, checks_w, e, sq, mixed_w in rows:
        later = draft_scale(drafter, w) if draft_scale is not None and batch == 1 else 1.0
        level_ns = (first_w + later * (w - 1) * single + overhead(drafter, w), *verify_w)
        out.append(Prediction(chain, w, batch, sum(level_ns) + cycle_overhead_ns, e, level_ns,
                              tuple(map(tuple, checks_w)), max(0.0, sq - e * e), tuple(mixed_w[:w + len(chain)])))
    return out


def pass_costs(latency: LatencyFn, model: str, batch: int, longest: int) -> Sequence[float]:
    """latency(model, batch, k) for k = 1 .. `longest`; from the table's own array where it keeps one
    (`LatencyTable.costs`), as a plan asks for the same passes of every chain through a model."""
    costs = getattr(latency, "costs", None)
    if costs is not None:
        return costs(model, batch, longest)
    return [latency(model, batch, k) for k in range(1, longest + 1)]


def call_overhead(known: Mapping[tuple[str, int], float], model: str, forwards: int) -> float:
    """The router-side cost of a call to `model` beyond its `forwards` passes (round trip, sampling, ...),
    from the measured EMAs: the EMA of that many passes when there is one, else the
    line through the fewest and the most passes measured (never below 0), 0 when none is measured."""
    if (model, forwards) in known:
        return known[(model, forwards)]
    same = sorted((f, y) for (m, f), y in known.items() if m == model)
    if not same:
        return 0.0
    if len(same) == 1:
        return same[0][1]
    (f0, y0), (f1, y1) = same[0], same[-1]
    return max(0.0, y0 + (y1 - y0) * (forwards - f0) / (f1 - f0))
