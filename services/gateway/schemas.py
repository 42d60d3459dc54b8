"""The request bodies of the OpenAI API as the gateway takes them, checked strictly: a field of the wrong type
is refused, not converted. Fields other clients send at their neutral values (`presence_penalty: 0`,
`logprobs: null`, ...) pass; a value the gateway cannot honour is refused by name. Fields it does not know
are ignored, as OpenAI's own API does for fields it has retired.

SpecRouter's own knobs travel as extra body fields (the openai client's `extra_body`): `chain` ("auto",
"target" for target-only decoding, or model names ending at the target), `window` (the draft window, 0 for
the router's choice), `top_k` and `repetition_penalty`.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from specrouter.gateway.errors import APIError, bad_request

INT64 = 1 << 63
UINT32_MAX = (1 << 32) - 1
COMPLETIONS_MAX_TOKENS = 16   # OpenAI's default for /v1/completions; chat leaves it to the router


class StreamOptions(BaseModel):
    model_config = ConfigDict(strict=True, extra="ignore")
    include_usage: bool = False


class Sampling(BaseModel):
    """What both endpoints take."""

    model_config = ConfigDict(strict=True, extra="allow")

    model: str = Field(min_length=1)
    max_tokens: int | None = Field(None, ge=1, le=UINT32_MAX)
    temperature: float = Field(1.0, ge=0.0)   # OpenAI's default: sampling; 0 is greedy
    top_p: float = Field(1.0, gt=0.0, le=1.0)
    seed: int | None = Field(None, ge=-INT64, lt=INT64)
    stop: str | list[str] | None = None
    n: int = Field(1, ge=1)
    stream: bool = False
    stream_options: StreamOptions | None = None
    user: str | None = None
    # SpecRouter's own
    chain: str = "auto"
    window: int = Field(0, ge=0, le=UINT32_MAX)
    top_k: int = Field(0, ge=0, lt=1 << 31)
    repetition_penalty: float | None = Field(None, gt=0.0)
    # accepted at their neutral values only
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    logit_bias: dict[str, Any] | None = None
    logprobs: Any = None

    def stops(self) -> list[str]:
        return [self.stop] if isinstance(self.stop, str) else list(self.stop or ())

    def refuse_unsupported(self) -> None:
        """A field set to something the gateway cannot honour is refused by name (never silently ignored)."""
        for name in ("presence_penalty", "frequency_penalty"):
            if getattr(self, name) not in (None, 0, 0.0):
                raise bad_request(f"{name} is not supported; leave it out or at 0 (repetition_penalty, an extra "
                                  "body field, penalises repeats)", name, "unsupported_parameter")
        if self.logit_bias:
            raise bad_request("logit_bias is not supported; leave it out", "logit_bias", "unsupported_parameter")
        if self.logprobs not in (None, False, 0):
            raise bad_request("logprobs are not supported; leave logprobs out", "logprobs", "unsupported_parameter")
        if self.stream_options is not None and not self.stream:
            raise bad_request("stream_options is only for streaming requests: set stream to true or leave it out",
                              "stream_options")


class CompletionRequest(Sampling):
    prompt: str | list[str]
    max_tokens: int | None = Field(COMPLETIONS_MAX_TOKENS, ge=1, le=UINT32_MAX)
    echo: bool = False
    suffix: str | None = None
    best_of: int | None = None

    def prompts(self) -> list[str]:
        return [self.prompt] if isinstance(self.prompt, str) else list(self.prompt)

    def refuse_unsupported(self) -> None:
        super().refuse_unsupported()
        if isinstance(self.prompt, list) and not self.prompt:
            raise bad_request("prompt is an empty list: give a string, or a list of strings", "prompt")
        if self.echo:
            raise bad_request("echo is not supported; leave it out or false", "echo", "unsupported_parameter")
        if self.suffix:
            raise bad_request("suffix is not supported; leave it out", "suffix", "unsupported_parameter")
        if self.best_of not in (None, self.n):
            raise bad_request("best_of is not supported; leave it out (or equal to n)", "best_of",
                              "unsupported_parameter")


class TextPart(BaseModel):
    model_config = ConfigDict(strict=True, extra="ignore")
    type: Literal["text"]
    text: str


class Message(BaseModel):
    model_config = ConfigDict(strict=True, extra="ignore")
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[TextPart] | None = None
    name: str | None = None

    def text(self) -> str:
        if isinstance(self.content, list):
            return "".join(part.text for part in self.content)
        return self.content or ""


class ChatRequest(Sampling):
    messages: list[Message] = Field(min_length=1)
    max_completion_tokens: int | None = Field(None, ge=1, le=UINT32_MAX)   # the newer name of max_tokens
    tools: list[Any] | None = None
    response_format: dict[str, Any] | None = None

    def new_tokens(self) -> int | None:
        return self.max_completion_tokens if self.max_completion_tokens is not None else self.max_tokens

    def refuse_unsupported(self) -> None:
        super().refuse_unsupported()
        if self.tools:
            raise bad_request("tools are not supported; leave tools out", "tools", "unsupported_parameter")
        if self.response_format not in (None, {"type": "text"}):
            raise bad_request("response_format is not supported; leave it out or {\"type\": \"text\"}",
                              "response_format", "unsupported_parameter")


def parse(model: type[BaseModel], body: Any):
    """`body` (decoded JSON) as `model`, or a 400 that names the first field at fault and what it takes."""
    if not isinstance(body, dict):
        raise bad_request(f"the request body must be a JSON object, got {type(body).__name__}")
    try:
        request = model.model_validate(body)
    except ValidationError as exc:
        raise _field_error(exc) from None
    request.refuse_unsupported()
    return request


def _field_error(exc: ValidationError) -> APIError:
    first = exc.errors(include_url=False)[0]
    # a union reports each member's complaint; the field's path is what comes before the member's name
    loc = [str(part) for part in first["loc"] if not (isinstance(part, str) and "[" in part)]
    loc = [part for part in loc if part not in ("str", "list", "int", "float", "bool")]
    param = ".".join(loc) or None
    if first["type"] == "missing":
        return bad_request(f"{param} is required", param, "missing_required_parameter")
    given = first.get("input")
    shown = repr(given) if not isinstance(given, (dict, list)) or len(repr(given)) < 80 else type(given).__name__
    return bad_request(f"{param}: {first['msg']} (got {shown})", param, "invalid_type"
                       if "type" in first["type"] or first["type"].endswith("_parsing") else "invalid_value")
