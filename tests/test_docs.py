"""The docs hold together: every user page is short enough to read, every relative link in
the READMEs and the docs reaches a file (and, with `#anchor`, a heading of that page), and the
docs' index links every page under docs/."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

PROJECT_ROOT = Path(__file__).resolve().parents[1]
DOCS = PROJECT_ROOT / "docs"
INDEX = DOCS / "README.md"
MAX_USER_PAGE = 15 * 1024  # bytes
# Pages that are not user pages: the generated reference, research notes, dated reproductions.
NOT_USER_PAGES = {DOCS / "CONFIG.md"}
NOT_USER_FOLDERS = (DOCS / "research", DOCS / "reproduction")

READMES = [PROJECT_ROOT / name for name in ("README.md", "slurm/README.md", "benchmarks/README.md")]

LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\]]*\])*\]\(([^()\s]+)(?:\s+\"[^\"]*\")?\)")
FENCE = re.compile(r"^(```|~~~).*?^\1", flags=re.S | re.M)
INLINE_CODE = re.compile(r"`[^`\n]*`")


def doc_pages() -> list[Path]:
    return sorted(DOCS.rglob("*.md"))


def user_pages() -> list[Path]:
    return [
        page
        for page in doc_pages()
        if page not in NOT_USER_PAGES and not any(folder in page.parents for folder in NOT_USER_FOLDERS)
    ]


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, markup and punctuation dropped, spaces to -."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link's text
    text = text.strip().lower().replace("`", "")
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def anchors(page: Path) -> set[str]:
    """The anchors of a page's headings, repeated headings numbered as GitHub numbers them."""
    found: set[str] = set()
    seen: dict[str, int] = {}
    for line in FENCE.sub("", page.read_text(encoding="utf-8")).splitlines():
        heading = re.match(r"#{1,6}\s+(.*?)\s*#*\s*$", line)
        if not heading:
            continue
        base = slug(heading[1])
        count = seen.get(base, 0)
        seen[base] = count + 1
        found.add(base if count == 0 else f"{base}-{count}")
    return found


def links(page: Path) -> list[str]:
    """The link targets of a page, outside code blocks and inline code."""
    text = INLINE_CODE.sub("", FENCE.sub("", page.read_text(encoding="utf-8")))
    return LINK.findall(text)


def broken_links(page: Path) -> list[str]:
    broken = []
    for target in links(page):
        if re.match(r"[a-z][a-z0-9+.-]*:", target):  # https:, mailto: ...
            continue
        path, _, anchor = target.partition("#")
        resolved = (page.parent / path).resolve() if path else page
        if not resolved.exists():
            broken.append(f"{target}: no such file")
        elif anchor and resolved.suffix == ".md" and anchor not in anchors(resolved):
            broken.append(f"{target}: no heading with that anchor")
    return broken


def linked_pages(page: Path) -> set[Path]:
    return {
        (page.parent / target.partition("#")[0]).resolve()
        for target in links(page)
        if not re.match(r"[a-z][a-z0-9+.-]*:", target) and target.partition("#")[0]
    }


@pytest.mark.parametrize("page", user_pages(), ids=lambda p: p.relative_to(PROJECT_ROOT).as_posix())
def test_every_user_page_is_short_enough_to_read(page):
    size = len(page.read_bytes())
    assert size <= MAX_USER_PAGE, f"{size} bytes; split it by topic into pages of at most {MAX_USER_PAGE}"


@pytest.mark.parametrize(
    "page",
    [*READMES, *doc_pages()],
    ids=lambda p: p.relative_to(PROJECT_ROOT).as_posix(),
)
def test_every_relative_link_reaches_a_file_and_its_heading(page):
    assert not broken_links(page), "\n".join(broken_links(page))


def test_the_index_links_every_page_under_docs():
    linked = linked_pages(INDEX)
    missing = [p.relative_to(PROJECT_ROOT).as_posix() for p in doc_pages() if p != INDEX and p not in linked]
    assert not missing, f"docs/README.md does not link: {missing}"


def test_the_checks_find_what_they_look_for(tmp_path):
    """A planted broken link, a wrong anchor and a heading's slug, each as GitHub reads them."""
    (tmp_path / "a.md").write_text("# A `b` c: d's (e)\n\n## A\n\n## A\n\n```md\n# not a heading\n[x](gone.md)\n```\n")
    (tmp_path / "b.md").write_text(
        "[ok](a.md#a-b-c-ds-e) [ok](a.md#a-1) [bad](a.md#not-a-heading) [bad](c.md) `[x](y.md)`\n"
    )
    assert anchors(tmp_path / "a.md") == {"a-b-c-ds-e", "a", "a-1"}
    assert broken_links(tmp_path / "a.md") == []
    assert broken_links(tmp_path / "b.md") == [
        "a.md#not-a-heading: no heading with that anchor",
        "c.md: no such file",
    ]
