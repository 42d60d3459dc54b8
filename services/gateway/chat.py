"""Chat messages to one prompt, through the checkpoint's chat template.

A Hugging Face checkpoint keeps its template in `chat_template.jinja`, or as `chat_template` in
`tokenizer_config.json` (a string, or a list of named templates of which `default` is the one). The
template is rendered as transformers renders it, in a sandbox: the messages, `add_generation_prompt`
(true: the prompt ends where the assistant's answer begins) and the tokenizer's special tokens
(`bos_token`, `eos_token`, ...) as text. The router reads the special tokens in the text back as the
tokens they are, and adds none of its own.

A checkpoint without a template (the demo pool's) has no chat format: the gateway answers 400 rather
than guess one; `--chat-template FILE` gives one.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

import jinja2
from jinja2.sandbox import ImmutableSandboxedEnvironment

from specrouter.gateway.errors import APIError, bad_request

TEMPLATE_FILE = "chat_template.jinja"
SPECIAL_TOKENS = ("bos_token", "eos_token", "unk_token", "pad_token", "sep_token", "cls_token", "mask_token")


class ChatTemplateError(ValueError):
    """The template cannot be read or compiled; the message names the file."""


def _raise(message: str):
    raise jinja2.TemplateError(message)


def _environment() -> ImmutableSandboxedEnvironment:
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=["jinja2.ext.loopcontrols"])
    env.filters["tojson"] = lambda value, indent=None: json.dumps(value, ensure_ascii=False, indent=indent)
    env.globals["raise_exception"] = _raise
    env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
    return env


@dataclass(frozen=True)
class ChatTemplate:
    source: str                     # the Jinja text
    special_tokens: dict[str, str]  # bos_token, eos_token, ... as text
    origin: str                     # where it came from, for messages

    def render(self, messages: Sequence[dict]) -> str:
        """The prompt for `messages` ({"role", "content"}), ending where the assistant's answer begins."""
        try:
            template = _environment().from_string(self.source)
            return template.render(messages=list(messages), add_generation_prompt=True, **self.special_tokens)
        except jinja2.TemplateError as exc:   # the template's own refusal, e.g. roles out of order
            raise bad_request(f"the model's chat template refused the messages: {exc}", "messages") from None


def load(tokenizer_dir: Path | None, template_file: Path | None) -> ChatTemplate | None:
    """The chat template `template_file` gives, else the checkpoint's in `tokenizer_dir`; None if neither has one."""
    config = _tokenizer_config(tokenizer_dir) if tokenizer_dir is not None else {}
    special = {name: _token_text(config[name]) for name in SPECIAL_TOKENS if config.get(name) is not None}
    if template_file is not None:
        return ChatTemplate(_read(template_file), special, str(template_file))
    if tokenizer_dir is None:
        return None
    if (tokenizer_dir / TEMPLATE_FILE).exists():
        return ChatTemplate(_read(tokenizer_dir / TEMPLATE_FILE), special, str(tokenizer_dir / TEMPLATE_FILE))
    source = config.get("chat_template")
    if isinstance(source, list):   # named templates
        source = next((t.get("template") for t in source if isinstance(t, dict) and t.get("name") == "default"), None)
    if not source:
        return None
    return ChatTemplate(source, special, str(tokenizer_dir / "tokenizer_config.json"))


def check(template: ChatTemplate) -> None:
    """Compiles the template, so that a broken one stops the gateway at start rather than fail each request."""
    try:
        _environment().from_string(template.source)
    except jinja2.TemplateSyntaxError as exc:
        raise ChatTemplateError(f"the chat template in {template.origin} does not compile: {exc}") from None


def no_template(model: str) -> APIError:
    return bad_request(f"the model {model!r} has no chat template, so chat messages cannot be formatted for it; "
                       "use /v1/completions with a prompt, or start the gateway with --chat-template FILE",
                       "messages", "no_chat_template")


def _tokenizer_config(tokenizer_dir: Path) -> dict:
    path = tokenizer_dir / "tokenizer_config.json"
    if not path.exists():
        return {}
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise ChatTemplateError(f"cannot read {path}: {exc}") from None


def _read(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ChatTemplateError(f"cannot read the chat template {path}: {getattr(exc, 'strerror', None) or exc}"
                                ) from None


def _token_text(token) -> str:
    """A special token as tokenizer_config.json writes it: a string, or an object with its `content`."""
    return token.get("content", "") if isinstance(token, dict) else str(token)
