"""Who chooses a cycle's chain and window where the requests left the choice to the router.

A batch's requests name a chain and a window, or leave either to the router (`BatchKey`). Before each such
cycle the batcher asks its `ChainChooser`. The router's chooser is its scheduling policy: the `Scheduler`
(which plans from the profiler's measurements) when the router is adaptive, else `DefaultChain`, the chain
and window of its settings. `DefaultChain` with the target alone is also what a batcher made without a
chooser runs.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

from specrouter.router.chain import ChainBatch

if TYPE_CHECKING:
    from specrouter.router.scheduling.policy import Decision


class ChainChooser(Protocol):
    def choose(self, batch: ChainBatch, chain: tuple[str, ...] | None,
               window: int) -> tuple[tuple[str, ...], int]:
        """The (chain, window) of the batch's next cycle. A `chain` (None: the router's choice) or a `window`
        (0: the router's choice) that the requests named narrows the choice to the candidates that have it."""


class RouterChooser(ChainChooser, Protocol):
    def decision_for(self, batch: ChainBatch) -> Decision | None:
        """The decision behind the batch's latest choice, with the prediction it was made on (None: the
        choice had no prediction behind it)."""


class DefaultChain:
    """Runs the chain and window the requests named, and `chain` and `window` where they left either to the
    router. While a model of `chain` is out of the batch (its worker failed), the target, the chain's last
    model, runs alone."""

    def __init__(self, chain: tuple[str, ...], window: int = 0):
        self.chain = chain
        self.window = window

    def choose(self, batch: ChainBatch, chain: tuple[str, ...] | None,
               window: int) -> tuple[tuple[str, ...], int]:
        default = self.chain if set(self.chain) <= set(batch.workers) else self.chain[-1:]
        return chain or default, window or self.window

    def decision_for(self, batch: ChainBatch) -> None:
        """A fixed chain is no prediction."""
        return None
