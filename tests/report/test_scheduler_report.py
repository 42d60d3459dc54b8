"""The report's arithmetic: rank correlation, waves, the pass/fail checks."""

from __future__ import annotations

import math
import statistics
import subprocess
import sys

import pytest

from specrouter.report.scheduler_checks import checks as _checks
from specrouter.report.scheduler_format import same_cycles as _same_cycles
from specrouter.report.scheduler_results import Acceptance, Choice, RowCycles, RunOutcome, Standing
from specrouter.report.scheduler_runs import ReportSettings
from specrouter.report.scheduler_runs import requests_in_waves as _requests
from specrouter.report.scheduler_stats import LedgerSum, Measured
from specrouter.report.scheduler_stats import cycles_by_rows as _by_rows
from specrouter.report.scheduler_stats import held_out_best, held_out_picks
from specrouter.report.scheduler_stats import outside_ms as _outside_ms
from specrouter.report.scheduler_stats import spearman, wave_ratio_se
from specrouter.report.scheduler_stats import wave_table as _waves


def test_spearman_rank_correlation() -> None:
    assert spearman([1, 2, 3, 4], [10, 20, 30, 40]) == pytest.approx(1.0)
    assert spearman([1, 2, 3, 4], [9, 7, 5, 1]) == pytest.approx(-1.0)
    assert spearman([1, 2, 3], [1, 3, 2]) == pytest.approx(0.5)
    assert spearman([1, 1, 2], [1, 2, 3]) == pytest.approx(math.sqrt(3) / 2)   # ties take the average rank
    assert math.isnan(spearman([1, 1], [1, 2]))


def test_requests_come_in_whole_waves() -> None:
    assert [_requests(8, b) for b in (1, 3, 4, 16)] == [8, 9, 8, 32]


def test_the_runoff_takes_more_passes_where_the_batch_size_leaves_few_waves() -> None:
    s = ReportSettings(runoff_passes=2, runoff_waves=8)
    # 8 requests are 8 waves at batch 1 and 2 at batch 4 and 16 (32 requests there: two waves at least);
    # 3 waves take 3 passes (9 waves), 1 wave 8, and 16 waves the 2 asked for
    assert [s.runoff_passes_for(w) for w in (8, 2, 3, 1, 16)] == [2, 4, 3, 8, 2]
    assert ReportSettings(runoff_passes=0, runoff_waves=8).runoff_passes_for(2) == 0   # no run-off
    assert ReportSettings(runoff_passes=2, runoff_waves=0).runoff_passes_for(2) == 2   # passes as asked


def test_the_switching_run_off_takes_its_own_passes_at_least() -> None:
    s = ReportSettings(runoff_passes=2, runoff_waves=8, switching_runoff_passes=8)
    # 16 waves (8 requests of each kind at batch 1): 2 passes for a plain run, 8 for a switching one
    assert s.runoff_passes_for(16) == 2 and s.runoff_passes_for(16, switching=True) == 8
    assert s.runoff_passes_for(1, switching=True) == 8   # more than the switching minimum is kept
    assert ReportSettings(runoff_passes=2, runoff_waves=16, switching_runoff_passes=1).runoff_passes_for(
        1, switching=True) == 16
    assert ReportSettings(runoff_passes=0, switching_runoff_passes=8).runoff_passes_for(16, switching=True) == 0


def test_the_wave_ratio_standard_error_is_that_of_the_mean_log_ratio() -> None:
    # b runs every wave at 10 tokens/s; a at 11, 9, 12 and 10 (tokens and seconds vary, the rates count)
    a = [(22, 2.0), (9, 1.0), (36, 3.0), (10, 1.0)]
    b = [(10, 1.0), (20, 2.0), (10, 1.0), (30, 3.0)]
    logs = [math.log(x / 10) for x in (11, 9, 12, 10)]
    assert wave_ratio_se(a, b) == pytest.approx(statistics.stdev(logs) / 2)
    assert wave_ratio_se(a[:1], b[:1]) is None and wave_ratio_se([], []) is None
    assert wave_ratio_se(a, a) == 0.0


def test_held_out_best_static_is_picked_without_the_wave_it_is_measured_on() -> None:
    steady, better = [(10, 1.0)] * 4, [(12, 1.0)] * 4
    assert held_out_best([steady, better]) == pytest.approx(12.0)
    # one lucky wave makes `lucky` the plain best (64 tokens in 4 s); picked on the other waves it is
    # chosen for waves 2-4 only, where it makes 8 a wave, and `steady` is chosen for wave 1
    lucky = [(40, 1.0), (8, 1.0), (8, 1.0), (8, 1.0)]
    assert held_out_best([steady, lucky]) == pytest.approx((10 + 8 + 8 + 8) / 4)
    assert held_out_best([[(10, 1.0)], [(12, 1.0)]]) is None   # one wave: nothing to hold out
    assert held_out_picks([steady, lucky]) == [(10, 1.0), (8, 1.0), (8, 1.0), (8, 1.0)]


def test_the_held_out_pick_is_reported_but_not_checked() -> None:
    """With two waves per configuration (batch 4) the held-out figure rests on one wave a unit: it is
    reported with its standard error, and the checks judge the run-off, which measures the screening's
    picks afresh."""
    run = _run("tables", 0.99, 1.5, False)   # a held-out ratio of 0.80 is no part of what the checks judge
    checks = _checks([run], [])
    assert "adaptive_within_5pct_of_held_out_best_static" not in checks
    assert checks["adaptive_within_5pct_of_best_static"] is True


def _run(kind: str, over_best: float, over_target: float, beats: bool, runoff: Standing | None = None) -> RunOutcome:
    return RunOutcome(kind, Standing(over_best, over_target, beats), runoff)


def _pair(predicted: float, realized: float, in_use: bool) -> Acceptance:
    return Acceptance(("a", "b"), "greedy", realized, predicted, 0.0, 0.0, 0.0, 0.0, in_use)


def test_checks_apply_the_stated_thresholds() -> None:
    runs = [_run("code", 0.951, 1.5, False), _run("prose", 1.01, 0.971, True), _run("switching:a>b", 1.02, 1.4, True)]
    acceptance = [_pair(predicted=0.80, realized=0.849, in_use=True),
                  _pair(predicted=0.9, realized=0.5, in_use=False)]   # not in use: not judged
    assert all(_checks(runs, acceptance).values())
    worse = _checks([_run("code", 0.949, 0.969, False), _run("switching:a>b", 1.2, 2.0, False)],
                    [_pair(predicted=0.80, realized=0.851, in_use=True)])
    assert not any(worse.values())


def test_a_check_with_nothing_to_judge_is_not_run() -> None:
    """Without a switching run (--switching '') the switching check is None, not a failure, and prints as
    n/a; the same for acceptance when no pair is in use, and for the others without a plain run."""
    checks = _checks([_run("code", 1.0, 1.5, True)], [])
    assert checks["switching_adaptive_beats_every_static"] is None
    assert checks["acceptance_within_0.05"] is None
    assert checks["adaptive_within_5pct_of_best_static"] is True
    only_switching = _checks([_run("switching:a>b", 1.02, 1.4, True)], [])
    assert only_switching["adaptive_within_5pct_of_best_static"] is None
    assert only_switching["switching_adaptive_beats_every_static"] is True


def test_checks_judge_a_run_by_its_runoff_where_it_has_one() -> None:
    lucky_screening = _run("code", 0.90, 0.96, False,     # fails on the screening's figures ...
                           runoff=Standing(0.97, 1.2, True))   # ... passes on the run-off's
    checks = _checks([lucky_screening], [])
    assert checks["adaptive_within_5pct_of_best_static"] and checks["adaptive_at_most_3pct_slower_than_target_only"]
    lost_runoff = Standing(adaptive_over_best_static=0.94, adaptive_over_target_only=0.96,
                           adaptive_beats_every_static=False)
    lost = _run("code", 1.0, 1.5, True, runoff=lost_runoff)
    switching = _run("switching:a>b", 1.1, 1.5, True, runoff=lost_runoff)
    checks = _checks([lost, switching], [])
    assert not checks["adaptive_within_5pct_of_best_static"]
    assert not checks["adaptive_at_most_3pct_slower_than_target_only"]
    assert not checks["switching_adaptive_beats_every_static"]


def test_time_outside_the_cycles_is_the_clients_less_the_routers() -> None:
    """Two waves of batch 2: 96 tokens in 1.5 s at the client; the router's cycles took 1,000 ms and
    emitted 40 tokens per row (a cycle serves both rows), so 25 ms per token of a row, 12.5 per token."""
    m = Measured(waves=[(48, 0.7), (48, 0.8)], total=LedgerSum(cycle_ms=1000.0, emitted=40.0))
    assert _outside_ms(m, 2) == pytest.approx(1500 / 96 - 12.5)
    assert _outside_ms(Measured(), 1) is None


def test_cycles_are_split_by_the_rows_they_ran() -> None:
    """A wave of 4 rows at window 6: 10 cycles of all four (700 ms, 5 tokens a row each), then 2 of the
    last row (90 ms, 4 tokens); and 1 cycle at window 3 of one row. Longest rows first within a config."""
    m = Measured()
    m.by_rows[("a,b W6", 4)] = LedgerSum(10, 700.0, 50.0)
    m.by_rows[("a,b W6", 1)] = LedgerSum(2, 90.0, 8.0)
    m.by_rows[("a,b W3", 1)] = LedgerSum(1, 40.0, 4.0)
    m.by_rows[("a,b W8", 2)] = LedgerSum(0, 0.0, 0.0)   # nothing ran: left out
    assert _by_rows(m) == [
        RowCycles(config="a,b W3", rows=1, cycles=1, cycle_ms=40.0, emitted=4.0, ms_per_token=10.0),
        RowCycles(config="a,b W6", rows=4, cycles=10, cycle_ms=70.0, emitted=5.0, ms_per_token=14.0),
        RowCycles(config="a,b W6", rows=1, cycles=2, cycle_ms=45.0, emitted=4.0, ms_per_token=11.25),
    ]


def test_the_cli_refuses_a_report_with_nothing_to_run() -> None:
    """No batch sizes is the switching run alone; without a switching run either, nothing would run."""
    run = subprocess.run([sys.executable, "-m", "specrouter.cli", "scheduler-report", "--batch-sizes", "",
                          "--switching", ""], capture_output=True, text=True, timeout=120)
    assert run.returncode != 0 and "INVALID_ARGUMENT" in run.stderr and "--batch-sizes" in run.stderr
    assert "Traceback" not in run.stderr


@pytest.mark.parametrize("args,words", [
    (["--windows", "2,99"], "--windows takes integers from 1 to 16, got 99"),
    (["--windows", "0"], "--windows takes integers from 1 to 16, got 0"),
    (["--requests", "0"], "--requests"),
    (["--batch-sizes", "1,-4"], "--batch-sizes takes integers >= 1, got -4"),
    (["--models-in-router", "--router", "127.0.0.1:1"], "--models-in-router applies when the report starts its own services"),
])
def test_the_cli_refuses_bad_numbers_before_starting_anything(args, words) -> None:
    """A window the router would refuse is refused before the cluster starts, not after (nor as a
    traceback); zero requests is an error, not two waves."""
    run = subprocess.run([sys.executable, "-m", "specrouter.cli", "scheduler-report", *args],
                         capture_output=True, text=True, timeout=120)
    assert run.returncode != 0 and "INVALID_ARGUMENT" in run.stderr and words in run.stderr
    assert "Traceback" not in run.stderr and "cluster" not in run.stderr


def test_adaptive_is_shown_wave_by_wave_beside_the_statics() -> None:
    """Two passes of two waves: adaptive's tokens per second in each, the statics' in the same wave, and
    what adaptive chose there; `wave` counts within the pass."""
    adaptive = Measured(waves=[(96, 1.0), (48, 1.0), (96, 2.0), (48, 0.5)],
                        wave_choices=[{"a,b W6": LedgerSum(10, 500.0, 40.0, 480.0, 45.0)},
                                      {"b": LedgerSum(48, 960.0, 48.0, 900.0, 48.0)},
                                      {"a,b W6": LedgerSum(12, 600.0, 48.0, 560.0, 50.0)},
                                      {"a,b W2": LedgerSum(4, 100.0, 8.0, 96.0, 9.0)}])
    static = Measured(waves=[(96, 1.2), (48, 0.8), (96, 1.0), (48, 1.0)])
    waves = _waves(adaptive, [static], 2)
    assert [w.wave for w in waves] == [0, 1, 0, 1]
    assert [w.tokens_per_s for w in waves] == [96.0, 48.0, 48.0, 96.0]
    assert [w.statics_tokens_per_s for w in waves] == [[80.0], [60.0], [96.0], [48.0]]
    assert waves[0].choices == {"a,b W6": Choice(cycles=10, predicted_cycle_ms=48.0, measured_cycle_ms=50.0,
                                                 predicted_emitted=4.5, measured_emitted=4.0)}
    assert list(waves[1].choices) == ["b"] and list(waves[3].choices) == ["a,b W2"]


def test_adaptive_is_compared_with_a_static_at_its_configuration_and_rows() -> None:
    def cycles(config: str, rows: int, cycle_ms: float) -> RowCycles:
        return RowCycles(config, rows, cycles=1, cycle_ms=cycle_ms, emitted=1.0, ms_per_token=cycle_ms)

    static = [cycles("a,b W6", 4, 70.0), cycles("a,b W6", 1, 45.0)]
    adaptive = [cycles("a,b W8", 4, 80.0), cycles("a,b W6", 1, 50.0), cycles("a,b W6", 4, 72.0)]
    assert _same_cycles(adaptive, static, 4) == (adaptive[2], static[0])
    assert _same_cycles(adaptive, static, 1) == (adaptive[1], static[1])
    assert _same_cycles(adaptive, static, 2) is None          # the static ran no cycle of 2 rows
    assert _same_cycles(adaptive[:1], static, 4) is None      # adaptive never ran the static's configuration
