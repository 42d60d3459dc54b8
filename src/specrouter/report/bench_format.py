"""The bench's report as JSON, Markdown and a PNG chart.

The Markdown holds six tables: speeds (rows: kind x batch; per configuration its median tokens/s and its
ratio to in-process target-only), what the services keep of SpecRouter's engine in process on the same
chain and window, the batched cells' run-off (adaptive against the best static configuration), every
configuration's details (chain, window, range over rounds, agreement with TMO), the screening, and the
per-cycle breakdown of the services configurations; then the checks. The chart
draws, per cell, every configuration's ratio with its range over rounds.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from pathlib import Path

from matplotlib.figure import Figure
from matplotlib.patches import Patch

from specrouter.report.bench import BenchReport, BenchSettings
from specrouter.report.bench_results import (ADAPTIVE, ENGINE, ENGINE_TWINS, HF_ASSISTED, HF_PROMPT_LOOKUP,
                                             HF_TARGET, IN_PROCESS, LOOKUP_CHAIN, LOOKUP_THREE_LEVEL, NOT_RUN, PASS,
                                             SERVICES, SERVICES_KEEP_MIN, SSD_SMALLEST, SSD_TUNED, THREE_LEVEL, TMO,
                                             Breakdown, Cell, Entry, engine_label)
from specrouter.report.chart import name_shortener

SERVICES_ORDER = (TMO, SSD_SMALLEST, SSD_TUNED, THREE_LEVEL, LOOKUP_CHAIN, LOOKUP_THREE_LEVEL, ADAPTIVE)
SCREENING_SHOWN = 5        # fastest screened configurations listed per cell
PANEL_WIDTH_IN, PANEL_HEIGHT_IN, DPI = 6, 3.5, 100
SERVICES_COLOUR, IN_PROCESS_COLOUR, ADAPTIVE_COLOUR, ENGINE_COLOUR = "#4a6a8a", "#d08c2c", "#2e9a5c", "#9a9ab8"


def report_json(report: BenchReport) -> dict:
    """The report as plain JSON types (dataclasses as objects, tuples as lists)."""
    return dataclasses.asdict(report)


def column_labels(cells: Sequence[Cell]) -> list[str]:
    """Configurations in table order: transformers peers first, then the services path, then the engine in
    process (the twins of target-only, SSD-tuned and three-level)."""
    present = list(dict.fromkeys(e.label for c in cells for e in c.entries))
    peers = [HF_TARGET] if HF_TARGET in present else []
    peers += sorted(label for label in present if label.startswith(HF_ASSISTED))
    peers += [HF_PROMPT_LOOKUP] if HF_PROMPT_LOOKUP in present else []
    engine = [engine_label(label) for label in ENGINE_TWINS if engine_label(label) in present]
    return peers + [label for label in SERVICES_ORDER if label in present] + engine


def _speed(entry: Entry | None, batch: int) -> str:
    if entry is None:
        return "-"
    text = f"{entry.tokens_per_s.median:.1f}" + (f" ({entry.ratio:.2f}x)" if entry.ratio is not None else "")
    if batch > 1 and entry.ratio_to_batch1 is not None:
        text += f" [{entry.ratio_to_batch1:.2f}x b1]"
    return text


def speeds_table(cells: Sequence[Cell]) -> list[str]:
    labels = column_labels(cells)
    lines = ["| kind | batch | requests | " + " | ".join(labels) + " |",
             "|---|---:|---:|" + "---:|" * len(labels)]
    for c in cells:
        lines.append(f"| {c.kind} | {c.batch_size} | {c.requests} | "
                     + " | ".join(_speed(c.entry(label), c.batch_size) for label in labels) + " |")
    return lines


def _config(entry: Entry, batch: int) -> str:
    if entry.path == IN_PROCESS:
        return f"transformers, batch {batch}" if entry.label == HF_TARGET and batch > 1 else "transformers"
    if entry.chain is None:
        return "auto"
    return ",".join(entry.chain) + (f" W{entry.window}" if len(entry.chain) > 1 else "")


def kept_table(cells: Sequence[Cell]) -> list[str]:
    """Per cell, each services configuration that has an engine twin: both medians and the share kept."""
    lines = ["| kind | batch | configuration | chain | services tok/s | engine in process tok/s | kept |",
             "|---|---:|---|---|---:|---:|---:|"]
    for c in cells:
        for e in c.entries:
            twin = c.entry(engine_label(e.label)) if e.path == SERVICES else None
            if twin is not None:
                lines.append(f"| {c.kind} | {c.batch_size} | {e.label} | {_config(e, c.batch_size)} | "
                             f"{e.tokens_per_s.median:.1f} | {twin.tokens_per_s.median:.1f} | {_opt(e.kept, 'x')} |")
    return lines


def runoff_table(cells: Sequence[Cell]) -> list[str]:
    """Per batched cell, adaptive against the best static configuration of the rounds, in the run-off."""
    lines = ["| kind | batch | best static of the rounds | chain | run-off rounds | adaptive tok/s | best static tok/s "
             "| adaptive / best static | standard error | over the rounds' medians |",
             "|---|---:|---|---|---:|---:|---:|---:|---:|---:|"]
    for c in cells:
        r = c.runoff
        if r is None:
            continue
        best = c.entry(r.best)
        chain = _config(best, c.batch_size) if best is not None else "-"
        lines.append(f"| {c.kind} | {c.batch_size} | {r.best} | {chain} | {len(r.adaptive.runs)} | "
                     f"{r.adaptive.median:.1f} ({r.adaptive.low:.1f}-{r.adaptive.high:.1f}) | "
                     f"{r.static.median:.1f} ({r.static.low:.1f}-{r.static.high:.1f}) | {r.ratio:.3f}x | "
                     f"{_opt(r.se)} | {r.rounds_ratio:.3f}x |")
    return lines


def details_table(cells: Sequence[Cell]) -> list[str]:
    lines = ["| kind | batch | configuration | path | chain | median tok/s | min-max | range | ratio "
             "| agrees with TMO |",
             "|---|---:|---|---|---|---:|---:|---:|---:|---:|"]
    for c in cells:
        for e in c.entries:
            s = e.tokens_per_s
            chain = _config(e, c.batch_size)
            agree = f"{e.agrees_with_tmo}/{c.requests}" if e.agrees_with_tmo is not None else "-"
            same = f" (as {e.same_as})" if e.same_as else ""
            lines.append(f"| {c.kind} | {c.batch_size} | {e.label}{same} | {e.path} | {chain} | {s.median:.1f} | "
                         f"{s.low:.1f}-{s.high:.1f} | {s.relative_range:.1%} | {_opt(e.ratio, 'x')} | {agree} |")
    return lines


def screening_table(cells: Sequence[Cell]) -> list[str]:
    lines = ["| kind | batch | fastest two-level configurations of the screening (tok/s) |", "|---|---:|---|"]
    for c in cells:
        top = sorted(c.screening, key=lambda s: -s.tokens_per_s)[:SCREENING_SHOWN]
        text = ", ".join(f"{','.join(s.chain)} W{s.window} {s.tokens_per_s:.1f}" for s in top) or "no drafters"
        lines.append(f"| {c.kind} | {c.batch_size} | {text} |")
    return lines


BREAKDOWN_COLUMNS = ("cycles", "forward ms/cycle", "handler outside forward", "transport + serialization",
                     "router in-cycle", "choose", "late prefill", "outside cycles", "cycle", "client-side ms/request")


def _breakdown_cells(b: Breakdown | None, short) -> list[str]:
    if b is None:
        return ["unavailable"] + ["-"] * (len(BREAKDOWN_COLUMNS) - 1)
    forward = ", ".join(f"{short(m)} {ms:.2f}" for m, ms in b.forward_ms.items())
    return [str(b.cycles), forward, *(f"{v:.2f}" for v in (b.handler_outside_forward_ms, b.transport_ms,
                                                             b.router_in_cycle_ms, b.choose_ms, b.late_prefill_ms,
                                                             b.outside_cycles_ms,
                                                             b.cycle_ms, b.client_side_ms_per_request))]


def breakdown_table(cells: Sequence[Cell]) -> list[str]:
    models = [m for c in cells for e in c.entries if e.breakdown for m in e.breakdown.forward_ms]
    short = name_shortener(models)
    lines = ["| kind | batch | configuration | " + " | ".join(BREAKDOWN_COLUMNS) + " |",
             "|---|---:|---|" + "---:|" * len(BREAKDOWN_COLUMNS)]
    for c in cells:
        for e in c.entries:
            if e.path != SERVICES or e.same_as:
                continue
            cells_text = " | ".join(_breakdown_cells(e.breakdown, short))
            lines.append(f"| {c.kind} | {c.batch_size} | {e.label} | {cells_text} |")
    return lines


def services_shape(s: BenchSettings) -> str:
    """How the local cluster runs the pool's models."""
    return ("the router holds the models (`--models-in-router`)" if s.models_in_router
            else "one worker process per model")


def format_markdown(report: BenchReport) -> str:
    s = report.settings
    lines = ["# SpecRouter bench", "", *([report.machine, ""] if report.machine else []),
             f"Greedy, {s.max_new_tokens} new tokens a request, {s.rounds} rounds (median; range min-max), "
             f"screening windows {', '.join(map(str, s.windows))}, three-level window {s.three_level_window}; "
             f"models {', '.join(f'{m.name} ({m.parameters:,})' for m in report.models)}, {s.dtype} on "
             f"{s.device}; services: {services_shape(s)}; "
             f"{report.seconds / 60:.1f} min.", "",
             "## Tokens/s and ratio to in-process target-only", "",
             f"Ratios are over transformers' target-only `generate` at the cell's batch size ({HF_TARGET}: one "
             "prompt at a time at batch 1, batched with left padding above); `[..x b1]` is over that kind's "
             "batch-1 target-only generate. Assisted generation runs at transformers' defaults for the "
             "assistant (its draft length and confidence threshold), as a user gets it.", "",
             *speeds_table(report.cells), "",
             "## What the services keep of the engine in process", "",
             "Each static chain and window through the services (the SDK, gRPC, the router's batcher and, "
             "unless the router holds the models, the workers' processes) over the same chain and window on SpecRouter's engine in this process "
             f"(the router's chain step over the pool's worker engines, `{engine_label('<label>')}`), on the same "
             f"prompts in the same rounds; checked at batch 1 on the multi-level chains (>= {SERVICES_KEEP_MIN}x)."
             "", "", *kept_table(report.cells), "",
             *([] if not any(c.runoff for c in report.cells) else [
                 "## Run-off at batch sizes above 1", "",
                 f"After the rounds, {s.runoff_rounds} rounds of adaptive and the static configuration fastest "
                 "over the rounds, alternating which runs first: the fastest of several configurations is picked "
                 "for its luck in the rounds as well as its speed, and measured again it is not. Medians (range); "
                 "the standard error is of the mean log ratio of the rounds' pairs.", "",
                 *runoff_table(report.cells), ""]),
             "## Configurations", "", *details_table(report.cells), "",
             "## Screening (not counted)", "", *screening_table(report.cells), "",
             "## Per-cycle breakdown of the services path", "",
             "Milliseconds per router cycle of a request (summed over requests, over their cycles); the "
             "client-side column per request." + (" With the models in the router, the handler is the engine's "
             "call on the router's compute thread and the transport the hand-off to that thread."
             if s.models_in_router else ""), "", *breakdown_table(report.cells), "", "## Checks", ""]
    lines += [f"- {c.status}: {c.name}. {c.detail}" for c in report.checks]
    if report.mismatches:
        lines += ["", "## Greedy mismatches against TMO", ""]
        lines += [f"- {m.kind} batch {m.batch_size}: {m.label}, prompt {m.prompt_index}, first differing token "
                  f"{m.position}" for m in report.mismatches]
    return "\n".join(lines) + "\n"


def check_lines(report: BenchReport) -> list[str]:
    return [f"{'PASS' if c.status == PASS else 'n/a ' if c.status == NOT_RUN else 'FAIL'}  {c.name}"
            + (f": {c.detail}" if c.status != NOT_RUN else " (not run)") for c in report.checks]


def _opt(value: float | None, unit: str = "") -> str:
    return "-" if value is None else f"{value:.2f}{unit}"


def write_chart(report: BenchReport, path: Path) -> Path:
    """Per cell (rows: kinds, columns: batch sizes), each configuration's ratio to in-process target-only
    at that batch, with its range over rounds; a PNG at `path`."""
    cells = report.cells
    if not cells:
        raise ValueError("the bench has no cells to draw")
    kinds = list(dict.fromkeys(c.kind for c in cells))
    batches = sorted({c.batch_size for c in cells})
    fig = Figure(figsize=(PANEL_WIDTH_IN * len(batches), PANEL_HEIGHT_IN * len(kinds)), dpi=DPI, layout="constrained")
    grid = fig.add_gridspec(len(kinds), len(batches))
    by_cell = {(c.kind, c.batch_size): c for c in cells}
    for row, kind in enumerate(kinds):
        for col, batch in enumerate(batches):
            ax = fig.add_subplot(grid[row, col])
            cell = by_cell.get((kind, batch))
            if cell is None:
                ax.text(0.5, 0.5, "not run", ha="center", va="center", transform=ax.transAxes)
                ax.set_axis_off()
            else:
                _cell_panel(ax, cell)
    fig.legend(handles=[Patch(color=IN_PROCESS_COLOUR, label="transformers in process"),
                        Patch(color=SERVICES_COLOUR, label="SpecRouter services"),
                        Patch(color=ENGINE_COLOUR, label="SpecRouter engine in process"),
                        Patch(color=ADAPTIVE_COLOUR, label="adaptive")], loc="outside lower center", ncols=4)
    fig.suptitle("SpecRouter bench: speed over in-process target-only generate (median, range over rounds)")
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, format="png")
    return path


def _colour(entry: Entry) -> str:
    if entry.label == ADAPTIVE:
        return ADAPTIVE_COLOUR
    return {IN_PROCESS: IN_PROCESS_COLOUR, ENGINE: ENGINE_COLOUR}.get(entry.path, SERVICES_COLOUR)


def _cell_panel(ax, cell: Cell) -> None:
    reference = cell.entry(cell.reference)
    base = reference.tokens_per_s.median if reference and reference.tokens_per_s.median else None
    entries = [e for e in cell.entries if e.ratio is not None and base]
    if not entries:
        ax.text(0.5, 0.5, "no reference", ha="center", va="center", transform=ax.transAxes)
        return
    values = [e.ratio for e in entries]
    errors = [[e.ratio - e.tokens_per_s.low / base for e in entries],    # [2, entries]: below and above
              [e.tokens_per_s.high / base - e.ratio for e in entries]]
    colours = [_colour(e) for e in entries]
    ax.barh(range(len(entries)), values, xerr=errors, color=colours, capsize=3)
    ax.set_yticks(range(len(entries)), [e.label for e in entries], fontsize=8)
    ax.axvline(1.0, color="black", linewidth=0.8, linestyle="--")
    ax.set_xlabel("x in-process target-only")
    ax.set_title(f"{cell.kind}, batch {cell.batch_size} ({base:.1f} tok/s = 1x)", fontsize=10)
    ax.grid(axis="x", alpha=0.3)
