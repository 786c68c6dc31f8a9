"""The code's comments say why; the measured figures live in docs/research/PERFORMANCE.md, which cites
the reports under benchmarks/results/. Checked on the source: no comment cites a dated report
(or STYLE.md, which a user's clone does not have), every report the page links exists, and
every section of the page a comment points to is there."""

from __future__ import annotations

import re
from pathlib import Path

PROJECT_ROOT = Path(__file__).resolve().parents[1]
PACKAGE = PROJECT_ROOT / "cfl_mpi"
PERFORMANCE = PROJECT_ROOT / "docs" / "research" / "PERFORMANCE.md"

DATED_REPORT = re.compile(r"benchmarks/results/\d{8}")
REPORT_LINK = re.compile(r"benchmarks/results/([^)\s`'\"]+)")
POINTER = re.compile(r'docs/research/PERFORMANCE\.md, "([^"]+)"')


def sources() -> list[Path]:
    return sorted(PACKAGE.rglob("*.py"))


def test_no_source_file_cites_a_dated_report_or_style_md() -> None:
    offenders = [
        f"{path.relative_to(PROJECT_ROOT)}:{number}: {line.strip()}"
        for path in sources()
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1)
        if DATED_REPORT.search(line) or "STYLE.md" in line
    ]
    assert not offenders, "cite docs/research/PERFORMANCE.md instead:\n" + "\n".join(offenders)


def test_every_report_the_performance_page_links_exists() -> None:
    linked = set(REPORT_LINK.findall(PERFORMANCE.read_text(encoding="utf-8")))
    assert linked, "docs/research/PERFORMANCE.md links no report under benchmarks/results/"
    missing = sorted(name for name in linked if not (PROJECT_ROOT / "benchmarks" / "results" / name).is_file())
    assert not missing, f"docs/research/PERFORMANCE.md links reports that do not exist: {missing}"


def test_every_section_a_comment_points_to_is_on_the_performance_page() -> None:
    headings = {
        line.lstrip("#").strip()
        for line in PERFORMANCE.read_text(encoding="utf-8").splitlines()
        if line.startswith("#")
    }
    pointers = {
        (path.relative_to(PROJECT_ROOT).as_posix(), section)
        for path in sources()
        for section in POINTER.findall(path.read_text(encoding="utf-8"))
    }
    assert pointers, "no comment in cfl_mpi/ points to docs/research/PERFORMANCE.md"
    dangling = sorted((where, section) for where, section in pointers if section not in headings)
    assert not dangling, f"comments point to sections docs/research/PERFORMANCE.md does not have: {dangling}"
