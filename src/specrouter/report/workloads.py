"""Workloads for the scheduler report: prompts of three kinds, each favouring a different speculative chain.

- `code`: held-out standard-library snippets, like the pool's training text (`pool.prompts`).
- `repetitive`: literal tables and runs of near-identical statements named after held-out identifiers;
  each prompt stops mid-line, so its continuation repeats the pattern and even the smallest drafter
  guesses it: drafts are accepted more often than on code, so long windows pay.
- `prose`: everyday English (`prose.txt`), far from the Python the pool trained on; each passage stops
  mid-sentence, and the drafters guess poorly, so short windows or the target alone pay.

A prompts file (`load_prompts`) is JSON lines, one `{"kind": ..., "prompt": ...}` object a line.
"""

from __future__ import annotations

import builtins
import io
import json
import keyword
import re
import tokenize
import unicodedata
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

from specrouter.pool import corpus
from specrouter.pool.prompts import heldout_code_prompts

CODE, REPETITIVE, PROSE = "code", "repetitive", "prose"

PROSE_FILE = "prose.txt"
MIN_REPETITIVE_CHARS = 300   # a repetitive prompt grows whole lines past this many characters...
REPETITIVE_SPREAD = 150      # ...plus up to this many more (varied per prompt), then a part line
NAMES_PER_PROMPT = 16        # identifiers a repetitive prompt draws from
CUT_FRACTION = 0.6           # the last line stops this far in: mid-pattern

_IDENTIFIER = re.compile(r"[a-z][a-z0-9_]{3,19}")
_NOT_NAMES = frozenset(keyword.kwlist) | frozenset(dir(builtins)) | {"self", "args", "kwargs"}


@dataclass(frozen=True)
class Prompt:
    kind: str
    prompt: str


def builtin_prompts(per_kind: int = 16) -> list[Prompt]:
    """`per_kind` prompts of each kind (code, repetitive, prose, in that order): deterministic."""
    if per_kind < 1:
        raise ValueError(f"per_kind must be at least 1, got {per_kind}")
    _, heldout = corpus.split(corpus.stdlib_files())
    names_by_file = [n for n in (_identifiers(f.text) for f in heldout) if len(n) >= NAMES_PER_PROMPT]
    passages = prose_passages()
    short = []
    try:
        code = heldout_code_prompts(per_kind)
    except ValueError as exc:
        short.append(f"{CODE}: {exc}")
    for kind, have in ((REPETITIVE, len(names_by_file) * len(_TEMPLATES)), (PROSE, len(passages))):
        if have < per_kind:
            short.append(f"{kind}: only {have} prompts")
    if short:
        raise ValueError(f"per_kind={per_kind} is more than the built-in workloads hold ({'; '.join(short)}); "
                         "ask for fewer per kind, or write prompts as JSON lines and read them with load_prompts")
    repetitive = [_repetitive_prompt(k, names_by_file) for k in range(per_kind)]
    return ([Prompt(CODE, p) for p in code] + [Prompt(REPETITIVE, p) for p in repetitive]
            + [Prompt(PROSE, p) for p in _spread(passages, per_kind)])


def prose_passages() -> list[str]:
    """The shipped English passages, one a paragraph of `prose.txt`."""
    text = resources.files(__package__).joinpath(PROSE_FILE).read_text(encoding="utf-8")
    return [" ".join(p.split()) for p in text.split("\n\n") if p.strip()]


def load_prompts(path: Path) -> list[Prompt]:
    """Prompts from a JSON-lines file of `{"kind": str, "prompt": str}` objects; blank lines are skipped."""
    path = Path(path)
    try:
        lines = path.read_text(encoding="utf-8").split("\n")  # not splitlines: JSON strings may hold U+2028
    except UnicodeDecodeError as exc:
        raise ValueError(f"{path}: not UTF-8 text ({exc.reason} at byte {exc.start}); save it as UTF-8") from None
    prompts = [_parse_line(path, number, line) for number, line in enumerate(lines, 1) if line.strip()]
    if not prompts:
        raise ValueError(f'{path}: no prompts; write one JSON object a line, like {{"kind": "code", "prompt": "..."}}')
    return prompts


def by_kind(prompts: Iterable[Prompt]) -> dict[str, list[Prompt]]:
    """Prompts grouped by kind, kinds in the order first seen."""
    groups: dict[str, list[Prompt]] = {}
    for p in prompts:
        groups.setdefault(p.kind, []).append(p)
    return groups


def _parse_line(path: Path, number: int, line: str) -> Prompt:
    where = f"{path}, line {number}"
    try:
        obj = json.loads(line)
    except json.JSONDecodeError as exc:
        raise ValueError(f'{where}: not valid JSON ({exc.msg} at column {exc.colno}); '
                         'write one object a line, like {"kind": "code", "prompt": "..."}') from None
    if not isinstance(obj, dict):
        raise ValueError(f'{where}: expected a JSON object with "kind" and "prompt", got {_json_type(obj)}')
    fields = {}
    for name in ("kind", "prompt"):
        if name not in obj:
            raise ValueError(f'{where}: missing field "{name}"; add it as a non-empty string')
        value = obj[name]
        if not isinstance(value, str):
            raise ValueError(f'{where}: field "{name}" must be a string, got {_json_type(value)}')
        if not value.strip():
            raise ValueError(f'{where}: field "{name}" is empty; give it some text')
        fields[name] = value
    return Prompt(**fields)


def _json_type(value: object) -> str:
    names = {dict: "an object", list: "an array", bool: "a boolean", int: "a number", float: "a number"}
    return "null" if value is None else names.get(type(value), type(value).__name__)


def _spread(items: list[str], count: int) -> list[str]:
    """`count` items evenly spread over `items`, in order."""
    stride = len(items) / count
    return [items[int(i * stride)] for i in range(count)]


def _identifiers(source: str) -> list[str]:
    """Distinct lower-case names in a source file's code (no comments, strings, keywords or builtins)."""
    seen: dict[str, None] = {}
    try:
        for tok in tokenize.generate_tokens(io.StringIO(source).readline):
            if tok.type == tokenize.NAME and _IDENTIFIER.fullmatch(tok.string) and tok.string not in _NOT_NAMES:
                seen.setdefault(tok.string)
    except (tokenize.TokenError, SyntaxError):
        pass  # a file that does not tokenize to the end still gives the names before the error
    return list(seen)


# Repetitive prompts. A template is a header (from the file's first identifier) and a line function of
# (identifiers, line number i, prompt number k); a prompt is the header, whole lines, then a part line.
# The demo pool copies poorly from context, so the templates favour patterns it learnt in training
# (codec tables, argparse calls, runs of assertions) over arbitrary ones such as a table of counting numbers.

LATIN1_NAMED = range(0xA0, 0x100)   # code points with stable Unicode names, for the codec tables


def _latin1(n: int) -> int:
    return LATIN1_NAMED[n % len(LATIN1_NAMED)]


def _decoding_line(names: list[str], i: int, k: int) -> str:
    c = _latin1(7 * k + i)
    return f"    '\\x{c:02x}'     #  0x{c:02X} -> {unicodedata.name(chr(c))}\n"


def _encoding_map_line(names: list[str], i: int, k: int) -> str:
    byte, c = 0x80 + (11 * k + i) % 0x80, _latin1(5 * k + i)
    return f"    0x{byte:04x}: 0x{c:04x},     #  {unicodedata.name(chr(c))}\n"


def _argument_line(names: list[str], i: int, k: int) -> str:
    n = names[i % len(names)]
    return f"parser.add_argument('--{n.replace('_', '-')}', dest='{n}', action='store_true')\n"


def _assert_line(names: list[str], i: int, k: int) -> str:
    n = names[i % len(names)]
    return f"        self.assertEqual(getattr(result, '{n}'), expected['{n}'])\n"


def _field_line(names: list[str], i: int, k: int) -> str:
    n = names[i % len(names)]
    return f"    ('{n}', options.{n}, {i}),\n"


@dataclass(frozen=True)
class _Template:
    header: Callable[[str], str]
    line: Callable[[list[str], int, int], str]


_TEMPLATES = [
    _Template(lambda n: f"{n}_decoding_table = (\n", _decoding_line),
    _Template(lambda n: f"{n}_decoding_map.update({{\n", _encoding_map_line),
    _Template(lambda n: f"parser = argparse.ArgumentParser(prog='{n}')\n", _argument_line),
    _Template(lambda n: f"    def test_{n}_fields(self):\n        result = self.parse_{n}()\n", _assert_line),
    _Template(lambda n: f"{n}_fields = [\n", _field_line),
]


def repetitive_prompts(n: int) -> list[str]:
    """The first `n` repetitive prompts of the built-in workload (`builtin_prompts`' own, and more)."""
    _, heldout = corpus.split(corpus.stdlib_files())
    names_by_file = [n for n in (_identifiers(f.text) for f in heldout) if len(n) >= NAMES_PER_PROMPT]
    if n > len(names_by_file) * len(_TEMPLATES):
        raise ValueError(f"the repetitive workload holds {len(names_by_file) * len(_TEMPLATES)} prompts, not {n}")
    return [_repetitive_prompt(k, names_by_file) for k in range(n)]


def _repetitive_prompt(k: int, names_by_file: list[list[str]]) -> str:
    """Prompt `k`: file k mod F with template (k mod F + k div F) mod T, so each (file, template) pair once."""
    f, rnd = k % len(names_by_file), k // len(names_by_file)
    template = _TEMPLATES[(f + rnd) % len(_TEMPLATES)]
    names = names_by_file[f][:NAMES_PER_PROMPT]
    text = template.header(names[0])
    goal = MIN_REPETITIVE_CHARS + (k * 37) % REPETITIVE_SPREAD
    i = 0
    while len(text) < goal:
        text += template.line(names, i, k)
        i += 1
    return text + _part_line(template.line(names, i, k))


def _part_line(line: str) -> str:
    """The line up to a token boundary near CUT_FRACTION of its length: before a space, or after `.` or `(`.

    Cutting inside a word would leave a prompt ending in a token the models rarely saw there (`0x0` rather
    than `0x00`), which no model continues well.
    """
    bounds = [p for p in range(1, len(line) - 1)
              if (line[p] == " " and line[p - 1] != " ") or (line[p - 1] in ".(" and line[p].isalpha())]
    before = [p for p in bounds if p <= len(line) * CUT_FRACTION]
    if before:
        return line[: before[-1]]
    return line[: bounds[0]] if bounds else line.rstrip("\n")
