"""The cost model against brute force and simulation: exact distributions, expected cost and emitted tokens."""

from __future__ import annotations

import itertools
import math
import random

import numpy as np
import pytest

from specrouter.router.scheduling.cycle_cost import (Prediction, RowGroup, accepted_distribution, expected_batch_cost,
                                                     predict, predict_windows)
from specrouter.router.scheduling.finish import (best_finish, expected_max, finish_excess, finish_regret,
                                                 max_normal_moments, tail_factor)
from specrouter.router.scheduling.latency import LatencyTable

# An arbitrary latency model: a fixed cost plus a cost per token of the padded block.
COSTS = {"a": (1.0e6, 0.02e6), "b": (2.5e6, 0.05e6), "t": (9.0e6, 0.4e6)}


def latency(model: str, batch: int, tokens: int) -> float:
    fixed, per_token = COSTS[model]
    return fixed + per_token * batch * tokens


def overhead(model: str, forwards: int) -> float:
    return 0.3e6 + 0.1e6 * forwards


def test_accepted_distribution_matches_enumeration() -> None:
    rng = random.Random(7)
    for _ in range(20):
        max_len = rng.randint(0, 6)
        incoming = [rng.random() for _ in range(max_len + 1)]
        incoming = [p / sum(incoming) for p in incoming]
        rates = [rng.random() for _ in range(max_len)] or [0.5]
        out, tried = accepted_distribution(incoming, rates)
        want, want_tried = [0.0] * (max_len + 2), 0.0
        for length, p_len in enumerate(incoming):
            for outcome in itertools.product([True, False], repeat=length):  # accept or reject per position
                p = p_len * math.prod(rates[i] if ok else 1 - rates[i] for i, ok in enumerate(outcome))
                accepted = next((i for i, ok in enumerate(outcome) if not ok), length)
                want[accepted + 1] += p
                want_tried += p * min(accepted + 1, length)
        assert out == pytest.approx(want, abs=1e-12)
        assert tried == pytest.approx(want_tried, abs=1e-12)
        assert sum(out) == pytest.approx(1.0)


def test_expected_batch_cost_is_the_cost_of_the_longest_row() -> None:
    dists = [([0.2, 0.5, 0.3], 2), ([0.6, 0.4], 1)]
    want = 0.0
    lengths = [range(3), range(3), range(2)]
    probs = [dists[0][0], dists[0][0], dists[1][0]]
    for combo in itertools.product(*lengths):
        want += math.prod(p[c] for p, c in zip(probs, combo)) * (10 + max(combo) ** 2)
    assert expected_batch_cost(dists, lambda n: 10 + n**2) == pytest.approx(want)


def test_target_only_is_one_decode_step() -> None:
    p = predict(["t"], 0, [RowGroup(4, [])], latency, overhead, cycle_overhead_ns=0.5e6)
    assert p.emitted == 1.0
    assert p.cost_ns == pytest.approx(latency("t", 4, 1) + overhead("t", 1) + 0.5e6)
    assert p.t_eff_ns == p.cost_ns


def test_a_target_only_block_is_one_call_of_several_decode_steps() -> None:
    p = predict(["t"], 0, [RowGroup(4, [])], latency, overhead, cycle_overhead_ns=0.5e6, target_block=4)
    assert p.emitted == 4.0 and p.emitted_dist == (0.0, 0.0, 0.0, 0.0, 1.0)
    assert p.cost_ns == pytest.approx(4 * latency("t", 4, 1) + overhead("t", 4) + 0.5e6)
    assert p.t_eff_ns == pytest.approx(p.cost_ns / 4)


def _simulate(chain, window, groups, cycles: int, rng: random.Random) -> tuple[list[float], list[float]]:
    """Runs the cycle as the router does, with Bernoulli acceptance per position: (costs, mean emitted)."""
    batch = sum(g.rows for g in groups)
    row_rates = [g.acceptance for g in groups for _ in range(g.rows)]
    last_emitted = [1] * batch   # the first cycle's pending: one token (discarded below)
    costs, emitted = [], []
    for _ in range(cycles + 1):
        pending = [1 + max(0, n - window) for n in last_emitted]
        cost = latency(chain[0], batch, max(pending)) + (window - 1) * latency(chain[0], batch, 1)
        cost += overhead(chain[0], window)
        lengths = [window] * batch
        for level, model in enumerate(chain[1:]):
            cost += latency(model, batch, 1 + max(lengths)) + overhead(model, 1)
            new = []
            for rates, length in zip(row_rates, lengths):
                accepted = 0
                while accepted < length and rng.random() < rates[level][accepted]:
                    accepted += 1
                new.append(accepted + 1)
            lengths = new
        costs.append(cost)
        emitted.append(sum(lengths) / batch)
        last_emitted = lengths
    return costs[1:], emitted[1:]


@pytest.mark.parametrize("chain,window,groups", [
    (("a", "t"), 4, [RowGroup(1, [[0.9, 0.8, 0.7, 0.6]])]),
    (("a", "b", "t"), 3, [RowGroup(3, [[0.8] * 3, [0.9, 0.85, 0.8, 0.75]]),
                          RowGroup(2, [[0.5] * 3, [0.6] * 4])]),
    (("b", "t"), 8, [RowGroup(16, [[0.95] * 8])]),
])
def test_prediction_matches_simulation(chain, window, groups) -> None:
    """Simulated means within 4.5 standard errors of the prediction: a false alarm rate of about 7e-6 per
    comparison, two comparisons per case."""
    rng = random.Random(1234)
    p = predict(chain, window, groups, latency, overhead)
    costs, emitted = _simulate(chain, window, groups, 20_000, rng)
    for values, want in ((costs, p.cost_ns), (emitted, p.emitted)):
        mean = sum(values) / len(values)
        sd = math.sqrt(sum((v - mean) ** 2 for v in values) / (len(values) - 1))
        assert abs(mean - want) <= 4.5 * sd / math.sqrt(len(values)) + 1e-9 * want, (mean, want)


@pytest.mark.parametrize("seed", range(40))
def test_every_window_at_once_predicts_what_one_window_at_a_time_does(seed) -> None:
    """A plan predicts each chain at all its windows in one pass (predict_windows): every field of every
    prediction equals predict's for that window, to rounding, for chains of two to four levels (the lookup
    at the bottom), windows up to 15, row groups of different sizes and rates shorter or longer than the
    proposals, with and without the drafter's later passes scaled, with the passes' costs read one by one
    or as a table's arrays. Predicted again, with the acceptance matrices kept from the first time, every
    prediction is the same."""
    rng = random.Random(seed)
    costs = {**COSTS, "lookup": (0.0, 0.0)}

    class Lat:
        def __call__(self, model: str, batch: int, tokens: int) -> float:
            fixed, per_token = costs[model]
            return fixed + per_token * batch * tokens + 1e4 * tokens * tokens

        def costs(self, model: str, batch: int, longest: int) -> np.ndarray:
            return np.array([self(model, batch, k) for k in range(1, longest + 1)])

    lat = Lat() if seed % 2 else Lat().__call__

    chain = rng.choice([("a", "t"), ("b", "t"), ("a", "b", "t"), ("lookup", "t"), ("lookup", "a", "t"),
                        ("lookup", "a", "b", "t")])
    windows = sorted(rng.sample(range(1, 16), rng.randint(1, 10)))
    groups = [RowGroup(rng.randint(1 if i == 0 else 0, 5),
                       [[rng.random() for _ in range(rng.randint(1, 20))] for _ in chain[1:]])
              for i in range(rng.choice([1, 1, 2, 3, 5]))]
    scale = rng.choice([None, lambda model, window: 0.5 + 0.01 * window])
    cycle_overhead = rng.random() * 1e6
    together = predict_windows(chain, windows, groups, lat, overhead, cycle_overhead, 4, scale)
    assert [p.window for p in together] == windows
    for p in together:
        alone = predict(chain, p.window, groups, lat, overhead, cycle_overhead, 4, scale)
        assert (p.chain, p.batch_size, len(p.emitted_dist), len(p.checks)) == \
               (alone.chain, alone.batch_size, len(alone.emitted_dist), len(alone.checks))
        for x, y in [(p.cost_ns, alone.cost_ns), (p.emitted, alone.emitted), (p.emitted_var, alone.emitted_var),
                     *zip(p.level_ns, alone.level_ns), *zip(p.emitted_dist, alone.emitted_dist),
                     *zip(itertools.chain(*p.checks), itertools.chain(*alone.checks))]:
            assert x == pytest.approx(y, rel=1e-9, abs=1e-12)
    assert predict_windows(chain, windows, groups, lat, overhead, cycle_overhead, 4, scale) == together


def test_prediction_fails_when_the_cycle_differs() -> None:
    """The simulation test has power: a model that forgets the batch padding is off by many errors."""
    groups = [RowGroup(16, [[0.6] * 4])]
    p = predict(("a", "t"), 4, groups, latency, overhead)
    unpadded = predict(("a", "t"), 4, [RowGroup(1, [[0.6] * 4])], lambda m, b, k: latency(m, 16, k), overhead)
    costs, _ = _simulate(("a", "t"), 4, groups, 5_000, random.Random(5))
    mean = sum(costs) / len(costs)
    sd = math.sqrt(sum((v - mean) ** 2 for v in costs) / (len(costs) - 1)) / math.sqrt(len(costs))
    assert abs(mean - p.cost_ns) < 4.5 * sd
    assert abs(mean - unpadded.cost_ns) > 20 * sd


@pytest.mark.parametrize("chain,window,groups", [
    (("a", "t"), 6, [RowGroup(1, [[0.9, 0.8, 0.7, 0.6, 0.6, 0.6]])]),
    (("a", "b", "t"), 3, [RowGroup(1, [[0.8] * 3, [0.9, 0.85, 0.8, 0.75]])]),
])
def test_emitted_variance_matches_simulation(chain, window, groups) -> None:
    """The sample variance of one row's tokens per cycle within 4.5 standard errors of the predicted one
    (the error of a variance: sqrt((m4 - s^4) / n)): a false alarm rate of about 7e-6 per case."""
    p = predict(chain, window, groups, latency, overhead)
    _, emitted = _simulate(chain, window, groups, 40_000, random.Random(99))
    mean = sum(emitted) / len(emitted)
    var = sum((e - mean) ** 2 for e in emitted) / (len(emitted) - 1)
    m4 = sum((e - mean) ** 4 for e in emitted) / len(emitted)
    assert abs(var - p.emitted_var) <= 4.5 * math.sqrt((m4 - var**2) / len(emitted)), (var, p.emitted_var)


def test_max_normal_moments_match_the_tables() -> None:
    """Tippett's tables of the mean of the largest of n standard normals."""
    for n, want in ((1, 0.0), (2, 0.5642), (3, 0.8463), (4, 1.0294), (10, 1.5388), (16, 1.7660)):
        assert max_normal_moments(n)[0] == pytest.approx(want, abs=2e-4)


def _wave_seconds(dist: list[float], rows: int, tokens: int | list[int], fixed: float, per_row: float,
                  rng: random.Random) -> float:
    """One closed wave: every row must emit `tokens` (its own, given a list), drawing its tokens per cycle
    from `dist`; a cycle costs `fixed` + `per_row` times the rows still running."""
    left = list(tokens) if isinstance(tokens, list) else [tokens] * rows
    total = 0.0
    values = range(len(dist))
    while any(n > 0 for n in left):
        running = [i for i, n in enumerate(left) if n > 0]
        total += fixed + per_row * len(running)
        for i, n in zip(running, rng.choices(values, dist, k=len(running))):
            left[i] -= n
    return total


@pytest.mark.parametrize("window,rows", [(2, 4), (8, 4), (2, 16), (8, 16), (4, 1)])
def test_tail_factor_predicts_a_closed_waves_time(window, rows) -> None:
    """A wave of rows that must each emit 48 tokens, cycles costing 8 + 1 per running row: its mean time
    per token of a row is T_eff times tail_factor within 3% (the normal approximation of the rows'
    finishing is what is left; 3,000 waves give a standard error near 0.2%). Plain T_eff is further off
    for long windows at large batches, so the test would catch a factor that ignored the spread."""
    rates = [0.8] * window
    p = predict(("a", "t"), window, [RowGroup(rows, [rates])], latency, overhead)
    dist, _ = accepted_distribution([0.0] * window + [1.0], rates)
    fixed, per_row, tokens = 8.0, 1.0, 48
    cost = fixed + per_row * rows
    shaped = Prediction(p.chain, window, rows, cost, p.emitted, p.level_ns, p.checks, p.emitted_var)
    rng = random.Random(window * 100 + rows)
    measured = sum(_wave_seconds(dist, rows, tokens, fixed, per_row, rng) for _ in range(3000)) / 3000 / tokens
    predicted = shaped.t_eff_ns * tail_factor(shaped, fixed + per_row, tokens)
    assert measured == pytest.approx(predicted, rel=0.03)
    if window == 8 and rows == 16:
        assert measured > 1.15 * shaped.t_eff_ns


@pytest.mark.parametrize("window", [2, 8])
def test_tail_factor_waits_for_the_row_furthest_behind(window) -> None:
    """Rows of a wave that accepted differently have different amounts left, and the wave lasts until
    the one furthest behind is done: given each row's tokens left, the time per token is T_eff times
    tail_factor within 3% (3,000 waves); the factor of their mean misses it by more than 10%."""
    rates, rows, left = [0.8] * window, 8, [40, 36, 12, 10, 8, 6, 6, 4]
    p = predict(("a", "t"), window, [RowGroup(rows, [rates])], latency, overhead)
    dist, _ = accepted_distribution([0.0] * window + [1.0], rates)
    fixed, per_row = 8.0, 1.0
    shaped = Prediction(p.chain, window, rows, fixed + per_row * rows, p.emitted, p.level_ns, p.checks, p.emitted_var)
    rng = random.Random(window)
    measured = sum(_wave_seconds(dist, rows, left, fixed, per_row, rng) for _ in range(3000)) / 3000 / (sum(left) / rows)
    assert measured == pytest.approx(shaped.t_eff_ns * tail_factor(shaped, fixed + per_row, left), rel=0.03)
    assert measured > 1.1 * shaped.t_eff_ns * tail_factor(shaped, fixed + per_row, sum(left) / rows)


def _finish_candidates(rate: float) -> list[Prediction]:
    rows = [RowGroup(1, [[rate] * 8])]
    return [predict(("t",), 0, rows, latency, overhead)] + [predict(("a", "t"), w, rows, latency, overhead)
                                                            for w in range(1, 9)]


def _finish_by_policy(candidates, left: int, choose, rng: random.Random) -> float:
    """One row's cost to emit `left` tokens, each cycle's candidate picked by `choose(tokens left)`, its
    emitted tokens drawn from its own distribution (those past the end dropped)."""
    total = 0.0
    while left > 0:
        p = choose(left)
        total += p.cost_ns
        left -= rng.choices(range(len(p.emitted_dist)), p.emitted_dist)[0]
    return total


@pytest.mark.parametrize("rate", [0.45, 0.7, 0.9])
def test_best_finish_is_the_cost_of_its_own_policy_and_no_fitting_static_beats_it(rate) -> None:
    """V(r) of best_finish against a simulation of the policy it implies (each cycle the candidate of least
    cost + E V(r - X) among those that fit), 4,000 finishes of 20 tokens (standard error under 0.5%);
    a static window shrunk to fit the tokens left, and the target alone, cost at least as much (by their
    own simulation, 4,000 finishes each); the argmin of finish_regret is the policy's candidate and its
    regret 0."""
    candidates = _finish_candidates(rate)
    costs = [p.cost_ns for p in candidates]
    best = best_finish(candidates, costs, 32)
    g = min(p.t_eff_ns for p in candidates)

    def policy(left: int) -> Prediction:
        fitting = [p for p in candidates if len(p.chain) == 1 or p.window < left]
        return min(fitting, key=lambda p: finish_regret(p, p.cost_ns, best, g, left))

    for left in (1, 3, 8, 20):
        chosen = policy(left)
        assert finish_regret(chosen, chosen.cost_ns, best, g, left) == pytest.approx(0.0, abs=1e-6)
    rng = random.Random(int(rate * 100))
    runs = 4000
    measured = sum(_finish_by_policy(candidates, 20, policy, rng) for _ in range(runs)) / runs
    assert measured == pytest.approx(best[20], rel=0.015)
    for w in (2, 4, 8):
        static = sum(_finish_by_policy(candidates, 20, lambda left: candidates[min(w, left - 1)], rng)
                     for _ in range(runs)) / runs
        assert static > best[20] * 0.985
    assert best[20] <= 20 * candidates[0].cost_ns + 1e-6


def test_best_finish_and_its_excess_are_their_recurrences() -> None:
    """best_finish and finish_excess (vectorised) against the recurrences written out term by term."""
    candidates = _finish_candidates(0.7)
    costs = [p.cost_ns * (1 + 0.1 * i) for i, p in enumerate(candidates)]
    horizon, rate, reach = 12, 3.0e6, 30
    best = best_finish(candidates, costs, horizon)
    want = [0.0]
    for r in range(1, horizon + 1):
        values = [(c + sum(q * want[r - n] for n, q in enumerate(p.emitted_dist) if 0 < n < r), p)
                  for p, c in zip(candidates, costs)]
        want.append(min(v for v, p in values if len(p.chain) == 1 or p.window < r))
    assert best == pytest.approx(want, rel=1e-12)

    def value(k: int) -> float:
        return want[k] if k <= horizon else want[horizon] + (k - horizon) * rate
    table = finish_excess(candidates, best, rate, reach)
    for c, p in enumerate(candidates):
        for r in range(1, reach + 1):
            after = sum(q * value(r - n) for n, q in enumerate(p.emitted_dist) if 0 < n < r)
            assert table[c, r] == pytest.approx(after - value(r), rel=1e-9, abs=1e-3)


def test_finish_regret_far_from_the_end_is_the_excess_over_the_best_t_eff() -> None:
    """Beyond the horizon every token costs the best T_eff g, so one cycle of a candidate costs
    cost - g E[X] more than the best finish: its regret per token emitted is T_eff - g. Near the end a
    long window pays for the tokens it drafts past it (window 8 with 3 left)."""
    candidates = _finish_candidates(0.8)
    costs = [p.cost_ns for p in candidates]
    best = best_finish(candidates, costs, 16)
    g = min(p.t_eff_ns for p in candidates)
    for p in candidates:
        assert finish_regret(p, p.cost_ns, best, g, 200) == pytest.approx(p.cost_ns - g * p.emitted, abs=1e-3)
        assert finish_regret(p, p.cost_ns, best, g, 200) >= -1e-6
    w8 = candidates[8]
    assert finish_regret(w8, w8.cost_ns, best, g, 3) > 3 * finish_regret(w8, w8.cost_ns, best, g, 200)


def test_expected_max_combines_unlike_normals() -> None:
    """Clark's moment matching against a simulation of the max (standard error about 0.005 here), and the
    exact moments for rows alike."""
    groups = [(20.0, 2.0, 3), (18.0, 2.0, 5), (10.0, 1.0, 8), (19.5, 0.5, 1)]
    rng = random.Random(3)
    draws = [max(rng.gauss(m, sd) for m, sd, n in groups for _ in range(n)) for _ in range(40_000)]
    assert expected_max(groups) == pytest.approx(sum(draws) / len(draws), abs=0.05)
    assert expected_max([(5.0, 2.0, 16)]) == pytest.approx(5.0 + 2.0 * 1.7660, abs=1e-3)
    assert expected_max([(5.0, 2.0, 1), (-100.0, 1.0, 4)]) == 5.0


def test_latency_table_fits_a_line_per_batch_size() -> None:
    line = {(1, k): (10.0 + 2.0 * k, 8.0) for k in (1, 2, 4)}
    table = LatencyTable({"m": {**line, (4, 1): (14.0, 1.0), (4, 4): (30.0, 1.0)}})
    assert table("m", 1, 3) == pytest.approx(16.0)            # between measured windows, on the line
    assert table("m", 1, 9) == pytest.approx(28.0)            # beyond them, on the line
    assert table("m", 2, 1) == pytest.approx(12.0 + 2.0 / 3)  # a batch size between 1 and 4
    assert table("m", 32, 4) >= 30.0                          # never cheaper than the largest measured
    with pytest.raises(KeyError, match="no latency measured"):
        table("other", 1, 1)


def test_latency_table_costs_are_its_passes_as_a_read_only_array() -> None:
    table = LatencyTable({"m": {(1, 1): (5.0, 1.0), (1, 4): (11.0, 1.0), (4, 2): (20.0, 1.0), (4, 8): (50.0, 1.0)}})
    for batch in (1, 3, 4, 16):
        costs = table.costs("m", batch, 12)
        assert costs.tolist() == [table("m", batch, k) for k in range(1, 13)]
        assert table.costs("m", batch, 12) is costs and not costs.flags.writeable


def test_latency_table_trusts_points_by_their_passes() -> None:
    """A stale warm-up point (1 pass) moves a line measured live (32 passes per point) a fraction of the way
    it moves a line of points that weigh the same."""
    live = {(1, k): (10.0 + k, 32.0) for k in (2, 3, 4)}
    table = LatencyTable({"m": {**live, (1, 6): (40.0, 1.0)}})
    equal = LatencyTable({"m": {**{key: (ns, 1.0) for key, (ns, _) in live.items()}, (1, 6): (40.0, 1.0)}})
    assert 15.0 < table("m", 1, 5) < 15.0 + (equal("m", 1, 5) - 15.0) / 3   # the live line says 15
    single = LatencyTable({"m": {(1, 3): (7.0, 1.0)}})
    assert single("m", 1, 1) == single("m", 1, 9) == 7.0       # one point: flat in k


def test_latency_table_keeps_a_well_measured_point_off_the_line() -> None:
    """A single-token pass much cheaper than the line through longer ones (as on a CPU) stays cheap."""
    points = {(1, 1): (29.0, 32.0), **{(1, k): (46.0 + 2.5 * (k - 2), 32.0) for k in range(2, 8)}}
    table = LatencyTable({"m": points})
    assert table("m", 1, 1) == pytest.approx(29.0, abs=1.0)
    assert table("m", 1, 4) == pytest.approx(51.0, abs=1.0)
    # a point off the line is pulled towards it by 8 passes: a ninth of the way for a warm-up point
    warm = LatencyTable({"m": {**{key: (ns, 1.0) for key, (ns, _) in points.items()}, (1, 4): (60.0, 1.0)}})
    a, slope = warm.line("m", 1)
    assert warm("m", 1, 4) == pytest.approx((60.0 + 8 * (a + 4 * slope)) / 9)
    assert warm("m", 1, 1) == 29.0     # the single-token regime is taken as measured


def test_latency_table_never_makes_more_tokens_cheaper() -> None:
    """Points measured at batch 16 (the target of the demo pool, ms: EMAs over mixed prompts) that fall
    with k are pooled: the table is nondecreasing in k, a pooled pair sits at the weighted mean of its
    shrunk values, and monotone points are left as they were."""
    measured = {1: 86.7, 3: 93.7, 4: 81.2, 5: 85.1, 6: 98.9, 7: 92.2, 8: 98.8, 9: 107.3, 10: 115.6}
    table = LatencyTable({"m": {(16, k): (ms, 32.0) for k, ms in measured.items()}})
    values = [table("m", 16, k) for k in range(1, 17)]
    assert all(a <= b + 1e-9 for a, b in zip(values, values[1:])), values
    line = table.line("m", 16)
    shrunk = {k: (32 * measured[k] + 8 * (line[0] + line[1] * k)) / 40 for k in (6, 7)}
    assert table("m", 16, 6) == table("m", 16, 7) == pytest.approx((shrunk[6] + shrunk[7]) / 2)
    assert table("m", 16, 1) == 86.7                       # below every longer pass: as measured
    rising = {(1, k): (10.0 + 2.0 * k + (0.5 if k % 2 else 0.0), 32.0) for k in range(1, 9)}
    plain = LatencyTable({"m": rising})
    line = plain.line("m", 1)
    for k in range(2, 9):
        assert plain("m", 1, k) == pytest.approx((32 * rising[(1, k)][0] + 8 * (line[0] + line[1] * k)) / 40)


def test_warm_up_points_are_scaled_to_what_live_passes_cost() -> None:
    from specrouter.router.measurements import snapshot_from_pb
    from specrouter.router.scheduling.latency import latency_table, warmup_scales
    from specrouter.v1 import profiler_pb2 as ppb

    warm = {"m": [(1, 1, 2_000), (1, 4, 3_000), (16, 1, 10_000)], "idle": [(1, 1, 5_000)]}
    snapshot = ppb.SnapshotResponse()
    # live, the model runs 2x (at batch 1, 1 token, 30 passes) and 1.5x (4 tokens, 10 passes) its warm-up
    snapshot.forward.add(model="m", batch_size_bucket=1, tokens_per_row_bucket=1, ema_forward_ns=4_000, samples=30)
    snapshot.forward.add(model="m", batch_size_bucket=1, tokens_per_row_bucket=4, ema_forward_ns=4_500, samples=10)
    scale = math.exp((30 * math.log(2.0) + 10 * math.log(1.5)) / 40)
    assert warmup_scales({"m": {(1, 1): 2_000.0, (1, 4): 3_000.0, (16, 1): 10_000.0}},
                         {"m": {(1, 1): (4_000.0, 30.0), (1, 4): (4_500.0, 10.0)}})["m"](16) == pytest.approx(scale)
    table = latency_table(snapshot_from_pb(snapshot), warm)
    assert table("m", 16, 1) == pytest.approx(10_000 * scale)   # known only from warm-up: scaled
    assert table("m", 1, 1) == pytest.approx(4_000)             # measured live: as measured
    assert table("idle", 1, 1) == pytest.approx(5_000 * scale)  # never run live: as the others run
    assert latency_table(None, warm)("m", 16, 1) == pytest.approx(10_000)


def test_warm_up_scales_follow_the_batch_size() -> None:
    """Live passes slow down more at large batches: a model measured only at batch 1 takes, at batch 16,
    its own slowdown plus how much more the others slow down at 16 than overall."""
    from specrouter.router.scheduling.latency import warmup_scales

    warm = {m: {(1, 1): 1_000.0, (16, 1): 4_000.0} for m in ("a", "b", "new")}
    live = {"a": {(1, 1): (1_500.0, 8.0), (16, 1): (12_000.0, 8.0)},   # 1.5x at batch 1, 3x at 16
            "b": {(1, 1): (2_000.0, 8.0)}}                             # 2x at batch 1, never at 16
    scales = warmup_scales(warm, live)
    overall_a = math.sqrt(1.5 * 3.0)
    assert scales["a"](1) == pytest.approx(1.5) and scales["a"](16) == pytest.approx(3.0)
    assert scales["b"](1) == pytest.approx(2.0)
    assert scales["b"](16) == pytest.approx(2.0 * 3.0 / overall_a)
    assert scales["new"](16) == pytest.approx(3.0)      # the others' figure where they have one
    assert scales["new"](4) == pytest.approx(math.sqrt(overall_a * 2.0))   # else over every batch size
    assert warmup_scales(warm, {})["a"](16) == 1.0




def test_a_lone_rows_later_draft_passes_cost_their_measured_scale() -> None:
    groups = [RowGroup(1, [[0.7] * 8])]
    plain = predict(["a", "t"], 5, groups, latency, overhead)
    scaled = predict(["a", "t"], 5, groups, latency, overhead, draft_scale=lambda drafter, window: 0.4)
    assert plain.level_ns[0] - scaled.level_ns[0] == pytest.approx(0.6 * 4 * latency("a", 1, 1))
    assert scaled.level_ns[1:] == plain.level_ns[1:] and scaled.emitted == plain.emitted
    two = [RowGroup(2, [[0.7] * 8])]   # several rows draft one pass a token: no scale
    assert predict(["a", "t"], 5, two, latency, overhead, draft_scale=lambda d, w: 0.4) == predict(
        ["a", "t"], 5, two, latency, overhead)
