"""The scheduler report's workloads: three deterministic kinds of prompt, and the JSON-lines prompts file."""

from __future__ import annotations

import ast
import collections
import json
import re
from importlib import resources

import pytest

from specrouter.report.workloads import (CODE, PROSE, REPETITIVE, Prompt, builtin_prompts, by_kind, load_prompts,
                                         prose_passages)

PER_KIND = 8
MIN_REPEATS = 5  # a repetitive prompt has a line shape at least this often
ENGLISH_FUNCTION_WORDS = frozenset("the a an and of to in on is was it that for with but".split())


@pytest.fixture(scope="module")
def prompts() -> list[Prompt]:
    return builtin_prompts(PER_KIND)


def line_shape(line: str) -> str:
    """The line with every word and number made `w`, its trailing comment dropped: `    ('w', w.w, w),`."""
    return re.sub(r"\w+", "w", line.split("#")[0])


def test_every_kind_in_order(prompts) -> None:
    groups = by_kind(prompts)
    assert list(groups) == [CODE, REPETITIVE, PROSE]
    assert all(len(group) == PER_KIND for group in groups.values())


def test_deterministic_and_distinct(prompts) -> None:
    assert builtin_prompts(PER_KIND) == prompts
    texts = [p.prompt for p in prompts]
    assert len(set(texts)) == len(texts)


def test_repetitive_prompts_repeat_a_line_and_stop_mid_line(prompts) -> None:
    for p in by_kind(prompts)[REPETITIVE]:
        shapes = collections.Counter(line_shape(line) for line in p.prompt.splitlines())
        shape, count = shapes.most_common(1)[0]
        assert count >= MIN_REPEATS, (shape, p.prompt)
        assert 300 <= len(p.prompt) <= 600
        assert not p.prompt.endswith("\n") and not p.prompt.endswith(" ")


def test_repetitive_prompts_differ_in_their_identifiers(prompts) -> None:
    headers = [p.prompt.splitlines()[0] for p in by_kind(prompts)[REPETITIVE]]
    assert len(set(headers)) == len(headers)


def test_prose_is_english_not_python() -> None:
    passages = prose_passages()
    assert len(passages) >= 24
    assert len(set(passages)) == len(passages)
    for text in passages:
        assert 150 <= len(text) <= 300, text
        with pytest.raises(SyntaxError):
            ast.parse(text)
        words = set(re.findall(r"[a-z]+", text.lower()))
        assert len(words & ENGLISH_FUNCTION_WORDS) >= 3, text
        assert not re.search(r"\bdef |\bimport |self\.|\):|[{}\[\]=_]", text), text


def test_prose_ships_as_package_data() -> None:
    assert resources.files("specrouter.report").joinpath("prose.txt").is_file()


def test_builtin_prompts_refuses_more_than_it_holds() -> None:
    with pytest.raises(ValueError, match="prose: only .* load_prompts"):
        builtin_prompts(len(prose_passages()) + 1)
    with pytest.raises(ValueError, match="at least 1"):
        builtin_prompts(0)


def test_by_kind_keeps_first_seen_order() -> None:
    ps = [Prompt("b", "1"), Prompt("a", "2"), Prompt("b", "3")]
    assert by_kind(ps) == {"b": [ps[0], ps[2]], "a": [ps[1]]}
    assert list(by_kind(ps)) == ["b", "a"]


def test_load_prompts(tmp_path) -> None:
    path = tmp_path / "prompts.jsonl"
    path.write_text(json.dumps({"kind": "code", "prompt": "def f():\n"}) + "\n\n   \n"
                    + json.dumps({"kind": "prose", "prompt": "Café au lait, s'il", "note": "extra is ignored"})
                    + "\n", encoding="utf-8")
    assert load_prompts(path) == [Prompt("code", "def f():\n"), Prompt("prose", "Café au lait, s'il")]


GOOD = json.dumps({"kind": "code", "prompt": "x = 1"})


@pytest.mark.parametrize("second_line, fragment", [
    ('{"kind": "code", "prompt": ', "not valid JSON"),
    ('["code", "x"]', "expected a JSON object"),
    ('{"prompt": "x"}', 'missing field "kind"'),
    ('{"kind": "code"}', 'missing field "prompt"'),
    ('{"kind": "code", "prompt": "  "}', 'field "prompt" is empty'),
    ('{"kind": "", "prompt": "x"}', 'field "kind" is empty'),
    ('{"kind": 3, "prompt": "x"}', 'field "kind" must be a string'),
    ('{"kind": "code", "prompt": null}', 'field "prompt" must be a string'),
])
def test_load_prompts_names_the_bad_line(tmp_path, second_line, fragment) -> None:
    path = tmp_path / "prompts.jsonl"
    path.write_text(f"{GOOD}\n\n{second_line}\n{GOOD}\n", encoding="utf-8")
    with pytest.raises(ValueError, match=re.escape(f"{path}, line 3: {fragment}")):
        load_prompts(path)


@pytest.mark.parametrize("content", ["", "\n  \n\n"])
def test_load_prompts_refuses_an_empty_file(tmp_path, content) -> None:
    path = tmp_path / "empty.jsonl"
    path.write_text(content, encoding="utf-8")
    with pytest.raises(ValueError, match=re.escape(f"{path}: no prompts")):
        load_prompts(path)


def test_load_prompts_refuses_non_utf8(tmp_path) -> None:
    path = tmp_path / "latin1.jsonl"
    path.write_bytes(b'{"kind": "prose", "prompt": "caf\xe9"}\n')
    with pytest.raises(ValueError, match=re.escape(f"{path}: not UTF-8")):
        load_prompts(path)
