"""OpenAI response bodies from the router's messages (protobuf stays here and in upstream.py).

Each choice carries SpecRouter's per-request statistics in its `specrouter` field, as the SDK's
`GenerationStats` has them: cycles, the chains run (`chain_counts`), tokens accepted per level, prompt and
generated tokens, queue and total time, the seed, and `breakdown` (where the cycles spent their time,
per model), with the generated `token_ids`. A stream sends the token ids with each chunk and the
statistics with the chunk that ends its choice.
"""

from __future__ import annotations

import dataclasses
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass

from specrouter.client import GenerationStats
from specrouter.v1 import router_pb2 as pb

EXTENSION = "specrouter"


@dataclass(frozen=True)
class Kind:
    """What differs between the two endpoints' bodies."""

    object: str          # the whole response's `object`
    chunk_object: str    # a stream chunk's
    id_prefix: str
    chat: bool


COMPLETION = Kind("text_completion", "text_completion", "cmpl-", chat=False)
CHAT = Kind("chat.completion", "chat.completion.chunk", "chatcmpl-", chat=True)


def new_id(kind: Kind) -> str:
    return kind.id_prefix + uuid.uuid4().hex


def stats(m: pb.GenerationStats) -> dict:
    return dataclasses.asdict(GenerationStats.from_pb(m))


def usage(prompt_tokens: int, completion_tokens: int) -> dict:
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens}


def prompt_tokens(stats_by_choice: Sequence[pb.GenerationStats], n: int) -> int:
    """The prompt tokens of a request: each prompt once (its `n` choices share it)."""
    return sum(s.prompt_tokens for s in stats_by_choice[::n])


def whole(kind: Kind, request_id: str, model: str, replies: Sequence[pb.GenerateResponse], texts: Sequence[str],
          n: int) -> dict:
    """The body of a request answered at once: one choice per reply, in order."""
    choices = []
    for index, (reply, text) in enumerate(zip(replies, texts)):
        extension = {"token_ids": list(reply.token_ids), **stats(reply.stats)}
        choice = {"index": index, "finish_reason": reply.finish_reason, "logprobs": None, EXTENSION: extension}
        if kind.chat:
            choice["message"] = {"role": "assistant", "content": text}
        else:
            choice["text"] = text
        choices.append(choice)
    completion = sum(r.stats.generated_tokens for r in replies)
    return {"id": request_id, "object": kind.object, "created": int(time.time()), "model": model, "choices": choices,
            "usage": usage(prompt_tokens([r.stats for r in replies], n), completion)}


def chunk(kind: Kind, request_id: str, created: int, model: str, index: int, text: str | None,
          token_ids: Sequence[int] = (), finish_reason: str | None = None, first: bool = False,
          final_stats: pb.GenerationStats | None = None) -> dict:
    """One stream chunk for choice `index`: its new text (a chat's first chunk also names the role), and
    on its last chunk the finish reason and the statistics."""
    extension: dict = {"token_ids": list(token_ids)}
    if final_stats is not None:
        extension.update(stats(final_stats))
    choice: dict = {"index": index, "finish_reason": finish_reason, "logprobs": None, EXTENSION: extension}
    if kind.chat:
        delta: dict = {"role": "assistant"} if first else {}
        if text:
            delta["content"] = text
        elif first:
            delta["content"] = ""
        choice["delta"] = delta
    else:
        choice["text"] = text or ""
    return {"id": request_id, "object": kind.chunk_object, "created": created, "model": model, "choices": [choice]}


def usage_chunk(kind: Kind, request_id: str, created: int, model: str, usage_: dict) -> dict:
    """The last chunk of a stream that asked for usage (`stream_options.include_usage`): no choices."""
    return {"id": request_id, "object": kind.chunk_object, "created": created, "model": model, "choices": [],
            "usage": usage_}


def model_list(reply: pb.ListModelsResponse, aliases: Sequence[str], created: int) -> dict:
    """/v1/models: the pool's target, which answers, and its aliases (the drafters serve no requests)."""
    target = next(m.name for m in reply.models if m.role == "target")
    entries = [{"id": name, "object": "model", "created": created, "owned_by": "specrouter", "root": target,
                "parameters": next(m.parameters for m in reply.models if m.role == "target")}
               for name in (target, *aliases)]
    return {"object": "list", "data": entries}
