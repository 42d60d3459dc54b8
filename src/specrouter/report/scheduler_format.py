"""The scheduler report as text: the machine, one block per run, then acceptance, decision costs, rank
correlation, checks.

A run's block gives target-only, the best static and adaptive of the screening, then the run-off (where
the time went, adaptive wave by wave, planning, adaptive's choices), the held-out best static, adaptive's
choices in the screening and the five fastest statics with their predicted and measured T_eff.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from specrouter.report.scheduler_results import Choice, Report, RowCycles, Runoff, RunResult

STATICS_SHOWN = 5   # fastest statics listed per run


def format_report(report: Report | dict) -> str:
    """The report (a record, or its JSON as `report.json` holds it) as text."""
    if not isinstance(report, Report):
        report = Report.from_json(report)
    lines = [report.machine] if report.machine else []
    for r in report.runs:
        lines += _run_lines(r)
    lines.append("acceptance (adaptive cycles): pair, mode, predicted, realized, checks")
    for a in report.acceptance:
        pred = "n/a" if a.predicted is None else f"{a.predicted:.3f}"
        lines.append(f"  {a.pair[0]} -> {a.pair[1]:<14} {a.mode:<8} {pred}  {a.realized:.3f}  "
                     f"{a.checked:.0f}{'' if a.in_use else ' (not in use)'}")
    d = report.decision
    lines.append(f"decision {d.decision_us:.1f} us per cycle of {d.cycle_ms:.2f} ms "
                 f"({100 * (d.share_of_cycle or 0):.2f}%); {d.explorations} explorations and "
                 f"{d.switches} switches in {d.decisions} decisions")
    if d.planning_ms_per_cycle is not None:
        lines.append(f"planning {d.plans} rankings, {d.planning_ms:.0f} ms: {d.planning_ms_per_cycle:.2f} ms per "
                     f"cycle, {100 * d.planning_share_of_time:.2f}% of the router's wall time"
                     + (f"; {d.stand_ins} asked before they were planned" if d.stand_ins is not None else ""))
    rc = report.rank_correlation
    if rc.mean is not None:
        lines.append(f"rank correlation: mean {rc.mean:.3f}, min {rc.min:.3f}")
    for name, ok in report.checks.items():
        lines.append(f"{'n/a ' if ok is None else 'PASS' if ok else 'FAIL'}  {name}")
    return "\n".join(lines)


def _run_lines(r: RunResult) -> list[str]:
    best, a = r.best_static, r.adaptive
    lines = [f"{r.kind}  batch {r.batch_size}  ({r.requests} requests)",
             f"  target-only {r.target_only_tokens_per_s:8.1f} tok/s",
             f"  best static {best.tokens_per_s:8.1f} tok/s  {','.join(best.chain)} W{best.window}",
             f"  adaptive    {r.adaptive_tokens_per_s:8.1f} tok/s  = {r.adaptive_over_best_static:.3f} x best"
             f" static, {r.adaptive_over_target_only:.3f} x target-only;"
             f" T_eff predicted {_ms(a.predicted_t_eff_ms)} measured {_ms(a.measured_t_eff_ms)}"]
    if r.runoff:
        lines += _runoff_lines(r.runoff, r.batch_size)
    if r.adaptive_over_held_out_best_static is not None:
        se = r.adaptive_over_held_out_best_static_se
        lines.append(f"  held-out best static {r.held_out_best_static_tokens_per_s:8.1f} tok/s (picked on the other "
                     f"waves): adaptive = {r.adaptive_over_held_out_best_static:.3f} x"
                     + (f", standard error {se:.3f}" if se is not None else "")
                     + " (the screening's pick; the run-off is checked)")
    _print_choices(lines, "  adaptive chose", a.per_config)
    rho = r.rank_correlation
    lines.append(f"  rank correlation (predicted vs measured T_eff, {len(r.static)} static): "
                 f"{'n/a' if rho is None else f'{rho:.3f}'}")
    for x in sorted(r.static, key=lambda x: -x.tokens_per_s)[:STATICS_SHOWN]:
        lines.append(f"    {','.join(x.chain):<36} W{x.window}  {x.tokens_per_s:8.1f} tok/s  "
                     f"T_eff predicted {_ms(x.predicted_t_eff_ms)} measured {_ms(x.measured_t_eff_ms)}")
    return lines


def _runoff_lines(ro: Runoff, batch: int) -> list[str]:
    rb = ro.best_static
    lines = [f"  run-off ({ro.passes} more passes of adaptive, target-only and the {len(ro.static) - 1}"
             f" fastest statics above): adaptive {ro.adaptive_tokens_per_s:.1f} tok/s = "
             f"{ro.adaptive_over_best_static:.3f} x best static ({','.join(rb.chain)} W{rb.window} "
             f"{rb.tokens_per_s:.1f}), {ro.adaptive_over_target_only:.3f} x target-only"]
    if ro.adaptive_over_best_static_se is not None:
        lines.append(f"    standard error of adaptive over the best static, from its waves' ratios: "
                     f"{ro.adaptive_over_best_static_se:.3f}")
    best = next(x for x in ro.static if (x.chain, x.window) == (rb.chain, rb.window))
    if ro.adaptive_measured_t_eff_ms and best.measured_t_eff_ms:
        lines.append(f"    in the router's cycles: adaptive {_ms(ro.adaptive_measured_t_eff_ms)} per token, "
                     f"best static {_ms(best.measured_t_eff_ms)}; outside them (prefill, admission, waits): "
                     f"{_ms(ro.adaptive_outside_cycles_ms_per_token)} and "
                     f"{_ms(best.outside_cycles_ms_per_token)} per token")
    same = same_cycles(ro.adaptive_cycles_by_rows, best.cycles_by_rows, batch)
    if same:
        lines.append(f"    at the best static's own configuration and {batch} rows: adaptive "
                     f"{same[0].cycle_ms:.1f} ms a cycle, {same[0].emitted:.2f} tokens a row "
                     f"({same[0].cycles} cycles); the static {same[1].cycle_ms:.1f} ms, "
                     f"{same[1].emitted:.2f} ({same[1].cycles})")
    waves = [w.tokens_per_s / max(w.statics_tokens_per_s) for w in ro.adaptive_waves if w.statics_tokens_per_s]
    if waves:
        lines.append("    wave by wave, adaptive over the fastest static in the same wave: "
                     + " ".join(f"{x:.2f}" for x in waves))
    planning = ro.planning_ms_per_s
    if planning:
        others = [v for k, v in planning.items() if k != "adaptive"]
        lines.append(f"    planning: {planning.get('adaptive', 0):.1f} ms per second of adaptive's runs, "
                     f"{max(others, default=0):.1f} at most in the others'")
    _print_choices(lines, "    adaptive chose in the run-off", ro.adaptive_per_config)
    return lines


def _print_choices(lines: list[str], title: str, per_config: Mapping[str, Choice]) -> None:
    lines.append(f"{title} (cycles: cycle ms and tokens emitted, predicted -> measured):")
    indent = " " * (len(title) - len(title.lstrip()) + 2)
    for label, c in sorted(per_config.items(), key=lambda kv: -kv[1].cycles):
        lines.append(f"{indent}{label:<40} {c.cycles:4d}: {c.predicted_cycle_ms:6.1f} -> "
                     f"{c.measured_cycle_ms:6.1f} ms, {c.predicted_emitted:.2f} -> {c.measured_emitted:.2f}")


def same_cycles(adaptive: Sequence[RowCycles], static: Sequence[RowCycles],
                rows: int) -> tuple[RowCycles, RowCycles] | None:
    """Adaptive's and a static's cycles at the static's configuration with `rows` rows, if both ran some."""
    static_cycles = next((c for c in static if c.rows == rows), None)
    if static_cycles is None:
        return None
    same = next((c for c in adaptive if c.rows == rows and c.config == static_cycles.config), None)
    return None if same is None else (same, static_cycles)


def _ms(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.2f} ms"
