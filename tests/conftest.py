"""Shared test fixtures: where the real test data lives, and skipping when it is absent."""

from __future__ import annotations

from pathlib import Path

import jobs
import pytest
from hypothesis import settings
from nodes import emulated_nodes  # noqa: F401 - the fixture of the tests across emulated nodes

# Property tests check results, never timings: this machine and CI are shared and noisy.
settings.register_profile("cfl_mpi", deadline=None)
settings.load_profile("cfl_mpi")

PROJECT_ROOT = Path(__file__).resolve().parents[1]
SHARED_DATA = PROJECT_ROOT.parent / "shared" / "data"


@pytest.fixture(scope="session")
def shared_data() -> Path:
    """`../shared/data` beside the project (CI and developers have it, a user's clone does not)."""
    if not SHARED_DATA.is_dir():
        pytest.skip(f"real test data not found at {SHARED_DATA} (only beside the developers' checkout)")
    return SHARED_DATA


def pytest_runtest_setup(item: pytest.Item) -> None:
    """Before the test's fixtures (a module's shared job among them): which markers it has."""
    jobs.running_marks = frozenset(mark.name for mark in item.iter_markers())
