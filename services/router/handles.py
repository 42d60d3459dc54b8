"""A client's view of one request in the batcher: its handle, and the events the batcher sends it (tokens
emitted, the end, a failure)."""

from __future__ import annotations

import queue
import threading
import time
import uuid
from collections import Counter, defaultdict
from dataclasses import dataclass, field

from opentelemetry import trace

from specrouter.router.breakdown import CycleBreakdown
from specrouter.router.row import Row
from specrouter.router.requests import GenerationRequest

tracer = trace.get_tracer(__name__)


@dataclass(frozen=True)
class Emitted:
    token_ids: list[int]


@dataclass(frozen=True)
class Finished:
    finish_reason: str
    token_ids: list[int]
    stats: dict


@dataclass(frozen=True)
class Failed:
    error: Exception


@dataclass
class RequestHandle:
    """A client's view of one request: events arrive on `events`; `cancel` may be called at any time."""

    request: GenerationRequest
    row_id: str = field(default_factory=lambda: uuid.uuid4().hex)
    events: queue.Queue = field(default_factory=queue.Queue)
    cancelled: threading.Event = field(default_factory=threading.Event)
    arrived_ns: int = field(default_factory=time.perf_counter_ns)
    joined_ns: int = 0
    chain_counts: Counter = field(default_factory=Counter)
    accepted: dict[str, list[int]] = field(default_factory=lambda: defaultdict(list))
    span_context: trace.SpanContext | None = None  # the request's span, parent of its cycles
    breakdown: CycleBreakdown = field(default_factory=CycleBreakdown)

    def cancel(self) -> None:
        self.cancelled.set()

    def stats(self, row: Row) -> dict:
        now = time.perf_counter_ns()
        return {"cycles": row.cycle, "chain_counts": dict(self.chain_counts),
                "accepted_per_level": {m: sum(v) / len(v) for m, v in self.accepted.items() if v},
                "prompt_tokens": row.prompt_len, "generated_tokens": len(row.generated),
                "queue_ns": self.joined_ns - self.arrived_ns, "total_ns": now - self.arrived_ns,
                "seed": row.sampling.seed, "breakdown": self.breakdown}


class CancelledError(RuntimeError):
    """The client went away or its deadline passed."""


def request_span(name: str, handles: list[RequestHandle], attributes: dict):
    """A span under the oldest request's span, linked to the others' (a prefill or a cycle serves them all)."""
    contexts = [h.span_context for h in handles if h.span_context is not None and h.span_context.is_valid]
    parent = trace.set_span_in_context(trace.NonRecordingSpan(contexts[0])) if contexts else None
    links = [trace.Link(c) for c in contexts[1:]]
    return tracer.start_as_current_span(name, context=parent, links=links, attributes=attributes)
