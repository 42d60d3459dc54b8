"""`specrouter bench`: its statistics, checks, equality check, breakdown arithmetic and formatting, the
experiment design on a synthetic bench, and one end-to-end run (slow). The transformers peers are tested in
test_bench_peers.py, the engine's rows in test_bench_engine.py."""

from __future__ import annotations

import dataclasses
import json
import math
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from specrouter.report.bench import (SWITCHING, BenchError, BenchReport, BenchSettings, ModelRow, ServiceConfig,
                                     check_kinds, requests_for, workloads)
from specrouter.report.bench_format import (check_lines, column_labels, format_markdown, report_json,
                                            write_chart)
from specrouter.report.bench_results import (ADAPTIVE, FAIL, HF_PROMPT_LOOKUP, HF_TARGET, LOOKUP_CHAIN,
                                             LOOKUP_THREE_LEVEL, NOT_RUN, PASS, SERVICES, SSD_SMALLEST, SSD_TUNED, THREE_LEVEL, TMO,
                                             BreakdownSum, Cell, Mismatch, Runoff, Screened, Spread, agreeing,
                                             assisted_label, engine_label, evaluate_checks, find_mismatches,
                                             first_difference, set_ratios)
from specrouter.report.workloads import Prompt
from tests.conftest import DEMO_POOL
from tests.report.bench_fakes import FakeBench, made_up_cell, save_tiny_pool

# -- statistics -----------------------------------------------------------------------------------


def test_spread_is_the_median_and_the_range_over_rounds() -> None:
    s = Spread.of([10.0, 30.0, 20.0])
    assert (s.median, s.low, s.high, s.runs) == (20.0, 10.0, 30.0, [10.0, 30.0, 20.0])
    assert s.relative_range == pytest.approx(1.0)
    assert Spread.of([10.0, 20.0]).median == 15.0    # even count: the mean of the middle two
    with pytest.raises(ValueError):
        Spread.of([])


def test_requests_come_in_whole_waves_of_two_at_least() -> None:
    assert [requests_for(8, b) for b in (1, 3, 4, 16)] == [8, 9, 8, 32]
    assert requests_for(2, 1) == 2


# -- the breakdown --------------------------------------------------------------------------------


def _stats(cycles: int, total_ms: float, queue_ms: float, cycle_ms: float, choose_ms: float, prefill_ms: float,
           levels: dict[str, tuple[int, float, float, float]], late_prefill_ms: float = 0.0):
    ms = lambda x: int(x * 1e6)   # noqa: E731
    timing = {m: SimpleNamespace(calls=c, call_ns=ms(call), handler_ns=ms(h), forward_ns=ms(f))
              for m, (c, call, h, f) in levels.items()}
    breakdown = SimpleNamespace(cycle_ns=ms(cycle_ms), choose_ns=ms(choose_ms), prefill_ns=ms(prefill_ms),
                                late_prefill_ns=ms(late_prefill_ms), levels=timing)
    return SimpleNamespace(cycles=cycles, total_ns=ms(total_ms), queue_ns=ms(queue_ms), breakdown=breakdown)


def test_breakdown_is_per_cycle_over_every_request() -> None:
    totals = BreakdownSum()
    # request 1: 4 cycles of 10 ms; drafter calls 4 ms (handler 3, forward 2), target calls 5 (4.5, 4)
    totals.observe(_stats(4, 60, 2, 40, 0.4, 6, {"d": (4, 4, 3, 2), "t": (4, 5, 4.5, 4)}), client_ns=int(61e6))
    # request 2: 6 cycles, one of which prefilled it on the drafter for 2 ms (it joined without it)
    totals.observe(_stats(6, 90, 3, 60, 0.6, 9, {"d": (6, 6, 4.5, 3), "t": (6, 7.5, 6.75, 6)}, late_prefill_ms=2),
                   client_ns=int(93e6))
    b = totals.summary()
    assert (b.requests, b.cycles) == (2, 10)
    assert b.forward_ms == pytest.approx({"d": 0.5, "t": 1.0})
    assert b.handler_outside_forward_ms == pytest.approx((3 + 4.5 + 4.5 + 6.75 - 2 - 4 - 3 - 6) / 10)
    assert b.transport_ms == pytest.approx((4 + 5 + 6 + 7.5 - 3 - 4.5 - 4.5 - 6.75) / 10)
    assert b.router_in_cycle_ms == pytest.approx((100 - 22.5 - 1.0 - 2.0) / 10)
    assert b.choose_ms == pytest.approx(0.1)
    assert b.late_prefill_ms == pytest.approx(0.2)
    assert b.outside_cycles_ms == pytest.approx((150 - 5 - 100) / 10)
    assert b.cycle_ms == pytest.approx(10.0)
    assert b.client_side_ms_per_request == pytest.approx((154 - 150) / 2)


def test_breakdown_is_unavailable_when_the_stats_do_not_carry_it() -> None:
    totals = BreakdownSum()
    totals.observe(_stats(4, 60, 2, 40, 0.4, 6, {"t": (4, 5, 4.5, 4)}), client_ns=1)
    totals.observe(SimpleNamespace(cycles=3, total_ns=1, queue_ns=0), client_ns=1)   # an older router: no field
    assert totals.summary() is None
    assert BreakdownSum().summary() is None


# -- equality -------------------------------------------------------------------------------------


def test_first_difference_and_agreement() -> None:
    assert first_difference([1, 2, 3], [1, 2, 3]) is None
    assert first_difference([1, 2, 3], [1, 5, 3]) == 1
    assert first_difference([1, 2], [1, 2, 0]) == 2        # one stopped early
    assert agreeing([[1, 2], [3, 4], [5]], [[1, 2], [3, 5], [5]]) == 2


def test_a_mismatch_against_tmo_is_found_prompt_by_prompt() -> None:
    reference = [[1, 2, 3], [4, 5, 6]]
    runs = {TMO: [reference], ADAPTIVE: [reference, [[1, 2, 3], [4, 9, 6]]], "screening x W2": [[[1, 2, 3]]]}
    found = find_mismatches("code", 4, reference, runs)
    assert found == [Mismatch("code", 4, ADAPTIVE, 1, 1)]
    assert find_mismatches("code", 4, reference, {ADAPTIVE: [reference]}) == []


# -- ratios and checks ----------------------------------------------------------------------------


def _cells(adaptive_code: float = 150.0) -> list[Cell]:
    code = {HF_TARGET: 100.0, assisted_label("d"): 120.0, TMO: 95.0, ADAPTIVE: adaptive_code}
    return [made_up_cell("code", 1, code), made_up_cell("code", 4, {HF_TARGET: 300.0, TMO: 280.0, ADAPTIVE: 360.0}),
            made_up_cell("repetitive", 1, {HF_TARGET: 100.0, TMO: 90.0, ADAPTIVE: 200.0})]


def test_ratios_are_over_the_cells_reference_and_the_kinds_batch_one_generate() -> None:
    cells = _cells()
    set_ratios(cells)
    assert cells[0].entry(ADAPTIVE).ratio == pytest.approx(1.5)
    assert cells[1].entry(ADAPTIVE).ratio == pytest.approx(1.2)            # over batched generate at 4
    assert cells[1].entry(ADAPTIVE).ratio_to_batch1 == pytest.approx(3.6)  # over generate at batch 1


def test_checks_pass_fail_and_not_run() -> None:
    checks = {c.name: c for c in evaluate_checks(_cells(), [], ["d"])}
    status = {name: c.status for name, c in checks.items()}
    assert status["services TMO >= 0.92x in-process target-only, code, batch 1"] == PASS      # 0.95
    assert status["services TMO >= 0.92x in-process target-only, repetitive, batch 1"] == FAIL  # 0.90
    assert status["adaptive >= 1.35x in-process target-only, code, batch 1"] == PASS          # 1.50
    assert status["adaptive >= 1.15x the best transformers assisted generation, code, batch 1"] == PASS  # 1.25
    assert status["adaptive >= 1.8x in-process target-only, repetitive, batch 1"] == PASS     # 2.00
    assert status["adaptive >= 1.15x in-process batched target-only generate, code, batch 4"] == PASS  # 1.20
    assert status["adaptive >= 1.15x in-process batched target-only generate, code, batch 16"] == NOT_RUN
    assert status["greedy outputs equal across every services configuration and the engine in process"] == PASS
    assert checks["adaptive >= 1.35x in-process target-only, code, batch 1"].value == pytest.approx(1.5)
    # slower adaptive on code: both batch-1 code checks fail; a mismatch fails the equality check
    failing = {c.name: c.status for c in evaluate_checks(_cells(adaptive_code=130.0),
                                                         [Mismatch("code", 1, ADAPTIVE, 0, 3)], ["d"])}
    assert failing["adaptive >= 1.35x in-process target-only, code, batch 1"] == FAIL
    assert failing["adaptive >= 1.15x the best transformers assisted generation, code, batch 1"] == FAIL
    assert failing["greedy outputs equal across every services configuration and the engine in process"] == FAIL


def test_checks_of_cells_not_run_are_not_run_and_never_pass() -> None:
    checks = evaluate_checks([made_up_cell("prose", 1, {HF_TARGET: 100.0, TMO: 99.0, ADAPTIVE: 110.0})], [], ["d"])
    status = {c.name: c.status for c in checks}
    assert status["services TMO >= 0.92x in-process target-only, code, batch 1"] == NOT_RUN   # code always listed
    assert status["services TMO >= 0.92x in-process target-only, prose, batch 1"] == PASS
    assert status["services keep >= 0.9x the same chain and window in process, prose, batch 1"] == NOT_RUN
    # no engine rows in the cell: no share kept; no batched cell: no run-off at 4 or 16
    assert sum(s == NOT_RUN for s in status.values()) == 10
    assert evaluate_checks([], [], [])[-1].status == NOT_RUN


def test_a_runoff_pairs_its_rounds_and_its_check_reads_the_runoff_not_the_rounds() -> None:
    r = Runoff.of(SSD_TUNED, [100.0, 110.0], [100.0, 100.0], rounds_ratio=0.9)
    assert r.ratio == pytest.approx(105.0 / 100.0)
    assert r.se == pytest.approx(math.log(1.1) / 2)     # stdev of [0, log 1.1] over sqrt(2) pairs
    assert Runoff.of(TMO, [100.0], [100.0], 1.0).se is None
    name = "adaptive >= 0.97x the best static configuration (run-off), {kind}, batch {batch}"
    cells = _cells()
    cells[1].runoff = Runoff.of(SSD_TUNED, [98.0, 99.0, 97.0], [100.0, 100.0, 101.0], rounds_ratio=0.90)
    checks = {c.name: c for c in evaluate_checks(cells, [], ["d"])}
    passed = checks[name.format(kind="code", batch=4)]
    assert passed.status == PASS and passed.value == pytest.approx(98.0 / 100.0)   # the rounds said 0.90
    assert "over SSD-tuned 100.0 in 3 run-off rounds = 0.980x" in passed.detail
    assert checks[name.format(kind="code", batch=16)].status == NOT_RUN
    cells[1].runoff = Runoff.of(SSD_TUNED, [95.0, 96.0], [100.0, 100.0], rounds_ratio=1.0)
    failed = {c.name: c for c in evaluate_checks(cells, [], ["d"])}[name.format(kind="code", batch=4)]
    assert failed.status == FAIL and failed.value == pytest.approx(0.955)
    cells[1].runoff = None
    assert {c.name: c for c in evaluate_checks(cells, [], ["d"])}[name.format(kind="code", batch=4)].status == NOT_RUN


# -- formatting -----------------------------------------------------------------------------------


def _report() -> BenchReport:
    cells = _cells()
    totals = BreakdownSum()
    totals.observe(_stats(4, 60, 2, 40, 0.4, 6, {"stdlib-1m": (4, 4, 3, 2), "stdlib-29m": (4, 5, 4.5, 4)}), int(61e6))
    cells[0].entry(ADAPTIVE).breakdown = totals.summary()
    set_ratios(cells)
    mismatches = [Mismatch("code", 4, ADAPTIVE, 1, 7)]
    return BenchReport(BenchSettings(kinds=("code", "repetitive")), [ModelRow("d", 10, "drafter"),
                                                                     ModelRow("t", 100, "target")],
                       cells, mismatches, evaluate_checks(cells, mismatches, ["d"]), 12.0)


def test_markdown_has_the_tables_and_the_checks(tmp_path: Path) -> None:
    report = _report()
    text = format_markdown(report)
    assert "| kind | batch | requests | hf-generate | hf-assisted:d | TMO | adaptive |" in text
    assert "| code | 1 | 8 | 100.0 (1.00x) | 120.0 (1.20x) | 95.0 (0.95x) | 150.0 (1.50x) |" in text
    assert ("| code | 4 | 8 | 300.0 (1.00x) [3.00x b1] | - | 280.0 (0.93x) [2.80x b1] | 360.0 (1.20x) [3.60x b1] |"
            in text)
    assert "| code | 1 | adaptive | 4 | 1m 0.50, 29m 1.00 |" in text      # the breakdown, names shortened
    assert "| code | 4 | TMO | unavailable |" in text
    assert "## Run-off" not in text                                       # no batched cell ran one
    report.cells[1].runoff = Runoff.of(TMO, [350.0, 370.0], [290.0, 270.0], rounds_ratio=360.0 / 280.0)
    report.cells[1].entry(TMO).chain = ["t"]
    ran = format_markdown(report)
    assert "## Run-off at batch sizes above 1" in ran
    assert "| code | 4 | TMO | t | 2 | 360.0 (350.0-370.0) | 280.0 (270.0-290.0) | 1.286x |" in ran
    assert json.loads(json.dumps(report_json(report)))["cells"][1]["runoff"]["best"] == TMO
    report.cells[1].runoff = None
    assert "- FAIL: greedy outputs equal across every services configuration and the engine in process." in text
    assert "code batch 4: adaptive, prompt 1, first differing token 7" in text
    lines = check_lines(report)
    assert lines[-1].startswith("FAIL  greedy outputs equal") and any(x.startswith("n/a ") for x in lines)
    assert column_labels(report.cells) == [HF_TARGET, assisted_label("d"), TMO, ADAPTIVE]
    data = json.loads(json.dumps(report_json(report)))
    assert data["cells"][0]["entries"][3]["tokens_per_s"]["median"] == 150.0
    assert data["checks"][-1]["status"] == FAIL
    chart = write_chart(report, tmp_path / "bench.png")
    assert chart.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "services: one worker process per model;" in text
    assert data["settings"]["models_in_router"] is False
    in_router = dataclasses.replace(report, settings=dataclasses.replace(report.settings, models_in_router=True))
    text = format_markdown(in_router)
    assert "services: the router holds the models (`--models-in-router`);" in text
    assert "the transport the hand-off to that thread" in text


# -- the experiment design, without a cluster -----------------------------------------------------


def test_workloads_cells_and_the_switching_run() -> None:
    prompts = [Prompt("prose", f"p{i}") for i in range(3)] + [Prompt("repetitive", f"r{i}") for i in range(2)]
    settings = BenchSettings(kinds=("prose", SWITCHING), batch_sizes=(1, 2), requests=4)
    cells = workloads(prompts, settings, lambda text: [ord(c) for c in text])
    assert [(c.kind, c.batch_size, len(c.prompts)) for c in cells] == [
        ("prose", 1, 4), ("prose", 2, 4), (SWITCHING, 1, 8), (SWITCHING, 2, 8)]
    assert cells[2].prompts == ["p0", "p1", "p2", "p0", "r0", "r1", "r0", "r1"]
    assert cells[0].ids[0] == [ord("p"), ord("0")]
    with pytest.raises(BenchError, match="code"):
        check_kinds(prompts, ["code"])
    with pytest.raises(BenchError, match=SWITCHING):
        check_kinds(prompts[:3], [SWITCHING])


def test_plan_picks_the_smallest_drafters_best_window_and_the_best_two_level() -> None:
    bench = FakeBench()
    screened = [Screened(["s", "t"], 2, 30.0), Screened(["s", "t"], 3, 40.0), Screened(["m", "t"], 2, 50.0)]
    plan = bench.plan(screened)
    assert plan == {TMO: ServiceConfig(("t",), 0), SSD_SMALLEST: ServiceConfig(("s", "t"), 3),
                    SSD_TUNED: ServiceConfig(("m", "t"), 2), THREE_LEVEL: ServiceConfig(("s", "m", "t"), 4),
                    LOOKUP_CHAIN: ServiceConfig(("lookup", "t"), 8),
                    LOOKUP_THREE_LEVEL: ServiceConfig(("lookup", "s", "t"), 8), ADAPTIVE: ServiceConfig(None, 0)}


def test_a_cell_screens_then_runs_interleaved_rounds_and_checks_every_run() -> None:
    bench = FakeBench()
    w = workloads([Prompt("code", "a"), Prompt("code", "b")], bench.settings, lambda t: [1, 2])[0]
    bench.progress.start(bench.planned_waves(w))
    cell, mismatches = bench.cell(w, 0)
    assert mismatches == []
    assert [s.window for s in cell.screening] == [2, 3, 2, 3]
    labels = [e.label for e in cell.entries]
    assert labels == [TMO, SSD_SMALLEST, SSD_TUNED, THREE_LEVEL, LOOKUP_CHAIN, LOOKUP_THREE_LEVEL, ADAPTIVE,
                      engine_label(TMO),
                      engine_label(SSD_TUNED), engine_label(THREE_LEVEL), HF_TARGET, "hf-assisted:s",
                      "hf-assisted:m", HF_PROMPT_LOOKUP]
    assert all(len(e.tokens_per_s.runs) == 2 for e in cell.entries)
    assert cell.entry(SSD_TUNED).chain == ["m", "t"] and cell.entry(SSD_TUNED).window == 2
    assert cell.entry(HF_TARGET).agrees_with_tmo == 2
    assert cell.entry(TMO).breakdown is None            # the fake stats carry no breakdown: unavailable
    # warm-up + 4 screenings + 2 rounds of 7 services configurations, 3 engine rows and 4 peers
    assert len(bench.calls) == 1 + 4 + 2 * 14
    first_round, second_round = bench.calls[5:19], bench.calls[19:]
    assert set(map(str, first_round)) == set(map(str, second_round)) and first_round != second_round  # shuffled
    assert bench.progress.done == bench.progress.total


def test_a_batched_cell_runs_off_adaptive_against_the_fastest_static_of_the_rounds() -> None:
    bench = FakeBench(batch_sizes=(2,))
    w = workloads([Prompt("code", "a"), Prompt("code", "b")], bench.settings, lambda t: [1, 2])[0]
    bench.progress.start(bench.planned_waves(w))
    cell, mismatches = bench.cell(w, 0)
    assert mismatches == []
    r = cell.runoff
    assert r.best == SSD_TUNED                                            # m,t W2: the fastest static
    adaptive, best = ServiceConfig(None, 0), ServiceConfig(("m", "t"), 2)
    rounds = bench.settings.runoff_rounds
    assert bench.calls[-2 * rounds:] == [adaptive, best, best, adaptive] * (rounds // 2)   # alternating
    assert r.adaptive.runs == [10.0] * rounds and r.static.runs == [50.0] * rounds
    assert r.ratio == pytest.approx(0.2) and r.rounds_ratio == pytest.approx(0.2) and r.se == 0.0
    assert bench.progress.done == bench.progress.total
    # a run-off run that differs from TMO is found like any run
    bench = FakeBench(batch_sizes=(2,), wrong=adaptive)
    _, mismatches = bench.cell(w, 0)
    assert sum(m.label == f"run-off {ADAPTIVE}" for m in mismatches) == rounds
    # none at batch 1, none when asked for none
    one = FakeBench()
    w1 = workloads([Prompt("code", "a"), Prompt("code", "b")], one.settings, lambda t: [1, 2])[0]
    assert one.cell(w1, 0)[0].runoff is None and one.runoff_waves(w1) == 0
    bench = FakeBench(batch_sizes=(2,))
    bench.settings = dataclasses.replace(bench.settings, runoff_rounds=0)
    assert bench.cell(w, 0)[0].runoff is None
    assert bench.calls.count(adaptive) == 1 + bench.settings.rounds     # the warm-up and the rounds alone


def test_a_services_configuration_that_differs_from_tmo_is_reported() -> None:
    bench = FakeBench(wrong=ServiceConfig(("s", "m", "t"), 4))
    w = workloads([Prompt("code", "a"), Prompt("code", "b")], bench.settings, lambda t: [1, 2])[0]
    _, mismatches = bench.cell(w, 0)
    assert mismatches and {(m.label, m.prompt_index, m.position) for m in mismatches} == {(THREE_LEVEL, 1, 1)}


def test_ssd_smallest_and_tuned_on_one_configuration_are_measured_once() -> None:
    bench = FakeBench()
    bench.drafters, bench.models = ["m"], [ModelRow("m", 5, "drafter"), ModelRow("t", 29, "target")]
    w = workloads([Prompt("code", "a"), Prompt("code", "b")], bench.settings, lambda t: [1, 2])[0]
    bench.progress.start(bench.planned_waves(w))
    cell, _ = bench.cell(w, 0)
    assert cell.entry(SSD_TUNED).same_as == SSD_SMALLEST
    assert bench.calls.count(ServiceConfig(("m", "t"), 2)) == 1 + 2     # screening, then one per round
    assert bench.progress.done == bench.progress.total
    # a mismatch of the shared configuration is reported once per run, under the label that measured it
    bench = FakeBench(wrong=ServiceConfig(("m", "t"), 2))
    bench.drafters, bench.models = ["m"], [ModelRow("m", 5, "drafter"), ModelRow("t", 29, "target")]
    _, mismatches = bench.cell(w, 0)
    assert sorted(m.label for m in mismatches) == [SSD_SMALLEST, SSD_SMALLEST, "screening m,t W2"]


# -- end to end (slow) ----------------------------------------------------------------------------


@pytest.mark.slow
def test_bench_end_to_end_through_a_local_cluster() -> None:
    from specrouter.report.bench import run_bench
    from specrouter.report.workloads import builtin_prompts

    settings = BenchSettings(kinds=("code",), batch_sizes=(1,), requests=2, max_new_tokens=8, rounds=1, windows=(2,))
    report = run_bench(DEMO_POOL, settings, builtin_prompts(2))
    assert [(c.kind, c.batch_size, c.requests) for c in report.cells] == [("code", 1, 2)]
    cell = report.cells[0]
    labels = {e.label for e in cell.entries}
    assert {TMO, SSD_SMALLEST, SSD_TUNED, THREE_LEVEL, LOOKUP_CHAIN, LOOKUP_THREE_LEVEL, ADAPTIVE, HF_TARGET,
            HF_PROMPT_LOOKUP} <= labels
    assert cell.entry(LOOKUP_CHAIN).chain[0] == "lookup"
    assert cell.entry(LOOKUP_THREE_LEVEL).chain == ["lookup", report.models[0].name, report.models[-1].name]
    assert {assisted_label(m.name) for m in report.models if m.role != "target"} <= labels
    for twin in (TMO, SSD_TUNED, THREE_LEVEL):   # the engine in process beside each, on its chain and window
        engine = cell.entry(engine_label(twin))
        assert (engine.chain, engine.window) == (cell.entry(twin).chain, cell.entry(twin).window)
        assert cell.entry(twin).kept is not None
    assert any(c.name.startswith("services keep >= 0.9x") and c.status in (PASS, FAIL) for c in report.checks)
    assert len(cell.screening) == len(report.models) - 1                # every two-level chain at window 2
    assert report.mismatches == []
    assert report.checks[-1].status == PASS
    assert all(e.tokens_per_s.median > 0 and e.ratio is not None for e in cell.entries)
    for e in cell.entries:
        if e.path == SERVICES and not e.same_as:
            b = e.breakdown
            assert b is not None, f"{e.label}: the results carry no stats.breakdown"
            assert b.cycles > 0 and set(b.forward_ms) <= {m.name for m in report.models} | {"lookup"}
            assert b.forward_ms[[m.name for m in report.models if m.role == "target"][0]] > 0
    assert cell.entry(HF_TARGET).agrees_with_tmo is not None
    json.dumps(report_json(report))
    assert "| code | 1 | 2 |" in format_markdown(report)


def test_progress_without_a_terminal_prints_a_line_per_phase() -> None:
    import io

    from rich.console import Console

    from specrouter.report.bench import RichProgress

    out = io.StringIO()
    with RichProgress(Console(file=out, force_terminal=False, width=100)) as progress:
        progress.start(10)
        progress.advance(1, "code B=1 warm-up")
        progress.advance(2, "code B=1 round 1/3")
        progress.advance(2, "code B=1 round 1/3")
        progress.advance(5, "code B=1 round 2/3")
    lines = [line for line in out.getvalue().splitlines() if "waves" in line]
    assert [line.split(":")[0] for line in lines] == ["code B=1 warm-up", "code B=1 round 1/3", "code B=1 round 2/3"]
    assert "3/10 waves" in lines[1] and "10/10 waves" in lines[2]


@pytest.fixture(scope="module")
def tiny_pool(tmp_path_factory) -> Path:
    return save_tiny_pool(tmp_path_factory.mktemp("tiny-pool"))


def test_the_bench_starts_its_cluster_on_the_device_and_dtype_of_its_peers(tiny_pool: Path, monkeypatch) -> None:
    import specrouter.launcher
    from specrouter.report.bench import run_bench
    from specrouter.report.workloads import builtin_prompts

    started = {}

    class Stop(Exception):
        pass

    def cluster(pool_dir, log_dir, **kwargs):
        started.update(kwargs)
        raise Stop

    monkeypatch.setattr(specrouter.launcher, "LocalCluster", cluster)
    settings = BenchSettings(kinds=("code",), batch_sizes=(1,), requests=2, max_new_tokens=4, rounds=1,
                             windows=(2,), device="cpu", dtype="bfloat16")
    with pytest.raises(Stop):
        run_bench(tiny_pool, settings, builtin_prompts(2))
    assert (started["device"], started["dtype"]) == ("cpu", "bfloat16")


def test_the_cli_refuses_models_in_router_with_a_given_router() -> None:
    """`--models-in-router` shapes the cluster the bench starts; with `--router` it starts none, so the two
    together are refused before anything loads."""
    run = subprocess.run([sys.executable, "-m", "specrouter.cli", "bench", "--models-in-router", "--router",
                          "127.0.0.1:1"], capture_output=True, text=True, timeout=120)
    assert run.returncode != 0 and "INVALID_ARGUMENT" in run.stderr
    assert "--models-in-router applies when the bench starts its own services" in run.stderr
    assert "Traceback" not in run.stderr
