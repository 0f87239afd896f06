"""Reading the guides' examples: the fenced blocks of a section of README.md or docs/*.md, found by its heading.

A block whose info string is ``bash run`` or ``python run`` is runnable: tests/integration/test_docs.py runs every
runnable block of a file, in order. Other blocks are shown only, or read here by a test that checks what they do
against a reference (the MovieLens, split and continuous-training examples).
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass

from tests.conftest import REPO

GUIDES = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]


@dataclass(frozen=True)
class Block:
    """One fenced block: its language (``bash``, ``python``...), whether it is marked runnable, and its text."""

    lang: str
    runnable: bool
    text: str


def blocks(text: str) -> list[Block]:
    """The fenced blocks of markdown ``text``, in order."""
    found = re.findall(r"^```([^\n]*)\n(.*?)^```$", text, re.S | re.M)
    return [Block((info.split() or [""])[0], info.split()[1:] == ["run"], body) for info, body in found]


def section(heading: str) -> str:
    """The text under the one heading ``heading`` (any level) of the guides, up to the next heading of its level or
    above."""
    for path in GUIDES:
        text = path.read_text()
        plain = _without_fences(text)  # the same offsets, no line of a block
        found = re.search(rf"^(#+) {re.escape(heading)}\n", plain, re.M)
        if found:
            end = re.compile(rf"^#{{1,{len(found[1])}}} ", re.M).search(plain, found.end())
            return text[found.end() : end.start() if end else len(text)]
    raise AssertionError(f"no section '{heading}' in {[str(p.relative_to(REPO)) for p in GUIDES]}")


def _without_fences(text: str) -> str:
    """``text`` with the lines of fenced blocks blanked (same length), so a comment starting with # inside a block is
    no heading."""
    return re.sub(r"^```.*?^```$", lambda m: re.sub(r"[^\n]", " ", m[0]), text, flags=re.S | re.M)


def section_blocks(heading: str, lang: str = "python") -> list[str]:
    """The texts of the ``lang`` blocks of the section ``heading``."""
    found = [b.text for b in blocks(section(heading)) if b.lang == lang]
    assert found, f"no {lang} block under '{heading}'"
    return found


def section_commands(heading: str) -> list[list[str]]:
    """The ``etl`` command lines of the first bash block of the section ``heading``, split as the shell would."""
    lines = section_blocks(heading, "bash")[0].replace("\\\n", " ").splitlines()
    return [shlex.split(ln) for ln in lines if ln.startswith("etl ")]
