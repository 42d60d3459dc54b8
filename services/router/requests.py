"""A generation request as the router runs it: read off the wire (`RequestParser`) and validated (messages say
what to fix)."""

from __future__ import annotations

import random
from collections.abc import Collection, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from specrouter.router.settings import RouterSettings, setting_hint
from specrouter.contract.calls import SamplingParams

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

    from specrouter.v1 import router_pb2 as pb

AUTO = "auto"
TARGET_ONLY = "target"
MAX_WINDOW = 16
MAX_STOP_STRINGS = 16
SEED_BITS = 62   # of the seed drawn for a request that gives none


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


@dataclass(frozen=True)
class Limits:
    """The most one request may ask for: the router's settings of the same names (0: no bound of its own)."""

    max_prompt_bytes: int = 0
    max_prompt_tokens: int = 0
    max_new_tokens: int = 0

    def check_prompt_bytes(self, size: int) -> None:
        if self.max_prompt_bytes and size > self.max_prompt_bytes:
            raise over_limit(f"prompt is {size} bytes of UTF-8", "max_prompt_bytes", self.max_prompt_bytes,
                             "shorten the prompt")

    def check(self, prompt_tokens: int, max_new_tokens: int) -> None:
        if self.max_prompt_tokens and prompt_tokens > self.max_prompt_tokens:
            raise over_limit(f"prompt has {prompt_tokens} tokens", "max_prompt_tokens", self.max_prompt_tokens,
                             "shorten the prompt")
        if self.max_new_tokens and max_new_tokens > self.max_new_tokens:
            raise over_limit(f"max_new_tokens is {max_new_tokens}", "max_new_tokens", self.max_new_tokens,
                             "ask for fewer")


def over_limit(what: str, setting: str, most: int, fix: str) -> InvalidRequest:
    return InvalidRequest(f"{what}, over this router's limit of {most} ({setting}): {fix}, or have the operator "
                          f"raise it with {setting_hint(setting)}")


def parse_chain(spec: str, names: Sequence[str], target: str, drafts_only: Collection[str] = (),
                ) -> tuple[str, ...] | None:
    """`""`/`auto` -> None (router's choice); `target` -> (target,); `a,b,target` -> that chain. A level in
    `drafts_only` (the lookup) can only start a chain."""
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
    late = [m for m in chain[1:] if m in drafts_only]
    if late:
        raise InvalidRequest(f"{late[0]!r} drafts without a model: it can only start a chain, as in "
                             f"'{late[0]},{target}'")
    return chain


def validate(prompt_ids: Sequence[int], sampling: SamplingParams, max_new_tokens: int, window: int,
             stop: Sequence[str], context_length: int, limits: Limits = Limits()) -> None:
    if not prompt_ids:
        raise InvalidRequest("prompt is empty: give at least one character of text")
    limits.check(len(prompt_ids), max_new_tokens)
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


class RequestParser:
    """Reads a GenerateRequest as the GenerationRequest the batcher runs: its sampling parameters (a seed drawn
    where the client gave none, coupled as a given seed is with `couple_unseeded`), its prompt tokenized within
    the router's limits, the default number of new tokens where it asks for none, and its chain parsed against
    the pool's levels (`chain_names`, those in `drafts_only` only at a chain's start); InvalidRequest says what
    to change."""

    def __init__(self, settings: RouterSettings, tokenizer: PreTrainedTokenizerBase, context_length: int,
                 chain_names: Sequence[str], target: str, drafts_only: Collection[str] = ()):
        self.settings = settings
        self.tokenizer = tokenizer
        self.context_length = context_length
        self.chain_names = chain_names
        self.target = target
        self.drafts_only = drafts_only
        self.limits = Limits(settings.max_prompt_bytes, settings.max_prompt_tokens, settings.max_new_tokens)

    def parse(self, m: pb.GenerateRequest) -> GenerationRequest:
        seed = m.seed if m.HasField("seed") else random.getrandbits(SEED_BITS)
        sampling = SamplingParams(temperature=m.temperature, top_k=m.top_k,
                                  top_p=m.top_p if m.HasField("top_p") else 1.0,
                                  repetition_penalty=m.repetition_penalty if m.HasField("repetition_penalty") else 1.0,
                                  seed=seed, coupled=m.HasField("seed") or self.settings.couple_unseeded)
        self.limits.check_prompt_bytes(len(m.prompt.encode("utf-8")))
        prompt_ids = self.tokenizer(m.prompt, add_special_tokens=False)["input_ids"] if m.prompt else []
        max_new = m.max_new_tokens if m.HasField("max_new_tokens") else self.settings.default_max_new_tokens
        validate(prompt_ids, sampling, max_new, m.window, list(m.stop), self.context_length, self.limits)
        chain = parse_chain(m.chain, self.chain_names, self.target, self.drafts_only)
        return GenerationRequest(prompt_ids, sampling, max_new, tuple(m.stop), chain, m.window)
