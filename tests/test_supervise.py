"""The launcher's watch (supervise.py): what it makes of the launcher's words and nodes.json."""
from __future__ import annotations

import io
import json

from cfl_mpi.results import write_nodes
from cfl_mpi.supervise import LauncherWords, _what_ended

# MPICH's mpiexec, as it reports a rank that ended badly, and a node's proxy gone
BAD_TERMINATION = """
===================================================================================
=   BAD TERMINATION OF ONE OF YOUR APPLICATION PROCESSES
=   PID 3197 RUNNING AT node3
=   EXIT CODE: 9
===================================================================================
"""
PROXY_GONE = "[mpiexec@head] control_cb (/mpich/src/pm/hydra/mpiexec/pmiserv_cb.c:280): assert (!closed) failed\n"


def words(text: str) -> LauncherWords:
    reader = LauncherWords(io.StringIO(text), io.StringIO())
    reader.run()
    assert reader.to.getvalue() == text  # passed on as it came
    return reader


def folder(tmp_path):
    write_nodes(tmp_path, ["node1", "node1", "node2", "node2", "node3"], [10, 11, 20, 21, 3197],
                [[], [0, 1], [2, 3], [4, 5], [6, 7]])  # fmt: skip
    return tmp_path


def test_nodes_json_lists_each_host_in_rank_order_with_its_ranks_pids_and_silos(tmp_path):
    nodes = json.loads((folder(tmp_path) / "nodes.json").read_text())["nodes"]
    assert [n["host"] for n in nodes] == ["node1", "node2", "node3"]
    assert nodes[2]["ranks"] == [{"rank": 4, "pid": 3197, "silos": [6, 7]}]


def test_a_rank_the_launcher_names_by_pid_and_host_is_named_with_its_silos(tmp_path):
    said = words(BAD_TERMINATION)
    assert said.bad_termination == (3197, "node3") and not said.proxy_gone
    assert _what_ended(folder(tmp_path), 255, said.bad_termination, None).startswith(
        "rank 4 (silos 6-7) on node3 ended without a word, and the launcher ended the job (exit 255)"
    )


def test_a_proxy_gone_names_its_node_with_every_rank_and_silo_there(tmp_path):
    said = words(PROXY_GONE)
    assert said.proxy_gone and said.bad_termination is None
    assert _what_ended(folder(tmp_path), 255, None, 1).startswith(
        "node node2 lost: its processes ended, ranks 2-3 (silos 2-5) with them"
    )


def test_without_nodes_json_or_a_clue_the_line_says_what_is_known(tmp_path):
    assert _what_ended(tmp_path, 255, None, None) == (
        "the launcher ended the job (exit 255) before any rank could say why"
    )
    assert "the launcher's lines above say more" in _what_ended(folder(tmp_path), 1, None, None)
    assert _what_ended(folder(tmp_path), 255, (999, "node9"), None).startswith(
        "a process on node9 (pid 999) ended without a word"
    )
