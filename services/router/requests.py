"""A generation request as the router runs it, and its validation (messages say what to fix)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from specrouter.worker.calls import SamplingParams

AUTO = "auto"
TARGET_ONLY = "target"
MAX_WINDOW = 16
MAX_STOP_STRINGS = 16


class InvalidRequest(ValueError):
    """The request cannot be served as given; the message says what to change."""


@dataclass(frozen=True)
class GenerationRequest:
    prompt_ids: list[int]
    sampling: SamplingParams
    max_new_tokens: int
    stop: tuple[str, ...] = ()
    chain: tuple[str, ...] | None = None  # None: the router's choice
    window: int = 0                       # 0: the router's choice


def parse_chain(spec: str, names: Sequence[str], target: str) -> tuple[str, ...] | None:
    """`""`/`auto` -> None (router's choice); `target` -> (target,); `a,b,target` -> that chain."""
    spec = spec.strip()
    if spec in ("", AUTO):
        return None
    if spec == TARGET_ONLY:
        return (target,)
    chain = tuple(s.strip() for s in spec.split(","))
    unknown = [m for m in chain if m not in names]
    if unknown:
        raise InvalidRequest(f"unknown model(s) {unknown} in chain {spec!r}; the pool has {list(names)}")
    if chain[-1] != target:
        raise InvalidRequest(f"chain {spec!r} must end at the target {target!r}")
    if len(set(chain)) != len(chain):
        raise InvalidRequest(f"chain {spec!r} names a model twice")
    return chain


def validate(prompt_ids: Sequence[int], sampling: SamplingParams, max_new_tokens: int, window: int,
             stop: Sequence[str], context_length: int) -> None:
    if not prompt_ids:
        raise InvalidRequest("prompt is empty: give at least one character of text")
    room = context_length - 1 - len(prompt_ids)
    if room < 1:
        raise InvalidRequest(f"prompt has {len(prompt_ids)} tokens; the pool's context is {context_length} tokens, "
                             f"so shorten the prompt to at most {context_length - 2} tokens")
    if max_new_tokens < 1:
        raise InvalidRequest(f"max_new_tokens must be at least 1, got {max_new_tokens}")
    if max_new_tokens > room:
        raise InvalidRequest(f"max_new_tokens {max_new_tokens} does not fit: the prompt has {len(prompt_ids)} tokens "
                             f"and the context {context_length}, so at most {room} new tokens")
    if not 0 <= window <= MAX_WINDOW:
        raise InvalidRequest(f"window must be in [1, {MAX_WINDOW}] (0 for the router's choice), got {window}")
    if len(stop) > MAX_STOP_STRINGS or any(not s for s in stop):
        raise InvalidRequest(f"give at most {MAX_STOP_STRINGS} non-empty stop strings")
    try:
        sampling.validate()
    except ValueError as exc:
        raise InvalidRequest(str(exc)) from None
