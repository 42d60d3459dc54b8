"""Forward times per context length: how much slower or faster each model's passes run than the latency
table in use says, at the batch's longest row.

Forward times depend on more than the batch size and tokens per row the profiler keys them by: a pass
over long contexts (a prompt of literal tables) costs the target about twice what a short one does, and
the profiler's figures are averages over whatever ran lately. So, per model and context length (in
powers of two), the ratio of its passes' measured time to the table's, and a batch's candidates have
each level scaled by its model's ratio at the batch's context length (once `context_min_cycles` cycles
measured it; within `context_scale_range`). The target runs in every cycle: its ratio is an EMA
(`context_alpha`, one sample per cycle), and it carries what every model shares (the context, a machine
that slows down). Every other model's ratio is the target's times an EMA of its own over the target's in
the cycles it ran, which fades back towards 1 (`context_fade_alpha` per cycle) in the cycles it sits
out: a model measured slow once (the first passes of a fresh cluster run at twice the table's times)
would otherwise keep that ratio for as long as it stays out, and it stays out because of it. A model
never measured at a context length is priced like the target there, not at the table's times.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence

from specrouter.router.cycle_report import CycleReport
from specrouter.router.row import Row
from specrouter.router.scheduling.ema import Ema, power_of_two
from specrouter.router.scheduling.latency import LatencyTable
from specrouter.router.scheduling.settings import SchedulerSettings


def context_bucket(rows: Sequence[Row]) -> int:
    """The batch's longest row (prompt and generated tokens), rounded up to a power of two."""
    return power_of_two(max((len(r.tokens) for r in rows), default=1))


class ContextScales:
    def __init__(self, models: Sequence[str], target: str, settings: SchedulerSettings):
        self.models, self.target, self.settings = list(models), target, settings
        # (model, context bucket) -> the target's passes over the table's; every other model's over the target's
        self._ratio: dict[tuple[str, int], Ema] = defaultdict(lambda: Ema(settings.context_alpha))

    def observe(self, report: CycleReport, rows: Sequence[Row], table: LatencyTable | None) -> None:
        """Each model's passes this cycle over what `table` (the one in use) predicts for them."""
        if table is None or not rows:
            return
        context = context_bucket(rows)
        ratios = {}
        for model, result in report.results.items():
            measured = predicted = 0.0
            for t in result.timings:
                if t.forward_ns > 0 and model in table.models():
                    measured += t.forward_ns
                    predicted += table(model, t.batch_size, t.tokens_per_row)
            if measured > 0 and predicted > 0:
                ratios[model] = measured / predicted
        target = ratios.get(self.target)
        if target is None:
            return
        self._ratio[(self.target, context)].add(target)
        for model in self.models:
            if model == self.target:
                continue
            if model in ratios:
                self._ratio[(model, context)].add(ratios[model] / target)
            elif (model, context) in self._ratio:
                self._ratio[(model, context)].fade(1.0, self.settings.context_fade_alpha)

    def value(self, rows: Sequence[Row]) -> dict[str, float]:
        """Per model, its passes over the latency table's at the batch's context length: the target's as
        measured, another model's the target's times its own over the target's (1 until measured); empty
        until the target has been measured there `context_min_cycles` times."""
        context = context_bucket(rows)
        s = self.settings
        target = self._ratio.get((self.target, context))
        if target is None or target.count < s.context_min_cycles:
            return {}
        low, high = s.context_scale_range
        scales = {}
        for model in self.models:
            own = self._ratio.get((model, context)) if model != self.target else None
            relative = own.get() if own is not None and own.count >= s.context_min_cycles else 1.0
            scales[model] = min(high, max(low, target.get() * relative))
        return scales
