"""What one cycle of a chain did: the tokens it emitted, what each level accepted of what it was offered,
the workers' timings and each call's round trip. The batcher hands it to the scheduler, the profiler's
reports, Prometheus and each request's breakdown."""

from __future__ import annotations

from dataclasses import dataclass, field

from specrouter.contract.calls import StepResult


@dataclass(frozen=True)
class CycleReport:
    chain: tuple[str, ...]
    window: int
    emitted: dict[str, list[int]]               # row id -> tokens emitted this cycle
    accepted: dict[str, list[int]]              # level model -> accepted proposal tokens per row
    proposed: dict[str, list[int]]              # level model -> proposal length per row
    results: dict[str, StepResult]              # level model -> its step (timings)
    call_ns: dict[str, int] = field(default_factory=dict)  # level model -> wall time of its call, round trip included
    model_free: bool = False   # the chain starts with a level that runs no model (the lookup)
    # (lookup, verifier) -> per row, (accepted, checked) of what the lookup would have proposed this cycle,
    # judged by the verifier's own picks (None for a sampled row: its picks judge no point mass)
    shadow: dict[tuple[str, str], list[tuple[int, int] | None]] = field(default_factory=dict)
    # per row, the length of the lookup level's match after the row's tokens before the cycle (None: the
    # pool has no lookup level): its checks, run or judged, are measured per match length too
    matches: list[int] | None = None
    # a pipelined batch: whether the proposal came from the last cycle's ahead draft (then the drafter was
    # not called), and this cycle's ahead draft (its step and round trip, run beside the verifiers)
    from_ahead: bool = False
    ahead: StepResult | None = None
    ahead_ns: int = 0
    # wall time of the cycle spent prefilling rows on a model of the chain that had not yet seen them (it was
    # left out of their prefill at join): a catch-up, priced as such, not the router's cost of a cycle
    late_prefill_ns: int = 0

    def accepted_whole(self) -> bool:
        """Every level accepted every row's whole proposal (only then may the next cycle take its proposal
        from an ahead draft)."""
        return all(a == p for m in self.chain[1:] for a, p in zip(self.accepted.get(m, ()), self.proposed.get(m, ())))

    def checked(self, verifier: str, row_index: int) -> int:
        """Positions of a row's proposal that `verifier` checked: up to and including its first rejection.
        A model-free level's proposal may stop short of the window (no match, or a match near the end of
        what it copies): the position after its last token counts as checked and rejected, so that the
        acceptance at a position is the chance that a token there is both proposed and accepted, which is
        what the cost model's proposals of `window` tokens need."""
        accepted = self.accepted[verifier][row_index]
        offered = self.proposed[verifier][row_index]
        if self.model_free and len(self.chain) > 1 and verifier == self.chain[1]:
            offered = max(offered, self.window)
        return min(accepted + 1, offered)
