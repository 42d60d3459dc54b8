"""The scheduler report's chart: tokens/s of every chain per (kind, batch size), and predicted vs measured T_eff.

One panel per run (rows: kinds, columns: batch sizes) with a bar per static (chain, window), the target
alone and the adaptive scheduler, fastest at the top; then one panel comparing the cost model's predicted
effective time per token with the measured one over every static configuration.

Drawn on a bare `matplotlib.figure.Figure` (its PNG canvas is Agg), so pyplot's global state and the
caller's backend are left alone.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable
from pathlib import Path

from matplotlib.figure import Figure
from matplotlib.patches import Patch
from matplotlib.ticker import FuncFormatter

PANEL_WIDTH_IN = 16        # with DPI: ~1600 px wide...
ROW_HEIGHT_IN = 4          # ...and ~400 px a row
DPI = 100
STATIC_COLOUR = "#9aaabb"
BEST_STATIC_COLOUR = "#4a6a8a"
TARGET_COLOUR = "#d08c2c"
ADAPTIVE_COLOUR = "#2e9a5c"
KIND_COLOURS = ["#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f"]
NAME_SEPARATORS = "-_/."


def write_chart(report: dict, path: Path) -> Path:
    """Draws `report` (the scheduler report's JSON) as a PNG at `path`; returns the path."""
    runs = report.get("runs") or []
    if not runs:
        raise ValueError("the report has no runs to draw; run the scheduler report on at least one workload")
    kinds = list(dict.fromkeys(r["kind"] for r in runs))
    batch_sizes = sorted({r["batch_size"] for r in runs})
    by_cell = {(r["kind"], r["batch_size"]): r for r in runs}
    short = name_shortener([m for r in runs for s in r["static"] for m in s["chain"]]
                           + [m for r in runs for m in r["best_static"]["chain"]])

    cols = len(batch_sizes)
    fig = Figure(figsize=(PANEL_WIDTH_IN, ROW_HEIGHT_IN * (len(kinds) + 1)), dpi=DPI, layout="constrained")
    grid = fig.add_gridspec(len(kinds) + 1, cols)
    for row, kind in enumerate(kinds):
        for col, batch in enumerate(batch_sizes):
            ax = fig.add_subplot(grid[row, col])
            run = by_cell.get((kind, batch))
            if run is None:
                _empty(ax, f"{kind}, batch {batch}: not run")
            else:
                _throughput_panel(ax, run, short)
    _teff_panel(fig.add_subplot(grid[len(kinds), 0]), runs, kinds, report.get("rank_correlation") or {})
    _legend(fig)
    fig.suptitle("Scheduler report: decode throughput per workload and batch size", fontsize=14)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, format="png")
    return path


def config_label(chain: list[str], window: int, short: Callable[[str], str] = str) -> str:
    """`1m,29m W3`: the chain's models, shortened, and the draft window."""
    return f"{','.join(short(m) for m in chain)} W{window}"


def name_shortener(names: list[str]) -> Callable[[str], str]:
    """Drops the prefix that every model name shares, up to its last separator (`stdlib-1m` -> `1m`)."""
    prefix = os.path.commonprefix(sorted(set(names))) if names else ""
    cut = max(prefix.rfind(c) for c in NAME_SEPARATORS) + 1 if prefix else 0
    return lambda name: name[cut:] or name


def _throughput_panel(ax, run: dict, short) -> None:
    best = run["best_static"]
    best_label = config_label(best["chain"], best["window"], short)
    bars = [(config_label(s["chain"], s["window"], short), s["tokens_per_s"], STATIC_COLOUR) for s in run["static"]
            if len(s["chain"]) > 1]   # target-only is among the statics too: one bar of its own, below
    bars = [(label, v, BEST_STATIC_COLOUR if label == best_label else colour) for label, v, colour in bars]
    bars.append(("target only", run["target_only_tokens_per_s"], TARGET_COLOUR))
    bars.append(("adaptive", run["adaptive_tokens_per_s"], ADAPTIVE_COLOUR))
    bars.sort(key=lambda bar: bar[1])  # barh draws bottom-up: the fastest ends on top
    labels, values, colours = zip(*bars)
    ax.barh(range(len(bars)), values, color=colours)
    ax.set_yticks(range(len(bars)), labels, fontsize=max(5, min(9, 220 / len(bars))))
    ax.set_xlabel("tokens/s")
    gain = run["adaptive_tokens_per_s"] / best["tokens_per_s"] if best["tokens_per_s"] > 0 else math.nan
    ax.set_title(f"{run['kind']}, batch {run['batch_size']}\nadaptive {gain:.2f}x the best static ({best_label})",
                 fontsize=10)
    ax.grid(axis="x", alpha=0.3)


def _teff_panel(ax, runs: list[dict], kinds: list[str], rank_correlation: dict) -> None:
    missing = 0
    points: dict[str, tuple[list[float], list[float]]] = {}
    for run in runs:
        for s in run["static"]:
            predicted, measured = s.get("predicted_t_eff_ms"), s.get("measured_t_eff_ms")
            if predicted is None or measured is None:
                missing += 1
                continue
            xs, ys = points.setdefault(run["kind"], ([], []))
            xs.append(predicted)
            ys.append(measured)
    ax.set_title("T_eff per static config: predicted vs measured (ms per token)", fontsize=10)
    if not points:
        _empty(ax, f"no predictions ({missing} configs without one)")
        return
    for kind, (xs, ys) in points.items():
        ax.scatter(xs, ys, s=18, alpha=0.8, color=KIND_COLOURS[kinds.index(kind) % len(KIND_COLOURS)], label=kind)
    values = [v for xs, ys in points.values() for v in xs + ys]
    lo, hi = min(values), max(values)
    if lo > 0:
        ax.set_xscale("log")
        ax.set_yscale("log")
        lo, hi = lo / 1.2, hi * 1.2
    ax.plot([lo, hi], [lo, hi], color="black", linewidth=0.8, linestyle="--", label="y = x")
    for axis in (ax.xaxis, ax.yaxis):
        axis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
        axis.set_minor_formatter(FuncFormatter(_minor_label))
        axis.set_tick_params(which="minor", labelsize=7)
    ax.set_xlabel("predicted T_eff (ms)")
    ax.set_ylabel("measured T_eff (ms)")
    ax.legend(fontsize=8, loc="upper left")
    notes = [f"{k}: {v:.2f}" if isinstance(v, float) else f"{k}: {v}" for k, v in rank_correlation.items()
             if isinstance(v, (int, float)) and not isinstance(v, bool)]
    if missing:
        notes.append(f"{missing} configs without a prediction (not shown)")
    if notes:
        ax.text(0.98, 0.02, "\n".join(notes), transform=ax.transAxes, ha="right", va="bottom", fontsize=8)
    ax.grid(alpha=0.3, which="both")


def _minor_label(value: float, _pos) -> str:
    """Labels the 2s and 5s of a log axis (`0.2`, `50`), leaving the other minor ticks bare."""
    if value <= 0:
        return ""
    mantissa = round(value / 10 ** math.floor(math.log10(value)))
    return f"{value:g}" if mantissa in (2, 5) else ""


def _legend(fig: Figure) -> None:
    handles = [Patch(color=STATIC_COLOUR, label="static chain"), Patch(color=BEST_STATIC_COLOUR, label="best static"),
               Patch(color=TARGET_COLOUR, label="target only"), Patch(color=ADAPTIVE_COLOUR, label="adaptive")]
    fig.legend(handles=handles, loc="outside lower center", ncols=4, fontsize=10)


def _empty(ax, message: str) -> None:
    ax.text(0.5, 0.5, message, ha="center", va="center", transform=ax.transAxes)
    ax.set_xticks([])
    ax.set_yticks([])
