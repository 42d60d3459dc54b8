"""Held-out prompts: snippets of the standard library's held-out files, which no pool model trained on.

A snippet starts at the first line break past 40% of its file (past the license header and imports)
and ends at the last line break within PROMPT_CHARS characters.
"""

from __future__ import annotations

from specrouter.pool import corpus

PROMPT_CHARS = 160  # a prompt ends at the last line break within this many characters


def heldout_code_prompts(count: int, min_chars: int = 40) -> list[str]:
    """`count` prompts from distinct held-out files (evenly spread, sorted by path): deterministic."""
    _, heldout = corpus.split(corpus.stdlib_files())
    snippets = []
    for f in heldout:
        start = f.text.find("\n", len(f.text) * 2 // 5) + 1
        text = f.text[start:]
        cut = text.rfind("\n", 0, PROMPT_CHARS)
        snippet = text[: cut + 1] if cut >= min_chars else text[:PROMPT_CHARS]
        if len(snippet) >= min_chars:
            snippets.append(snippet)
    if len(snippets) < count:
        raise ValueError(f"only {len(snippets)} held-out files are long enough; asked for {count}")
    stride = len(snippets) / count
    return [snippets[int(i * stride)] for i in range(count)]
