"""Where a batch runs: one replica of each model, chosen when the batch starts and kept for its life, since
its rows' KV state lives there.

The replica with the least load wins: the fewest rows that this router runs or holds waiting on it. Routers
do not see each other's load, so ties are broken at random, which spreads the batches of several routers
over the replicas. A replica that is down (health.py) is passed over; a drafter or intermediate verifier
with no replica up is left out of the batch, whose chains go on without it. The target has no stand-in: with
none of its replicas up the batch is placed on one of them all the same, so that its failure reaches the
requests as it is.

A batch whose target replica is lost (`failures.worker_gone`: the worker is unreachable, or silent past the call's
deadline) moves (`ChainBatch.move`): its rows leave every worker, another replica of the target that is up, the
least loaded, takes the lost one's place, and the rows join again from their tokens (prompt and generated so
far), as they do after a worker ran out of memory; the output is the one it would have been. With no other
replica of the target up, the rows wait for one to answer again (the batcher bounds the wait), or fail
UNAVAILABLE where the router holds no batch.
"""

from __future__ import annotations

import logging
import random
from collections.abc import Mapping, Sequence

from specrouter.router.chain import ChainBatch
from specrouter.router.row import Row
from specrouter.router.failures import RowsFailed, WorkerCallFailed, out_of_memory, worker_gone
from specrouter.router.health import ModelUnavailable, WorkerHealth
from specrouter.router.replicas import ReplicaSet, error_line
from specrouter.router.workers import Worker

log = logging.getLogger(__name__)
Loads = Mapping[int, int]   # id(replica) -> rows on it


def least_loaded(candidates: Sequence[Worker], loads: Loads, rng: random.Random) -> Worker:
    """The candidate with the least load; among equals, one at random."""
    least = min(loads.get(id(w), 0) for w in candidates)
    return rng.choice([w for w in candidates if loads.get(id(w), 0) == least])


class Placement:
    def __init__(self, replicas: ReplicaSet, health: WorkerHealth, target: str, rng: random.Random | None = None):
        self.replicas = replicas
        self.health = health
        self.target = target
        self.rng = rng or random.Random()

    def place(self, loads: Loads) -> dict[str, Worker]:
        """A replica of each model for a new batch (the models with none up left out, the target never)."""
        placed = {}
        for model in self.replicas.models:
            replicas = self.replicas.of(model)
            up = [w for w in replicas if self.health.is_up(w)]
            if model == self.target and not up:
                up = replicas
            if up:
                placed[model] = least_loaded(up, loads, self.rng)
        if self.target not in placed:
            raise ModelUnavailable(f"no replica of the target {self.target} is left (no address of its workers "
                                   "resolves to one that answers); retry once its workers are back")
        return placed

    def spare(self, model: str, loads: Loads, besides: Worker) -> Worker | None:
        """Another replica of `model` than `besides`, up, with the least load; None if there is none."""
        up = [w for w in self.replicas.of(model) if w is not besides and self.health.is_up(w)]
        return least_loaded(up, loads, self.rng) if up else None

    def recover(self, batch: ChainBatch, exc: WorkerCallFailed, loads: Loads, named: Sequence[str] = (),
                hold: bool = False) -> list[Row] | None:
        """After a call of `batch` that failed as a whole (not for some rows alone, not out of memory): the
        rows that must join the batch again from their tokens, or None if the batch cannot go on.

        The failed replica is taken out. The batch moves (`ChainBatch.move`) to another replica of the model,
        up and the least loaded, when it cannot go on without the model: the target (whose replica must be
        lost, not refusing), or a model its requests `named`; a batch with no rows yet moves at no cost.
        Otherwise, or with no other replica up, it drops the model: a drafter or intermediate verifier only
        costs speed, and the batch's other models' states are whole. A lost target with no other replica up
        ends the batch (None), unless it may `hold`: then its rows leave every worker and wait, on the lost
        replica, for it to answer again (`health` brings it back); None also when the target failed otherwise."""
        model = exc.model
        if isinstance(exc, RowsFailed) or out_of_memory(exc.cause) or model not in batch.workers:
            return None
        if model == self.target and not worker_gone(exc.cause):
            return None
        failed = batch.workers[model]
        self.health.mark_down(failed, model, exc.cause)
        spare = self.spare(model, loads, besides=failed)
        if spare is None and model == self.target:
            if not hold:
                return None
            rows = batch.move(model, failed)
            log.warning("the replica of the target %s at %s failed (%s) and no other answers; %d row(s) wait for one "
                        "to answer, then join again from their tokens", model, self.replicas.address_of(failed),
                        error_line(exc.cause), len(rows))
            return rows
        if spare is None or (model != self.target and model not in named and batch.rows):
            batch.drop_model(model)
            return []
        rows = batch.move(model, spare)
        if rows:
            log.warning("the replica of %s at %s failed (%s); %d row(s) move to %s and join again from their tokens",
                        model, self.replicas.address_of(failed), error_line(exc.cause), len(rows),
                        self.replicas.address_of(spare))
        return rows
