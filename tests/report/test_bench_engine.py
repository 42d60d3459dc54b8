"""`specrouter bench`: the rows of SpecRouter's own engine in process beside their services twins (same
chain and window), their outputs checked against TMO's, what the services keep of them and its check;
and the engine's row on tiny random Llamas against transformers' greedy tokens."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from specrouter.report.bench import BenchReport, BenchSettings, ModelRow, workloads
from specrouter.report.bench_format import check_lines, column_labels, format_markdown, report_json, write_chart
from specrouter.report.bench_in_process import InProcessRows, waves
from specrouter.report.bench_results import (ADAPTIVE, ENGINE, FAIL, HF_TARGET, NOT_RUN, PASS,
                                             SERVICES, SSD_TUNED, THREE_LEVEL, TMO, Cell, Mismatch, engine_label,
                                             equality_check, evaluate_checks, keep_check, set_ratios)
from specrouter.report.workloads import Prompt
from tests.report.bench_fakes import ENGINE_SPEED, FakeBench, made_up_cell, save_tiny_pool

KEEP = "services keep >= 0.9x the same chain and window in process"

# -- the rows in a cell, without a cluster ---------------------------------------------------------


def _workload(bench: FakeBench):
    return workloads([Prompt("code", c) for c in "ab"], bench.settings, lambda t: [1, 2])[0]


def test_each_engine_row_runs_its_services_twins_chain_and_window_every_round() -> None:
    bench = FakeBench()
    w = _workload(bench)
    bench.progress.start(bench.planned_waves(w))
    cell, mismatches = bench.cell(w, 0)
    assert mismatches == []
    for twin in (TMO, SSD_TUNED, THREE_LEVEL):
        services, engine = cell.entry(twin), cell.entry(engine_label(twin))
        assert engine.path == ENGINE and services.path == SERVICES
        assert (engine.chain, engine.window) == (services.chain, services.window)
        assert engine.tokens_per_s.runs == [ENGINE_SPEED] * 2                 # one run a round
        assert bench.calls.count((ENGINE, tuple(services.chain), services.window, 1)) == 2
    assert cell.entry(SSD_TUNED).chain == ["m", "t"]                          # the screening's best, W2
    assert bench.progress.done == bench.progress.total


def test_at_batch_two_the_engine_runs_the_prompts_in_waves_of_two_rows() -> None:
    bench = FakeBench(batch_sizes=(2,))
    w = _workload(bench)
    assert (len(w.prompts), w.waves) == (4, 2)
    bench.progress.start(bench.planned_waves(w))
    bench.cell(w, 0)
    engine_calls = [c for c in bench.calls if isinstance(c, tuple)]
    assert len(engine_calls) == 2 * 3 and {c[3] for c in engine_calls} == {2}
    assert bench.progress.done == bench.progress.total                       # the engine's waves are counted
    assert waves([[1], [2], [3]], 2) == [[[1], [2]], [[3]]]


def test_with_one_drafter_the_engine_runs_target_only_and_the_two_level_chain() -> None:
    bench = FakeBench()
    bench.drafters, bench.models = ["m"], [ModelRow("m", 5, "drafter"), ModelRow("t", 29, "target")]
    w = _workload(bench)
    bench.progress.start(bench.planned_waves(w))
    cell, _ = bench.cell(w, 0)
    assert [e.label for e in cell.entries if e.path == ENGINE] == [engine_label(TMO), engine_label(SSD_TUNED)]
    assert bench.progress.done == bench.progress.total


def test_an_engine_row_that_differs_from_tmo_is_reported_every_round() -> None:
    bench = FakeBench(wrong_engine=(("m", "t"), 2))
    _, mismatches = bench.cell(_workload(bench), 0)
    assert mismatches == [Mismatch("code", 1, engine_label(SSD_TUNED), 1, 1)] * 2
    check = equality_check([made_up_cell("code", 1, {})], mismatches)
    assert check.status == FAIL and engine_label(SSD_TUNED) in check.detail


# -- what the services keep, on made-up numbers ----------------------------------------------------


def _cells(three_level_services: float = 150.0) -> list[Cell]:
    code = {HF_TARGET: 100.0, TMO: 90.0, SSD_TUNED: 180.0, THREE_LEVEL: three_level_services, ADAPTIVE: 170.0,
            engine_label(TMO): 100.0, engine_label(SSD_TUNED): 190.0, engine_label(THREE_LEVEL): 200.0}
    batched = {HF_TARGET: 300.0, TMO: 200.0, SSD_TUNED: 250.0, engine_label(TMO): 400.0,
               engine_label(SSD_TUNED): 500.0}
    return [made_up_cell("code", 1, code), made_up_cell("code", 4, batched)]


def test_kept_is_the_services_median_over_the_engine_twins() -> None:
    cells = _cells()
    set_ratios(cells)
    single, batched = cells
    assert single.entry(TMO).kept == pytest.approx(0.9)
    assert single.entry(SSD_TUNED).kept == pytest.approx(180 / 190)
    assert single.entry(THREE_LEVEL).kept == pytest.approx(0.75)
    assert batched.entry(SSD_TUNED).kept == pytest.approx(0.5)
    assert batched.entry(THREE_LEVEL) is None
    # only a services entry with a twin keeps a share; the engine's rows have their ratio like the others
    assert single.entry(ADAPTIVE).kept is None and single.entry(engine_label(TMO)).kept is None
    assert single.entry(engine_label(SSD_TUNED)).ratio == pytest.approx(1.9)


def test_the_keep_check_takes_the_lowest_multi_level_chain_at_batch_one() -> None:
    check = keep_check(_cells(), "code")
    assert check.name == f"{KEEP}, code, batch 1"
    assert check.status == FAIL and check.value == pytest.approx(0.75)             # three-level: 150 / 200
    assert check.detail.startswith(f"{THREE_LEVEL} 150.0 tok/s over {engine_label(THREE_LEVEL)} 200.0")
    passing = keep_check(_cells(three_level_services=196.0), "code")
    assert passing.status == PASS and passing.value == pytest.approx(180 / 190)   # SSD-tuned is now the lowest
    assert SSD_TUNED in passing.detail
    # target-only's share is printed, not checked (0.9 here either way); batch 4 is not checked
    assert keep_check(_cells()[1:], "code").status == NOT_RUN
    assert keep_check(_cells(), "prose").status == NOT_RUN


def test_the_keep_check_is_among_the_benchs_checks_per_batch_one_kind() -> None:
    status = {c.name: c.status for c in evaluate_checks(_cells(three_level_services=196.0), [], ["d"])}
    assert status[f"{KEEP}, code, batch 1"] == PASS
    assert [name for name in status if name.startswith(KEEP)] == [f"{KEEP}, code, batch 1"]


def test_markdown_json_and_chart_carry_the_engine_rows_and_the_share_kept(tmp_path: Path) -> None:
    cells = _cells()
    for c in cells:
        for e in c.entries:
            e.chain, e.window = {TMO: (["t"], 0), SSD_TUNED: (["d", "t"], 3), THREE_LEVEL: (["s", "d", "t"], 4)}.get(
                e.label.removeprefix(f"{ENGINE}:"), (e.chain, e.window))
    set_ratios(cells)
    report = BenchReport(BenchSettings(kinds=("code",)), [ModelRow("d", 10, "drafter"), ModelRow("t", 100, "target")],
                         cells, [], evaluate_checks(cells, [], ["d"]), 12.0)
    text = format_markdown(report)
    assert column_labels(cells)[-3:] == [engine_label(TMO), engine_label(SSD_TUNED), engine_label(THREE_LEVEL)]
    assert "## What the services keep of the engine in process" in text
    assert "| kind | batch | configuration | chain | services tok/s | engine in process tok/s | kept |" in text
    assert "| code | 1 | TMO | t | 90.0 | 100.0 | 0.90x |" in text
    assert "| code | 1 | three-level | s,d,t W4 | 150.0 | 200.0 | 0.75x |" in text
    assert "| code | 4 | SSD-tuned | d,t W3 | 250.0 | 500.0 | 0.50x |" in text
    assert "| code | 1 | engine:SSD-tuned | engine | d,t W3 | 190.0 |" in text             # the details table
    assert "| code | 1 | engine:" not in text.split("## Per-cycle breakdown")[1]         # no breakdown row
    assert f"FAIL  {KEEP}, code, batch 1: three-level 150.0 tok/s" in "\n".join(check_lines(report))
    data = json.loads(json.dumps(report_json(report)))
    kept = {e["label"]: e["kept"] for e in data["cells"][0]["entries"]}
    assert kept[THREE_LEVEL] == pytest.approx(0.75) and kept[engine_label(THREE_LEVEL)] is None
    assert write_chart(report, tmp_path / "bench.png").read_bytes()[:4] == b"\x89PNG"


# -- the engine's row on tiny random Llamas --------------------------------------------------------


@pytest.fixture(scope="module")
def rows(tmp_path_factory) -> InProcessRows:
    return InProcessRows.load(save_tiny_pool(tmp_path_factory.mktemp("tiny-pool")), "cpu", "float32", 10)


def test_the_engines_drive_the_peers_models(rows: InProcessRows) -> None:
    assert all(rows.pool.engines[n].forward.model is rows.peers.models[n] for n in ("t", "d"))


def test_the_engine_row_gives_the_targets_greedy_tokens_at_batch_one_and_in_waves(rows: InProcessRows) -> None:
    texts = ["def fibonacci(n):", "import os\nimport sys\n", "class Stack:\n    def push(self, x):"]
    ids = [rows.peers.encode(t) for t in texts]
    rows.warm(ids[0], ["d"])
    want = rows.peer(HF_TARGET, ids, 1).outputs
    assert all(want)
    for chain, window in ((("t",), 0), (("d", "t"), 3)):
        for batch in (1, 2):
            run = rows.engine(chain, window, ids, batch)
            assert run.outputs == want, (chain, batch)
            assert run.tokens == sum(map(len, want)) and run.seconds > 0
