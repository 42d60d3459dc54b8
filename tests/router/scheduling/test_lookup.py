"""The lookup level as the scheduler sees it: its measurements (its proposals that stop short, and the checks
it gets in cycles it does not run in), its prompt guesses, its price, and the choice of `auto` between its
chains and the models'."""

from __future__ import annotations

import math
import random

import pytest

from specrouter.contract.measures import Mode
from specrouter.router.chain import ChainBatch
from specrouter.router.cycle_report import CycleReport
from specrouter.router.row import Row
from specrouter.router.lookup import (LOOKUP, NO_GUESS, SHADOW_WINDOW, LookupProposer, RowNgrams, by_match,
                                     judged, level_of, longest_match, prompt_guesses)
from specrouter.router.measurements import acceptance_counts
from specrouter.router.scheduling.candidates import candidate_chains
from specrouter.router.scheduling.plans import PLANS_KEPT
from specrouter.router.scheduling.scheduler import MATCH_GRAIN, Scheduler, coarse_matches
from specrouter.router.scheduling.settings import SchedulerSettings
from specrouter.contract.calls import SamplingParams, StepResult
from tests.router.scheduling.fakes import DECODE_MS, GREEDY, Clock, FakeBatch, snapshot, snapshot_pb
from specrouter.router.measurements import snapshot_from_pb

CONTEXT = 256


def test_candidates_put_each_model_free_level_in_front_of_the_chains_with_room() -> None:
    chains = candidate_chains(["a", "b", "t"], "t", max_levels=3, levels=[LOOKUP])
    assert chains == [("t",), ("a", "t"), ("b", "t"), ("a", "b", "t"),
                      (LOOKUP, "t"), (LOOKUP, "a", "t"), (LOOKUP, "b", "t")]


def test_prompt_guesses_are_the_lookups_first_proposal_after_each_prefix() -> None:
    rng = random.Random(3)
    for _ in range(200):
        tokens = [rng.randrange(5) for _ in range(rng.randrange(0, 30))]
        positions = rng.randrange(0, 35)
        expected = []
        for end in range(len(tokens) - min(positions, len(tokens)), len(tokens)):
            proposal, _ = longest_match(tokens[:end + 1], 1)
            expected.append(proposal[0] if proposal else NO_GUESS)
        assert prompt_guesses(tokens, positions) == expected, (tokens, positions)


def test_a_proposal_is_judged_up_to_its_first_difference_and_where_it_stops() -> None:
    assert judged([1, 2, 3], [1, 2, 9, 4], 8) == (2, 3)
    assert judged([1, 2, 3], [1, 2, 3, 4], 8) == (3, 4)      # stopped short: the next position is a rejection
    assert judged([1, 2, 3, 4], [1, 2], 8) == (2, 2)          # only two positions judged, both accepted
    assert judged([], [5, 6], 8) == (0, 1)                    # no proposal: position 0 rejected
    assert judged([1, 2, 3], [1, 2, 3, 4], 2) == (2, 2)       # within the window


def test_a_short_proposal_counts_its_missing_positions_as_one_rejection() -> None:
    rows = [Row(str(i), [1, 2, 3], 3, SamplingParams(), 8) for i in range(3)]
    # window 4: row 0 proposed 2 tokens, both accepted; row 1 nothing; row 2 four tokens, one accepted
    report = CycleReport((LOOKUP, "t"), 4, emitted={}, accepted={"t": [2, 0, 1]}, proposed={"t": [2, 0, 4]},
                         results={}, model_free=True)
    counts = acceptance_counts(report, rows)
    assert dict(counts) == {(LOOKUP, "t", Mode.GREEDY, 0): [2, 3], (LOOKUP, "t", Mode.GREEDY, 1): [1, 2],
                            (LOOKUP, "t", Mode.GREEDY, 2): [0, 1]}
    # a model's proposal is the window's whole: the same figures, read as a model's, stop at what it proposed
    as_model = CycleReport(("a", "t"), 4, emitted={}, accepted={"t": [2, 0, 1]}, proposed={"t": [2, 0, 4]},
                           results={})
    assert dict(acceptance_counts(as_model, rows)) == {("a", "t", Mode.GREEDY, 0): [2, 2],
                                                       ("a", "t", Mode.GREEDY, 1): [1, 2]}


def _row(tokens, sampling=None) -> Row:
    return Row("r", list(tokens), len(tokens), sampling or SamplingParams(), 40)


@pytest.mark.parametrize("drafter_chain", [("s", "t"), ("m", "s", "t"), ("t",)])
def test_the_shadow_check_is_what_the_lookup_chain_would_have_accepted(tiny_pool, drafter_chain) -> None:
    """A cycle of another chain judges the lookup's proposal by the target's emitted tokens: the accepted count
    equals that of a real lookup -> target cycle from the same state, up to the tokens the cycle emitted."""
    rng = random.Random(11)
    checked_any = accepted_any = 0
    for trial in range(12):
        period = [rng.randrange(1, 40) for _ in range(rng.randrange(2, 6))]
        prompt = (period * 12)[: rng.randrange(12, 40)]   # repetitive: the lookup finds matches
        runs = {}
        for chain in (drafter_chain, (LOOKUP, "t")):
            batch = ChainBatch({**tiny_pool, LOOKUP: LookupProposer(recent_tokens=0)}, "t", CONTEXT)
            batch.add([_row(prompt)])
            try:
                runs[chain] = batch.step(chain, 8 if chain[0] == LOOKUP else 3)
            finally:
                batch.release()
        mine, real = runs[drafter_chain], runs[(LOOKUP, "t")]
        emitted = mine.emitted["r"]
        accepted, checked = mine.shadow[(LOOKUP, "t")][0]
        assert accepted == min(real.accepted["t"][0], len(emitted)), (prompt, emitted)
        assert checked == min(accepted + 1, len(emitted), SHADOW_WINDOW)
        assert set(mine.shadow) == {(LOOKUP, "t"), (LOOKUP, drafter_chain[0])}   # and the drafter's draft judges
        assert LOOKUP not in real.shadow and not real.shadow   # the lookup's own chain is measured as it runs
        checked_any += checked
        accepted_any += accepted
    assert accepted_any > 0 and checked_any > accepted_any   # both outcomes seen


def test_sampled_rows_get_no_shadow_check(tiny_pool) -> None:
    batch = ChainBatch({**tiny_pool, LOOKUP: LookupProposer(recent_tokens=0)}, "t", CONTEXT)
    sampled = Row("x", [3, 4, 3, 4, 3, 4, 3], 7, SamplingParams(temperature=1.0, seed=5), 20)
    batch.add([_row([3, 4, 3, 4, 3, 4, 3]), sampled])
    try:
        report = batch.step(("s", "t"), 2)
    finally:
        batch.release()
    greedy_check, sampled_check = report.shadow[(LOOKUP, "t")]
    assert greedy_check is not None and sampled_check is None
    counts = acceptance_counts(report, [batch_row for batch_row in (_row([0]), sampled)])
    assert not any(key[2] is Mode.SAMPLING and key[0] == LOOKUP for key in counts)


def _scheduler(acceptance, clock: Clock | None = None, **settings) -> Scheduler:
    return Scheduler(list(DECODE_MS), "t", SchedulerSettings(**settings), lambda: snapshot(acceptance),
                     clock=clock or Clock(), levels=[LOOKUP])


def test_the_lookup_costs_no_pass_and_its_measured_call() -> None:
    clock = Clock()
    sched = _scheduler({("a", "t"): 0.7, (LOOKUP, "t"): 0.7}, clock)
    plan = sched.planner.make(1, 0)
    lookup_chain = plan.by_key[((LOOKUP, "t"), 4)]
    assert lookup_chain.level_ns[0] == 0.0                  # no forward pass, no call measured yet
    row = Row("0", [1, 2, 3], 3, SamplingParams(), 64)
    row.seen = {m: 2 for m in (*DECODE_MS, LOOKUP)}
    for _ in range(200):   # the router measured its calls at 0.3 ms each
        report = CycleReport((LOOKUP, "t"), 4, emitted={"0": [5]}, accepted={"t": [0]}, proposed={"t": [4]},
                             results={LOOKUP: StepResult(tokens=[[7] * 4], rows=[None])},
                             call_ns={LOOKUP: 300_000}, model_free=True)
        sched.observe(report, [row], 20_000_000, True)
    clock.now += sched.settings.recompute_s   # a round later: the overheads measured since enter the plans
    priced = sched.planner.make(1, 0).by_key[((LOOKUP, "t"), 4)]
    assert priced.level_ns[0] == pytest.approx(300_000, rel=0.01)
    assert priced.level_ns[1:] == lookup_chain.level_ns[1:]


@pytest.mark.parametrize("lookup_rate, picks_lookup", [(0.95, True), (0.1, False)])
def test_auto_runs_the_lookup_where_its_measured_acceptance_pays(lookup_rate, picks_lookup) -> None:
    # two levels: in front of a model that verifies, even a lookup that is always wrong leaves that model one
    # token a pass of its own (a window-1 draft), so only (lookup, target) tells paying from not paying
    sched = _scheduler({("a", "t"): 0.7, ("b", "t"): 0.75, (LOOKUP, "t"): lookup_rate}, explore_after_s=1e9,
                       max_levels=2)
    chain, window = sched.choose(FakeBatch(1))
    assert (chain == (LOOKUP, "t")) == picks_lookup, (chain, window)
    if picks_lookup:   # near-certain proposals that cost nothing: a window only the lookup's chains have
        assert window > max(sched.settings.windows)


def test_a_lookup_pair_never_measured_takes_its_own_prior_and_stays_out_of_the_calibration() -> None:
    sched = _scheduler({("a", "t"): 0.9}, lookup_prior=0.2)
    estimates = sched.planner.make(1, 0).estimates
    assert estimates.rates((LOOKUP, "t", Mode.GREEDY), 3)[:3] == pytest.approx([0.2] * 3)
    assert estimates.prior(("b", "t", Mode.GREEDY)) != pytest.approx(0.2)
    # measured, the lookup's rates follow what was measured, and the calibration of the models ignores them
    measured = snapshot_pb({("a", "t"): 0.9, (LOOKUP, "t"): 0.05})
    measured.similarity.add(drafter=LOOKUP, verifier="t", mode=GREEDY, ema_similarity=0.99, samples=100)
    alone = snapshot_pb({("a", "t"): 0.9})
    with_lookup = Scheduler(list(DECODE_MS), "t", SchedulerSettings(), lambda: snapshot_from_pb(measured),
                            clock=Clock(), levels=[LOOKUP]).planner.make(1, 0).estimates
    without = Scheduler(list(DECODE_MS), "t", SchedulerSettings(), lambda: snapshot_from_pb(alone),
                        clock=Clock(), levels=[LOOKUP]).planner.make(1, 0).estimates
    assert with_lookup.rates((LOOKUP, "t", Mode.GREEDY), 1)[0] < 0.1
    assert with_lookup.calibration[Mode.GREEDY] == without.calibration[Mode.GREEDY]


def test_a_batch_bounds_the_models_windows_but_not_the_lookups() -> None:
    """`batch_max_window` holds a batch's drafters to short windows (the batch waits while a drafter drafts);
    the lookup drafts for nothing, so its chain may take the longest window the cost model prices best."""
    models_only = _scheduler({("a", "t"): 0.98, ("b", "t"): 0.98, (LOOKUP, "t"): 0.01}, explore_after_s=1e9,
                             max_levels=2, batch_max_window=3)
    chain, window = models_only.choose(FakeBatch(4))
    assert chain[0] != LOOKUP and window <= 3, (chain, window)
    with_lookup = _scheduler({("a", "t"): 0.5, ("b", "t"): 0.5, (LOOKUP, "t"): 0.98}, explore_after_s=1e9,
                             max_levels=2, batch_max_window=3)
    chain, window = with_lookup.choose(FakeBatch(4))
    assert chain == (LOOKUP, "t") and window > 3, (chain, window)


def test_the_lookups_chains_are_planned_at_longer_windows_too() -> None:
    """`lookup_windows` for the chains that start with the lookup, as far as every level's hand-up stays
    within the longest proposal a worker takes; a lookup that nearly always copies right takes the longest."""
    sched = _scheduler({("a", "t"): 0.7, ("b", "t"): 0.7, ("a", "b"): 0.7, ("b", "a"): 0.7, (LOOKUP, "t"): 0.98,
                        (LOOKUP, "a"): 0.5, (LOOKUP, "b"): 0.5}, explore_after_s=1e9, max_levels=4)
    plan = sched.planner.make(1, 0)
    windows = {}
    for chain, window in plan.by_key:
        windows.setdefault(chain, set()).add(window)
    assert windows[(LOOKUP, "t")] == windows[(LOOKUP, "a", "t")] == {*range(1, 9), 12, 15}
    assert windows[(LOOKUP, "a", "b", "t")] == {*range(1, 9), 12}   # 15 + 2 tokens would reach "t"
    assert windows[("a", "t")] == set(range(1, 9)) and windows[("t",)] == {0}
    row = FakeBatch(1)
    for r in row.rows.values():
        r.max_new_tokens = 200
    assert sched.choose(row) == ((LOOKUP, "t"), 15)


# -- the lookup's acceptance per match length ----------------------------------------------------------------


def test_the_lookup_reports_the_length_of_the_match_it_copies_from() -> None:
    lookup = LookupProposer(recent_tokens=0)
    assert lookup.match([5, 6, 7, 8, 5, 6, 7], 4) == ([8, 5, 6, 7], 3)
    assert lookup.match([1, 5, 9, 5], 4) == ([9, 5], 1)
    assert lookup.match([1, 2, 3], 4) == ([], 0)
    assert level_of(by_match(LOOKUP, 2)) == LOOKUP and level_of("t") == "t"
    row = _row([4, 4, 4])
    assert lookup.row_match(row) == ([4], 2)
    row.tokens.extend([7, 4, 4])                # the memo follows the row's tokens
    assert lookup.row_match(row) == ([7, 4, 4], 2)


def test_the_lookups_checks_are_filed_under_the_match_length_too() -> None:
    rows = [Row(str(i), [1, 2, 3], 3, SamplingParams(), 8) for i in range(2)]
    ran = CycleReport((LOOKUP, "a", "t"), 4, emitted={}, accepted={"a": [2, 0], "t": [3, 1]},
                      proposed={"a": [4, 0], "t": [3, 1]}, results={}, model_free=True, matches=[3, 0])
    counts = acceptance_counts(ran, rows)
    # (lookup, a) under its name and under the match length of each row; (a, t) under its name alone
    assert counts[(by_match(LOOKUP, 3), "a", Mode.GREEDY, 0)] == [1, 1]
    assert counts[(by_match(LOOKUP, 3), "a", Mode.GREEDY, 2)] == [0, 1]
    assert counts[(by_match(LOOKUP, 0), "a", Mode.GREEDY, 0)] == [0, 1]
    assert counts[(LOOKUP, "a", Mode.GREEDY, 0)] == [1, 2]
    assert not any(k[0] == by_match("a", 3) or (k[0] != LOOKUP and k[0] != "a" and k[1] == "t") for k in counts)
    judged_only = CycleReport(("a", "t"), 2, emitted={}, accepted={"t": [2, 1]}, proposed={"t": [2, 2]},
                              results={}, shadow={(LOOKUP, "t"): [(2, 3), None]}, matches=[1, 2])
    counts = acceptance_counts(judged_only, rows)
    assert counts[(by_match(LOOKUP, 1), "t", Mode.GREEDY, 1)] == [1, 1]
    assert (by_match(LOOKUP, 2), "t", Mode.GREEDY, 0) not in counts    # no judgement, nothing filed
    # Prometheus shows the checks that ran, by level, not by match
    assert not any("@" in k[0] for k in acceptance_counts(ran, rows, shadow=False, matches=False))


def test_a_cycle_reports_each_rows_match_before_it_ran(tiny_pool) -> None:
    batch = ChainBatch({**tiny_pool, LOOKUP: LookupProposer(recent_tokens=0)}, "t", CONTEXT)
    prompts = [[3, 4, 5, 3, 4, 5, 3, 4], [9, 8, 7, 6]]
    batch.add([Row(str(i), p, len(p), SamplingParams(), 20) for i, p in enumerate(prompts)])
    try:
        expected = [longest_match(p, SHADOW_WINDOW)[1] for p in prompts]
        assert [batch.lookup_match(r) for r in batch.rows.values()] == expected == [3, 0]
        for chain in (("s", "t"), (LOOKUP, "t")):
            before = [longest_match(r.tokens, SHADOW_WINDOW)[1] for r in batch.rows.values()]
            assert batch.step(chain, 3).matches == before
    finally:
        batch.release()
    assert ChainBatch(tiny_pool, "t", CONTEXT).lookup_match(_row([1, 1])) is None   # no lookup level


def _by_match_snapshot(rates: dict[int, float], pooled: float):
    s = snapshot_pb({("a", "t"): 0.6, ("b", "t"): 0.65, ("a", "b"): 0.6, (LOOKUP, "t"): pooled,
                     (LOOKUP, "a"): pooled, (LOOKUP, "b"): pooled,
                     **{(by_match(LOOKUP, n), v): r for n, r in rates.items() for v in ("a", "b", "t")}})
    return snapshot_from_pb(s)


class _MatchBatch(FakeBatch):
    def __init__(self, match: int):
        super().__init__(1)
        self.match = match
        for r in self.rows.values():
            r.max_new_tokens = 200

    def lookup_match(self, row: Row) -> int:
        return self.match


def test_a_lone_rows_cycle_is_priced_by_the_lookups_match_after_its_tokens() -> None:
    """The lookup copies well after a long match and never after none; over every match its rate is
    middling. A row whose lookup found a long match runs the lookup's chain at a long window; one with no
    match runs a model's chain."""
    snap = _by_match_snapshot({0: 0.0, 1: 0.3, 3: 0.97}, pooled=0.5)
    sched = Scheduler(list(DECODE_MS), "t", SchedulerSettings(explore_after_s=1e9, chain_hysteresis=0.0,
                                                              hysteresis=0.0),
                      lambda: snap, clock=Clock(), levels=[LOOKUP])
    chain, window = sched.choose(_MatchBatch(3))
    assert chain[0] == LOOKUP and window > 8, (chain, window)
    chain, window = sched.choose(_MatchBatch(0))
    assert LOOKUP not in chain, (chain, window)
    # a match length never measured takes the lookup's estimate over every match
    estimates = sched.planner.make(1, 0).estimates
    unmeasured = estimates.rates((by_match(LOOKUP, 2), "t", Mode.GREEDY), 4)
    assert unmeasured == pytest.approx([estimates.rates((LOOKUP, "t", Mode.GREEDY), 1)[0]] * 4)
    assert estimates.calibration == Scheduler(list(DECODE_MS), "t", SchedulerSettings(),
                                              lambda: _by_match_snapshot({}, pooled=0.5), clock=Clock(),
                                              levels=[LOOKUP]).planner.make(1, 0).estimates.calibration


def test_a_lone_rows_new_match_is_decided_at_once() -> None:
    """A lone row's decision stands while its match stays (`decision_cycles`), and not past a new match:
    the lookup's chain where its row found a long match, a model's the cycle its match is gone."""
    snap = _by_match_snapshot({0: 0.0, 1: 0.3, 3: 0.97}, pooled=0.5)
    sched = Scheduler(list(DECODE_MS), "t", SchedulerSettings(explore_after_s=1e9, chain_hysteresis=0.0,
                                                              hysteresis=0.0, decision_cycles=8),
                      lambda: snap, clock=Clock(), levels=[LOOKUP])
    batch = _MatchBatch(3)
    assert sched.choose(batch)[0][0] == LOOKUP and sched.choose(batch)[0][0] == LOOKUP
    assert sched.counts["decisions"] == 1
    batch.match = 0
    assert LOOKUP not in sched.choose(batch)[0]
    assert sched.counts["decisions"] == 2


def test_plans_apart_by_match_share_the_model_chains_and_price_the_lookups_alone() -> None:
    snap = _by_match_snapshot({0: 0.0, 3: 0.9}, pooled=0.5)
    sched = Scheduler(list(DECODE_MS), "t", SchedulerSettings(), lambda: snap, clock=Clock(), levels=[LOOKUP])
    fresh = Scheduler(list(DECODE_MS), "t", SchedulerSettings(), lambda: snap, clock=Clock(), levels=[LOOKUP])
    over_all = sched.planner.make(1, 0, common=1)
    for match in (0, 3):
        plan = sched.planner.make(1, 0, common=1, match=match)
        alone = fresh.planner.make(1, 0, common=1, match=match)   # made from scratch, nothing shared
        assert plan.by_key.keys() == alone.by_key.keys() == over_all.by_key.keys()
        for key, p in plan.by_key.items():
            assert p.t_eff_ns == pytest.approx(alone.by_key[key].t_eff_ns, rel=1e-9), key
            if key[0][0] != LOOKUP:
                assert p is over_all.by_key[key]                   # shared, not recomputed
        fresh.planner._chain_predictions.clear()
    assert (sched.planner.make(1, 0, common=1, match=3).by_key[((LOOKUP, "t"), 8)].emitted
            > over_all.by_key[((LOOKUP, "t"), 8)].emitted
            > sched.planner.make(1, 0, common=1, match=0).by_key[((LOOKUP, "t"), 8)].emitted)


class _MatchesBatch(FakeBatch):
    """A batch whose rows' lookup found `matches` (one per row)."""

    def __init__(self, matches: list[int], greedy: bool = True):
        super().__init__(len(matches), greedy)
        self.matches = dict(zip(self.rows, matches))

    def lookup_match(self, row: Row) -> int:
        return self.matches[row.row_id]


def test_a_batch_is_priced_by_its_rows_matches() -> None:
    """A row without a match hands up one token whatever the others copy: a batch of two rows after a long
    match and two after none emits per row the mean of what the two kinds emit alone, not what the lookup's
    rate over every match says; the model chains are priced as for any batch of four."""
    snap = _by_match_snapshot({0: 0.0, 3: 0.9}, pooled=0.5)
    sched = Scheduler(list(DECODE_MS), "t", SchedulerSettings(), lambda: snap, clock=Clock(), levels=[LOOKUP])
    make = sched.planner.make
    mixed, none, full, pooled = make(4, 0, match=(0, 0, 3, 3)), make(4, 0, match=0), make(4, 0, match=3), make(4, 0)
    for chain in [(LOOKUP, "t"), (LOOKUP, "a", "t")]:
        for window in (4, 8):
            key = (chain, window)
            half = (none.by_key[key].emitted + full.by_key[key].emitted) / 2
            assert mixed.by_key[key].emitted == pytest.approx(half, rel=1e-9), key
            assert abs(mixed.by_key[key].emitted - pooled.by_key[key].emitted) > 0.05, key
    for key, p in pooled.by_key.items():
        if key[0][0] != LOOKUP:
            assert mixed.by_key[key].t_eff_ns == pytest.approx(p.t_eff_ns, rel=1e-9), key
    with pytest.raises(ValueError, match="one decoding mode"):
        make(2, 2, match=(0, 0, 3, 3))


def test_the_scheduler_plans_a_batch_at_its_rows_matches() -> None:
    """Rows of one mode are planned at their matches, sorted (one length when they share it); rows of two
    modes over every match; a batch of four rows whose lookup found nothing runs a model's chain, one whose
    rows all found a long match the lookup's."""
    snap = _by_match_snapshot({0: 0.0, 1: 0.3, 3: 0.97}, pooled=0.5)
    sched = Scheduler(list(DECODE_MS), "t", SchedulerSettings(explore_after_s=1e9, chain_hysteresis=0.0,
                                                              hysteresis=0.0),
                      lambda: snap, clock=Clock(), levels=[LOOKUP])
    assert LOOKUP not in sched.choose(_MatchesBatch([0, 0, 0, 0]))[0]
    assert sched.choose(_MatchesBatch([3, 3, 3, 3]))[0][0] == LOOKUP
    sched.choose(_MatchesBatch([3, 0, 3, 0]))
    mixed_modes = _MatchesBatch([3, 0, 1, 0])
    next(iter(mixed_modes.rows.values())).sampling = SamplingParams(temperature=1.0)
    sched.choose(mixed_modes)
    keys = {(k.composition, k.match) for k in sched.planner.plans}
    assert {((4, 0, 0), 0), ((4, 0, 0), 3), ((4, 0, 0), (0, 0, 3, 3)), ((3, 1, 0), None)} <= keys, keys


def test_a_batchs_matches_are_planned_in_parts_of_it() -> None:
    """A batch meets a new mix of matches nearly every cycle: in whole parts of the batch each length's
    share moves by less than a part, and the mixes seen share a few plans."""
    rng = random.Random(11)
    for parts in (2, 4):
        for _ in range(500):
            n = rng.randrange(parts + 1, 17)
            matches = [rng.choice([0, 0, 1, 2, 3, 3]) for _ in range(n)]
            coarse = coarse_matches(matches, parts)
            assert len(coarse) == n and set(coarse) <= set(matches), (matches, coarse)
            for m in set(matches):
                assert abs(coarse.count(m) - matches.count(m)) < n / parts + 1, (matches, coarse)
    assert coarse_matches([0] * 8 + [1] * 4 + [3] * 4, 4) == [0] * 8 + [1] * 4 + [3] * 4
    assert coarse_matches([0] * 9 + [1] * 3 + [3] * 4, 4) == [0] * 8 + [1] * 4 + [3] * 4
    assert coarse_matches([0, 0, 0, 3], 2) == [0, 0, 0, 0] and coarse_matches([0, 0, 3, 3], 2) == [0, 0, 3, 3]
    snap = _by_match_snapshot({0: 0.0, 1: 0.3, 2: 0.6, 3: 0.9}, pooled=0.5)
    sched = Scheduler(list(DECODE_MS), "t", SchedulerSettings(), lambda: snap, clock=Clock(), levels=[LOOKUP])
    for _ in range(100):
        sched.choose(_MatchesBatch([rng.choice([0, 0, 1, 2, 3, 3]) for _ in range(16)]))
    assert sched.counts["plans"] <= math.comb(MATCH_GRAIN + 3, 3)   # the ways of the parts over four lengths


def test_plans_no_decision_asks_for_are_dropped() -> None:
    """Every mix of matches and shifts is a plan key: over a long run the plans kept stay bounded, the ones
    in use stay."""
    clock = Clock()
    snap = _by_match_snapshot({0: 0.0, 3: 0.9}, pooled=0.5)
    sched = Scheduler(list(DECODE_MS), "t", SchedulerSettings(), lambda: snap, clock=clock, levels=[LOOKUP])
    for i in range(3 * PLANS_KEPT):
        clock.now += 1.0
        sched.plan(1, 0, common=2 * i)
        sched.plan(1, 0)   # asked for all along
    assert len(sched.planner.plans) <= 2 * PLANS_KEPT
    assert any(k.common == 0 and k.match is None for k in sched.planner.plans)
    assert any(k.common == 2 * (3 * PLANS_KEPT - 1) for k in sched.planner.plans)


def test_without_a_planner_thread_a_plan_one_step_away_serves() -> None:
    """On the cycle's path every plan made costs the cycle; a lone row's record moves its shift a step now
    and then, and a plan of the latest snapshot one step away serves it; two steps away, a plan is made."""
    snap = _by_match_snapshot({}, pooled=0.5)
    sched = Scheduler(list(DECODE_MS), "t", SchedulerSettings(), lambda: snap, clock=Clock(), levels=[LOOKUP])
    first = sched.plan(1, 0, shift=1)
    made = sched.counts["plans"]
    assert sched.plan(1, 0, shift=2) is first and sched.counts["plans"] == made
    assert sched.plan(1, 0, shift=3) is not first and sched.counts["plans"] == made + 1
    assert sched.plan(1, 0, shift=2, match=3) is not first    # another match is not a step away


def test_a_rows_growing_ngram_index_matches_as_a_scan_of_the_row_does() -> None:
    """`RowNgrams` keeps `longest_match` up to date as a row grows (and starts over where the sequence is not
    an extension of the last one): the same proposal and match length at every step."""
    rng = random.Random(5)
    for _ in range(300):
        ngrams = RowNgrams()
        tokens = [rng.randrange(rng.choice([3, 6, 50])) for _ in range(rng.randrange(0, 40))]
        for _ in range(20):
            window = rng.randrange(0, 10)
            assert ngrams.match(tokens, window) == longest_match(tokens, window), (tokens, window)
            tokens = tokens + [rng.randrange(6) for _ in range(rng.randrange(0, 4))]
            if rng.random() < 0.05:
                tokens = tokens[: len(tokens) // 2]


def test_rows_that_copy_worse_than_predicted_move_the_lookups_pairs_alone() -> None:
    """A batch standing on the lookup's chain whose rows copy far worse than predicted (text the lookup
    copies badly) is planned with the lookup's pairs shifted down and the models' as the pool measured
    them, so it turns to a model's chain; shifting every pair, as a model chain's shortfall does, kept it
    on the lookup's."""
    from specrouter.router.scheduling.candidates import chain_pairs
    from specrouter.router.scheduling.ledger import Tally

    sched = _scheduler({("a", "t"): 0.7, ("b", "t"): 0.7, (LOOKUP, "t"): 0.75}, explore_after_s=1e9, max_levels=2)
    batch = FakeBatch(2)
    for r in batch.rows.values():
        r.seen[LOOKUP] = 2
    chain, _ = sched.choose(batch)
    assert chain == (LOOKUP, "t")
    for r in batch.rows.values():   # 20 of 100 positions copied where 75 were predicted
        sched.records[r] = Tally(20.0, 100.0, 75.0, 100.0)
    chain, _ = sched.choose(batch)
    (key,) = [k for k in sched.planner.plans if k.shift and k.greedy == 2]
    assert key.shift < 0 and key.pairs == frozenset({(LOOKUP, "t")})
    shifted, base = sched.planner.plans[key], sched.plan(2, 0)
    for p in shifted.predictions:
        before = base.by_key[(p.chain, p.window)]
        if LOOKUP in p.chain:
            assert p.emitted < before.emitted
        else:
            assert p.emitted == before.emitted and all(pair[0] != LOOKUP for pair in chain_pairs(p.chain))
    assert chain in {("a", "t"), ("b", "t")}
    # the same shortfall on every pair leaves the lookup's chain first
    assert sched.plan(2, 0, common=key.shift).predictions[0].chain == (LOOKUP, "t")
