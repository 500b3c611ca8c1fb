"""Every relative link in README.md and docs/*.md resolves: the file exists and, where the link
names an anchor, the target page has a heading with that GitHub slug. Source comments that cite a
docs page section (``docs/protocol.md#node-lock``, ``docs/protocol.md#admission, #node-lock``) name
one that exists, and none cites the old out-of-tree ``PROTOCOL.md``."""

from __future__ import annotations

import pathlib
import re

import pytest

REPO = pathlib.Path(__file__).resolve().parents[2]
PAGES = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]

_FENCE = re.compile(r"^(```|~~~)")
_INLINE_CODE = re.compile(r"`[^`]*`")
_LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\[\]]*\])*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
_HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$")
_EXTERNAL = re.compile(r"^[a-z][a-z0-9+.-]*:", re.IGNORECASE)
_CITATION = re.compile(r"\bdocs/([\w.-]+\.md)((?:#[\w-]+)(?:,\s*#[\w-]+)*)")
SOURCE_DIRS = ("libs", "services", "tests", "bench", "deploy", "scripts", "proto")
SOURCE_SUFFIXES = {".py", ".proto", ".yaml", ".yml", ".tpl", ".sh", ".toml", ".json"}


def _prose_lines(text: str) -> list[str]:
    """The page's lines outside fenced code blocks."""
    lines, fenced = [], False
    for line in text.splitlines():
        if _FENCE.match(line.lstrip()):
            fenced = not fenced
            continue
        if not fenced:
            lines.append(line)
    return lines


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: link text kept, lower case, punctuation dropped, spaces to '-'."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading)
    text = re.sub(r"<[^>]+>", "", text).strip().lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def anchors(text: str) -> set[str]:
    """Every anchor a page offers: its headings' slugs, repeats numbered as GitHub numbers them."""
    seen: dict[str, int] = {}
    found: set[str] = set()
    for line in _prose_lines(text):
        match = _HEADING.match(line)
        if not match:
            continue
        base = slug(match.group(2))
        count = seen.get(base, 0)
        seen[base] = count + 1
        found.add(base if count == 0 else f"{base}-{count}")
    found.update(re.findall(r"<a\s+(?:name|id)=\"([^\"]+)\"", text))
    return found


def broken_links(page: pathlib.Path) -> list[str]:
    """The relative links of ``page`` that point at no file, or at no heading of their page."""
    problems = []
    for line in _prose_lines(page.read_text()):
        for target in _LINK.findall(_INLINE_CODE.sub("", line)):
            if _EXTERNAL.match(target):
                continue
            path_part, _, anchor = target.partition("#")
            dest = (page.parent / path_part).resolve() if path_part else page
            if not dest.exists():
                problems.append(f"{page.name}: {target}: no such file")
            elif anchor and dest.suffix == ".md" and anchor not in anchors(dest.read_text()):
                problems.append(f"{page.name}: {target}: no heading with that anchor in {dest.name}")
    return problems


def broken_citations(path: pathlib.Path, *, docs: pathlib.Path) -> list[str]:
    """The ``docs/<page>.md#anchor`` citations in a source file that name no page or no heading."""
    problems = []
    text = path.read_text(errors="replace")
    if "PROTOCOL" + ".md" in text:
        problems.append(
            f"{path.name}: cites PROTOCOL.md, which is not in the repository: cite docs/protocol.md"
        )
    for page, tail in _CITATION.findall(text):
        target = docs / page
        if not target.exists():
            problems.append(f"{path.name}: docs/{page}: no such page")
            continue
        offered = anchors(target.read_text())
        for anchor in re.findall(r"#([\w-]+)", tail):
            if anchor not in offered:
                problems.append(f"{path.name}: docs/{page}#{anchor}: no heading with that anchor")
    return problems


def _sources() -> list[pathlib.Path]:
    here = pathlib.Path(__file__).resolve().parent
    return [
        path
        for folder in SOURCE_DIRS
        for path in sorted((REPO / folder).rglob("*"))
        if path.suffix in SOURCE_SUFFIXES and path.is_file() and here not in path.parents
    ]


def test_source_citations_of_docs_sections_resolve() -> None:
    problems = [problem for path in _sources() for problem in broken_citations(path, docs=REPO / "docs")]
    assert problems == []


def test_a_broken_citation_is_reported(tmp_path: pathlib.Path) -> None:
    docs = tmp_path / "docs"
    docs.mkdir()
    (docs / "protocol.md").write_text("# Protocol\n\n## Node lock\n\n## Admission\n")
    source = tmp_path / "mod.py"
    source.write_text(
        '"""The lock (docs/protocol.md#node-lock, #admission); see docs/protocol.md#nowhere,\n'
        "docs/gone.md#x and PROTOCOL" + '.md F.7."""\n'
    )
    assert broken_citations(source, docs=docs) == [
        "mod.py: cites PROTOCOL.md, which is not in the repository: cite docs/protocol.md",
        "mod.py: docs/protocol.md#nowhere: no heading with that anchor",
        "mod.py: docs/gone.md: no such page",
    ]


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(REPO)))
def test_every_relative_link_resolves(page: pathlib.Path) -> None:
    assert broken_links(page) == []


@pytest.mark.parametrize(
    ("heading", "expected"),
    [
        ("Node lock (`hami.io/mutex.lock`)", "node-lock-hamiiomutexlock"),
        ("Throughput through kube-scheduler", "throughput-through-kube-scheduler"),
        ("Filter retries (`retries.py`)", "filter-retries-retriespy"),
        ("/filter and /bind", "filter-and-bind"),
        ("See [the page](x.md) first", "see-the-page-first"),
    ],
)
def test_slug_matches_github(heading: str, expected: str) -> None:
    assert slug(heading) == expected


def test_a_broken_file_or_anchor_is_reported(tmp_path: pathlib.Path) -> None:
    (tmp_path / "other.md").write_text("# Other\n\n## A section\n\n## A section\n")
    page = tmp_path / "page.md"
    page.write_text(
        "# Page\n\n## Here\n\n"
        "[ok](other.md#a-section) [repeat](other.md#a-section-1) [self](#here) [web](https://x.io/#y)\n"
        "[gone](missing.md) [no anchor](other.md#nowhere) [self gone](#there)\n"
        "`[in code](missing-too.md)`\n\n```\n[fenced](missing-three.md)\n```\n"
    )
    assert broken_links(page) == [
        "page.md: missing.md: no such file",
        "page.md: other.md#nowhere: no heading with that anchor in other.md",
        "page.md: #there: no heading with that anchor in page.md",
    ]


def test_garbage_markdown_does_not_crash(tmp_path: pathlib.Path) -> None:
    page = tmp_path / "junk.md"
    page.write_text("[unclosed](\n](x) [[nested]](#) ``` \n# \n#no-space\n[x](#)\n\x00\ufffd")
    assert isinstance(broken_links(page), list)
