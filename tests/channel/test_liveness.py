"""Heartbeats (backends/mpi/liveness.py): a rank that falls silent is named with its node, its
ranks and silos within the timeout; one that said goodbye is no longer watched; a heartbeat
that is not one ends the wait naming its sender."""

from __future__ import annotations

import json

import pytest
from jobs import PROJECT_ROOT, run_mpi

from cfl_mpi.backends.mpi.liveness import Liveness
from cfl_mpi.channel import RankLayout
from cfl_mpi.config import ConfigError, load_config
from cfl_mpi.console import spans


def test_spans_of_ranks_and_silos():
    assert spans([7, 2, 3, 4]) == "2-4, 7" and spans([5]) == "5"


def watcher(hosts: list[str], heard: dict[int, float], silos: int = 8) -> Liveness:
    """Rank 0's Liveness as it stands after the beats `heard` (no MPI: its description only)."""
    live = object.__new__(Liveness)
    live.layout, live.hosts, live.interval_s, live.timeout_s = RankLayout(silos, len(hosts) - 1), hosts, 2.0, 30.0
    live.heard = heard
    return live


def test_a_node_whose_ranks_all_fell_silent_is_named_with_its_ranks_and_silos():
    live = watcher(["a", "a", "b", "b", "c"], {1: 100.0, 2: 60.0, 3: 61.0, 4: 100.0})
    assert live.describe(2, 100.0) == (
        "node b lost: ranks 2-3 (silos 2-5) silent for 40 s (its processes died, or its link is down)"
    )


def test_a_rank_silent_while_its_node_beats_is_named_alone():
    live = watcher(["a", "a", "b", "b", "c"], {1: 100.0, 2: 60.0, 3: 99.0, 4: 100.0})
    assert live.describe(2, 100.0).startswith("rank 2 (silos 2-3) on b silent for 40 s while its node's other ranks")


def test_any_message_from_a_watched_rank_counts_as_hearing_it_and_a_rank_that_said_goodbye_stays_unwatched():
    """Under load a rank's beats can wait behind its other traffic: its messages prove it alive."""
    live = watcher(["a", "a", "b"], {1: 60.0})  # rank 2 said goodbye
    live.heard_from(1, 95.0)
    live.heard_from(2, 95.0)
    assert live.heard == {1: 95.0}


def test_the_heartbeat_timeout_must_span_three_beats(tmp_path):
    with pytest.raises(ConfigError, match=r"^runtime.heartbeat_timeout_s: must be at least 3 heartbeats"):
        load_config(PROJECT_ROOT / "configs/digits.yaml", ["runtime.heartbeat_s=5", "runtime.heartbeat_timeout_s=10"])


@pytest.mark.mpi
def test_under_mpirun_a_silent_rank_is_named_within_the_timeout_and_a_forged_beat_is_refused():
    result = run_mpi(4, [str(PROJECT_ROOT / "tests" / "mpi_scripts" / "liveness.py")], timeout=120)
    assert result.returncode == 0, result.stderr[-3000:]
    report = json.loads(result.stdout.strip().splitlines()[-1])
    assert report["lost"].startswith("rank 3 (silo 2) on vm silent for 1 s while its node's other ranks beat")
    assert 1.2 <= report["after_s"] < 3  # the timeout, and not much later
    assert report["watched"] == [2, 3]  # rank 1 said goodbye
    assert report["hostile"] == "rank 1 sent rank 0 a heartbeat of 5 bytes, unasked"
