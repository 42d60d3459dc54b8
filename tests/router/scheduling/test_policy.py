"""The decision policy: hysteresis, catch-up, exploration, the fit to the tokens left, named chains and windows."""

from __future__ import annotations

from specrouter.contract.calls import SamplingParams
from specrouter.contract.measures import Mode
from specrouter.router.row import Row
from specrouter.router.scheduling.candidates import chain_pairs
from specrouter.router.scheduling.ledger import Tally
from specrouter.router.scheduling.scheduler import Scheduler
from tests.router.scheduling.fakes import Clock, FakeBatch, make, snapshot


def test_decision_follows_the_metrics_with_hysteresis() -> None:
    clock = Clock()
    sched, holder = make({("a", "t"): 0.9, ("b", "t"): 0.9, ("a", "b"): 0.9, ("b", "a"): 0.9}, clock,
                         explore_after_s=1e9, recompute_s=0.0)
    batch = FakeBatch(1)
    first = sched.choose(batch)
    assert first[0] == ("a", "t")
    # the same prediction, slightly better elsewhere (within hysteresis): the batch keeps its choice
    assert sched.choose(batch) == first
    # acceptance collapses: the plan is refreshed and the batch switches to plain decoding
    holder["snapshot"] = snapshot({("a", "t"): 0.02, ("b", "t"): 0.02, ("a", "b"): 0.02, ("b", "a"): 0.02})
    clock.now += 1
    assert sched.choose(batch) == (("t",), 0)
    assert sched.counts["switches"] == 1


def test_a_batchs_decision_stands_while_what_it_was_made_for_stays() -> None:
    """A decision serves `decision_cycles` cycles of its batch, then is made again; a new snapshot, a row
    leaving or a new record shift end it at once, a row replaced by another of its mode does not; with
    `decision_cycles` 1 every cycle decides."""
    acceptance = {("a", "t"): 0.9, ("b", "t"): 0.9, ("a", "b"): 0.9, ("b", "a"): 0.9}
    clock = Clock()
    sched, holder = make(acceptance, clock, explore_after_s=1e9, decision_cycles=3)
    batch = FakeBatch(3)
    first = sched.choose(batch)
    for _ in range(2):
        assert sched.choose(batch) == first
    assert sched.counts["decisions"] == 1
    assert sched.choose(batch) == first and sched.counts["decisions"] == 2      # three cycles served: anew
    holder["snapshot"] = snapshot({pair: 0.02 for pair in acceptance})
    clock.now += 1
    assert sched.choose(batch) == (("t",), 0) and sched.counts["decisions"] == 3   # a new snapshot
    next(iter(batch.rows.values())).finish_reason = "length"
    sched.choose(batch)
    assert sched.counts["decisions"] == 4                                        # a row left
    sched.choose(batch)
    assert sched.counts["decisions"] == 4
    batch.rows = {r: row for r, row in batch.rows.items() if row.finish_reason is None}
    gone = batch.rows.pop(next(iter(batch.rows)))   # a row leaves as another of its mode joins
    batch.rows["new"] = Row("new", [1, 2, 3], 3, gone.sampling, 64)
    batch.rows["new"].seen = dict(gone.seen)
    sched.choose(batch)
    assert sched.counts["decisions"] == 4
    batch.rows["new"].sampling = SamplingParams(temperature=1.0, seed=1)   # ... of another mode
    sched.choose(batch)
    assert sched.counts["decisions"] == 5
    batch.rows["new"].sampling = gone.sampling
    sched.choose(batch)
    assert sched.counts["decisions"] == 6
    for row in batch.rows.values():   # the rows draft far worse than predicted: their shift moves
        sched.records[row] = Tally(20.0, 100.0, 90.0, 100.0)   # 2 in 10 accepted where 9 in 10 were predicted
    sched.choose(batch)
    assert sched.counts["decisions"] == 7
    every, _ = make(acceptance, Clock(), explore_after_s=1e9, decision_cycles=1)
    for n in range(1, 5):
        every.choose(batch)
        assert every.counts["decisions"] == n


def test_hysteresis_keeps_a_choice_that_is_nearly_as_good() -> None:
    sched, _ = make({("a", "t"): 0.8, ("b", "t"): 0.5, ("a", "b"): 0.5, ("b", "a"): 0.5}, explore_after_s=1e9,
                    hysteresis=0.5, chain_hysteresis=0.5)
    batch = FakeBatch(1)
    plan = sched.plan(1, 0)
    second = next(p for p in plan.predictions[1:] if p.t_eff_ns < plan.predictions[0].t_eff_ns * 1.5)
    _standing(sched, batch, second)
    assert sched.choose(batch) == (second.chain, second.window)


def _standing(sched: Scheduler, batch, prediction) -> None:
    from specrouter.router.scheduling.policy import Decision
    sched.state(batch).current = Decision(prediction.chain, prediction.window, prediction)


def test_a_chain_switch_needs_more_than_a_window_change() -> None:
    acceptance = {("a", "t"): 0.8, ("b", "t"): 0.8, ("a", "b"): 0.5, ("b", "a"): 0.5}
    probe, _ = make(acceptance, explore_after_s=1e9)
    plan = probe.plan(1, 0)
    best = plan.predictions[0]
    in_b = sorted((p for p in plan.predictions if p.chain == ("b", "t")), key=lambda p: p.t_eff_ns)
    gain = 1 - best.t_eff_ns / in_b[0].t_eff_ns      # how much faster (a, t) is than (b, t) at its best
    assert best.chain == ("a", "t") and 0.05 < gain < 0.9
    for chain_hysteresis, expected in ((gain + 0.02, ("b", "t")), (gain - 0.02, ("a", "t"))):
        sched, _ = make(acceptance, explore_after_s=1e9, chain_hysteresis=chain_hysteresis)
        batch = FakeBatch(1)
        _standing(sched, batch, in_b[-1])            # (b, t) at its worst window
        chain, window = sched.choose(batch)
        assert chain == expected
        if chain == ("b", "t"):                       # kept the chain, moved to its best window
            assert window == in_b[0].window
    # a window change within the chain still happens at the (small) window hysteresis
    sched, _ = make(acceptance, explore_after_s=1e9, chain_hysteresis=0.99)
    batch = FakeBatch(1)
    worse = next(p for p in in_b if p.t_eff_ns * (1 - sched.settings.hysteresis) > in_b[0].t_eff_ns)
    _standing(sched, batch, worse)
    assert sched.choose(batch) == (("b", "t"), in_b[0].window)


def test_a_switch_near_the_end_of_the_batch_does_not_pay_for_its_catch_up() -> None:
    acceptance = {("a", "t"): 0.6, ("b", "t"): 0.9, ("a", "b"): 0.5, ("b", "a"): 0.5}
    decisions = {}
    for left in (60, 3):
        sched, _ = make(acceptance, explore_after_s=1e9, chain_hysteresis=0.0, hysteresis=0.0)
        batch = FakeBatch(1)
        row = next(iter(batch.rows.values()))
        row.max_new_tokens = 300
        row.tokens += [7] * (300 - left)              # `left` tokens to go; (b) has seen none of the output
        row.seen = {"a": len(row.tokens) - 1, "t": len(row.tokens) - 1, "b": 2}
        plan = sched.plan(1, 0)
        assert plan.predictions[0].chain == ("b", "t")
        _standing(sched, batch, next(p for p in plan.predictions if p.chain == ("a", "t")))
        decisions[left] = sched.choose(batch)[0]
    # with many cycles to go the catch-up is spread thin: switch; with a cycle or two left it is not worth it
    assert decisions == {60: ("b", "t"), 3: ("a", "t")}


def test_unmeasured_pairs_are_explored_then_left_alone() -> None:
    clock = Clock()
    sched, _ = make({("a", "t"): 0.9}, clock, explore_after_s=5.0, explore_every_cycles=10)
    batch = FakeBatch(1)
    decisions = [sched.choose(batch) for _ in range(40)]
    explored = {c for c, _ in decisions if c != ("a", "t")}
    # the two pairs never measured, (b, t) and (a, b), each got a cycle of a chain holding them
    assert sched.counts["explorations"] == 2
    assert ("a", "b", "t") in explored and any("b" in c for c in explored)
    gaps = [i for i, (c, _) in enumerate(decisions) if c != ("a", "t")]
    assert all(later - earlier >= 10 for earlier, later in zip(gaps, gaps[1:]))


def test_an_exploration_waits_for_a_batch_without_catch_up() -> None:
    """An overdue pair is explored in a batch whose rows its chain's models have all seen (a new request),
    not in one where a model that sat out must first feed the tokens it missed; past `explore_patience`
    times overdue it is explored anyway."""
    clock = Clock()
    sched, _ = make({("a", "t"): 0.9, ("b", "t"): 0.9, ("a", "b"): 0.9, ("b", "a"): 0.9}, clock,
                    explore_after_s=5.0, explore_gap=0.0, explore_every_cycles=1, explore_patience=2.0)
    running = FakeBatch(1)
    row = next(iter(running.rows.values()))
    for pair in sched.pairs:      # every pair measured now
        sched.freshness.mark((*pair, Mode.GREEDY), clock.now)
    assert sched.choose(running)[0] == ("a", "t")
    row.tokens += list(range(4, 44))   # 40 tokens on, drafted by a: b has not seen them
    row.seen = {"a": len(row.tokens) - 1, "t": len(row.tokens) - 1, "b": 2}
    clock.now += 6.0               # every pair but (a, t) overdue, none twice over
    sched.freshness.mark(("a", "t", Mode.GREEDY), clock.now)   # the standing chain's cycles measure it
    assert sched.choose(running)[0] == ("a", "t")
    assert sched.counts["explorations"] == 0
    fresh = FakeBatch(1)           # a new request: every model prefilled it
    assert "b" in sched.choose(fresh)[0]
    assert sched.counts["explorations"] == 1
    clock.now += 6.0               # the others now twice overdue: explored even with the catch-up
    sched.freshness.mark(("a", "t", Mode.GREEDY), clock.now)
    assert "b" in sched.choose(running)[0]
    assert sched.counts["explorations"] == 2


def test_pairs_far_behind_are_explored_less_often() -> None:
    """Every pair measured at the start; then a pair waits explore_after_s times its best chain's
    predicted gap over explore_gap before it is explored again, and the closest competitor goes first."""
    acceptance = {("a", "t"): 0.9, ("b", "t"): 0.9, ("a", "b"): 0.3, ("b", "a"): 0.3}
    clock = Clock()
    sched, _ = make(acceptance, clock, explore_after_s=5.0, explore_every_cycles=1, explore_gap=0.1,
                    explore_after_max_s=30.0)
    batch = FakeBatch(1)
    plan = sched.plan(1, 0)
    best = plan.predictions[0].t_eff_ns
    gap = {pair: next(p.t_eff_ns for p in plan.predictions if pair in chain_pairs(p.chain)) / best - 1
           for pair in sched.pairs}
    assert gap[("a", "t")] == 0 and 0.1 < gap[("b", "t")] < gap[("a", "b")]
    due = {pair: min(30.0, 5.0 * max(1.0, g / 0.1)) for pair, g in gap.items()}
    assert due[("b", "t")] < due[("a", "b")] == 30.0      # the three-level chain is far off
    first: dict[tuple[str, str], float] = {}
    start = clock.now
    for _ in range(80):                       # a cycle every half second, 40 seconds
        chain, _ = sched.choose(batch)
        for pair in chain_pairs(chain):
            if sched.counts["explorations"] and pair not in first and chain != ("a", "t"):
                first[pair] = clock.now - start
        clock.now += 0.5
    assert set(first) >= {("b", "t"), ("a", "b")}
    assert due[("b", "t")] <= first[("b", "t")] < due[("b", "t")] + 1.0
    assert due[("a", "b")] <= first[("a", "b")] < due[("a", "b")] + 2.0
    # without the scaling every pair is due after explore_after_s
    flat, _ = make(acceptance, Clock(), explore_after_s=5.0, explore_gap=0.0)
    assert {flat.policy.exploration_wait(plan, pair) for pair in sched.pairs} == {5.0}


def test_a_named_chain_gets_its_own_best_window() -> None:
    sched, _ = make({("a", "t"): 0.95, ("b", "t"): 0.3, ("a", "b"): 0.5, ("b", "a"): 0.5}, explore_every_cycles=1,
                    explore_after_s=0.0)
    plan = sched.plan(1, 0)
    assert plan.predictions[0].chain == ("a", "t")
    best_b = min((p for p in plan.predictions if p.chain == ("b", "t")), key=lambda p: p.t_eff_ns)
    batch = FakeBatch(1)
    # never another chain, never an exploration, whatever the exploration settings
    assert [sched.choose(batch, ("b", "t")) for _ in range(5)] == [(("b", "t"), best_b.window)] * 5
    assert best_b.window < plan.predictions[0].window   # poor acceptance: a shorter window than (a, t)'s
    assert sched.counts["explorations"] == 0
    # a named window: the best chain at that window (or the target alone, which has none)
    at_2 = min((p for p in plan.predictions if p.window == 2 or p.chain == ("t",)), key=lambda p: p.t_eff_ns)
    assert sched.choose(FakeBatch(1), None, 2) == (at_2.chain, at_2.window) == (("a", "t"), 2)
    # a chain longer than the scheduler plans (max_levels 2 here) still runs, at the middle window
    short, _ = make({("a", "t"): 0.9}, max_levels=2, windows=[1, 2, 3, 4, 5])
    assert short.choose(FakeBatch(1), ("a", "b", "t")) == (("a", "b", "t"), 3)


def test_no_draft_is_longer_than_the_tokens_left() -> None:
    acceptance = {("a", "t"): 0.95, ("b", "t"): 0.95, ("a", "b"): 0.95, ("b", "a"): 0.95}
    sched, _ = make(acceptance, explore_after_s=1e9)
    batch = FakeBatch(2)
    chain, window = sched.choose(batch)
    assert chain == ("a", "t") and window >= 6        # plenty of tokens to go: a long window
    rows = list(batch.rows.values())
    rows[0].tokens += [7] * (rows[0].max_new_tokens - 3)   # 3 tokens left; the other row still has 64
    assert sched.choose(batch) == (chain, window)      # the batch runs as long as its longest row
    rows[1].tokens += [7] * (rows[1].max_new_tokens - 4)   # now 3 and 4 left: at most 4 can be emitted
    chain, window = sched.choose(batch)
    assert chain == ("a", "t") and window == 3
    # one token left: a draft cannot add to it, the target alone emits it
    for r in rows:
        r.tokens += [7] * (r.max_new_tokens - 1 - len(r.generated))
    assert sched.choose(batch) == (("t",), 0)
    # ... or, the chain being named, its cheapest cycle
    assert sched.choose(batch, ("b", "t")) == (("b", "t"), 1)
    # a named window is the requests' to name, even when it outlasts what is left
    named = FakeBatch(1)
    row = next(iter(named.rows.values()))
    row.tokens += [7] * (row.max_new_tokens - 2)
    assert sched.choose(named, None, 8) == (("a", "t"), 8)


def test_a_batch_drafts_no_longer_than_its_window_cap_unless_named() -> None:
    """Rows of a batch differ for good, which the tail factor does not see: a batch of two rows or more
    drafts at most `batch_max_window` tokens, even where a longer window is predicted faster; one row is
    not capped, and a window the requests named is theirs."""
    acceptance = {("a", "t"): 0.97, ("b", "t"): 0.97, ("a", "b"): 0.97, ("b", "a"): 0.97}
    uncapped, _ = make(acceptance, explore_after_s=1e9, batch_max_window=8)
    assert uncapped.choose(FakeBatch(4)) == (("a", "t"), 8)      # predicted best for 4 rows
    sched, _ = make(acceptance, explore_after_s=1e9)
    assert sched.settings.batch_max_window == 6
    assert sched.choose(FakeBatch(1)) == (("a", "t"), 8)
    assert sched.choose(FakeBatch(4)) == (("a", "t"), 6)
    assert sched.choose(FakeBatch(4), None, 8) == (("a", "t"), 8)


def test_a_model_the_batch_lost_is_never_chosen_nor_explored() -> None:
    """A batch whose drafter failed has the chains without it only: the best of those, and explorations
    among them, while another batch still gets the best chain of the pool."""
    sched, _ = make({("a", "t"): 0.95, ("b", "t"): 0.7, ("a", "b"): 0.9, ("b", "a"): 0.9},
                    explore_after_s=0.0, explore_every_cycles=1)
    whole, lost = FakeBatch(1), FakeBatch(1)
    lost.workers = {"b": None, "t": None}   # "a" dropped
    chosen = {sched.choose(lost)[0] for _ in range(30)}
    assert chosen and all(set(c) <= {"b", "t"} for c in chosen), chosen
    assert sched.counts["explorations"] > 0
    assert {sched.choose(whole)[0] for _ in range(30)} & {("a", "t"), ("a", "b", "t"), ("b", "a", "t")}


def test_a_batch_of_greedy_and_sampled_rows_is_explored() -> None:
    """Overdue pairs of a mixed batch tie across modes (both unmeasured); ranking them must compare how
    overdue they are alone, not the modes (which have no order)."""
    sched, _ = make({("a", "t"): 0.9}, explore_after_s=0.0, explore_every_cycles=1)
    batch, sampled = FakeBatch(2), FakeBatch(2, greedy=False)
    for row in sampled.rows.values():
        row.row_id = f"sampled-{row.row_id}"
        batch.rows[row.row_id] = row
    chains = [sched.choose(batch)[0] for _ in range(8)]
    assert sched.counts["explorations"] >= 3
    assert any("b" in c for c in chains)


def test_a_large_batchs_decision_stands_while_its_size_stays_within_a_half_octave() -> None:
    """At batch 16 a finished row's successor often joins a cycle later: 15 rows are the same batch to a
    standing decision; 13 (another half octave) and a batch of 4 that loses a row are not."""
    acceptance = {("a", "t"): 0.9, ("b", "t"): 0.9, ("a", "b"): 0.9, ("b", "a"): 0.9}
    for rows, left, decisions in [(16, 15, 1), (16, 13, 2), (4, 3, 2)]:
        sched, _ = make(acceptance, Clock(), explore_after_s=1e9, decision_cycles=4)
        batch = FakeBatch(rows)
        sched.choose(batch)
        for r in list(batch.rows)[left:]:
            batch.rows[r].finish_reason = "length"
        sched.choose(batch)
        assert sched.counts["decisions"] == decisions, (rows, left)


def test_an_exploration_whose_catch_up_costs_many_cycles_waits_longer() -> None:
    """At batch 16 a model that sat out must first feed every row's tokens: a catch-up of several cycles.
    An overdue pair then waits past `explore_patience` until it is overdue by 1 + that catch-up over its
    chain's cycle, so that its explorations cost the router no more of its time than a cheap one's."""
    from specrouter.router.scheduling.policy import catch_up_ns

    clock = Clock()
    sched, _ = make({("a", "t"): 0.9, ("b", "t"): 0.9, ("a", "b"): 0.9, ("b", "a"): 0.9}, clock,
                    explore_after_s=5.0, explore_gap=0.0, explore_every_cycles=1, explore_patience=2.0)
    batch = FakeBatch(16)
    for row in batch.rows.values():   # 300 tokens on, drafted by a: b has seen none of them
        row.tokens += list(range(4, 304))
        row.seen = {"a": len(row.tokens) - 1, "t": len(row.tokens) - 1, "b": 2}
    for pair in sched.pairs:
        sched.freshness.mark((*pair, Mode.GREEDY), clock.now)
    assert "b" not in sched.choose(batch)[0]
    plan = sched.plan(16, 0)
    rows = list(batch.rows.values())
    through_b = next(p for p in plan.predictions if "b" in p.chain)
    factor = 1.0 + catch_up_ns(plan, through_b.chain, rows) / through_b.cost_ns
    assert factor > 2.0 * 1.2    # the catch-up costs more cycles than explore_patience allows for
    start = clock.now
    for _ in range(1200):         # a cycle every 0.1 s; (a, t) stays measured
        clock.now += 0.1
        sched.freshness.mark(("a", "t", Mode.GREEDY), clock.now)
        if "b" in sched.choose(batch)[0]:
            break
    assert sched.counts["explorations"] == 1
    assert 5.0 * factor <= clock.now - start < 5.0 * factor + 1.0
