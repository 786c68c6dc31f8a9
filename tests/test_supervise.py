"""The launcher's watch (commands/supervise.py): what it makes of the launcher's words and nodes.json."""

from __future__ import annotations

import io
import json

from cfl_mpi.commands.supervise import LauncherWords, _what_ended
from cfl_mpi.reporting.results import write_nodes

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


# srun, as it reports the first task (an MPI rank) that ended badly, the others it then ended,
# and a node SLURM lost (seen on this machine's SLURM 22.05, the first two)
SRUN_KILLED = """srun: error: node3: task 4: Killed
srun: launch/slurm: _step_signal: Terminating StepId=45927335.0
srun: error: node1: tasks 0-1: Terminated
"""
SRUN_NODE_FAILURE = "srun: error: Node failure on node2\n"


def test_srun_naming_the_task_that_ended_first_names_its_rank_and_silos(tmp_path):
    from cfl_mpi.commands.supervise import _srun_ended

    said = words(SRUN_KILLED)
    assert said.tasks_ended == ("node3", [4], "Killed") and said.node_failure is None
    assert _srun_ended(folder(tmp_path), 137, None, said.tasks_ended, []).startswith(
        "rank 4 (silos 6-7) on node3 ended (Killed), and srun ended the job (exit 137)"
    )
    assert words("srun: error: node1: tasks 1-2,4: Exited with exit code 1\n").tasks_ended == (
        "node1",
        [1, 2, 4],
        "Exited with exit code 1",
    )


def test_srun_naming_a_node_failure_names_the_node_with_every_rank_and_silo_there(tmp_path):
    from cfl_mpi.commands.supervise import _srun_ended

    said = words(SRUN_NODE_FAILURE)
    assert said.node_failure == "node2"
    assert _srun_ended(folder(tmp_path), 1, said.node_failure, None, []).startswith(
        "node node2 lost (SLURM: node failure): ranks 2-3 (silos 2-5) with it, and srun ended the job"
    )
    assert _srun_ended(tmp_path / "no_nodes_json", 1, "node2", None, []) == (
        "node node2 lost (SLURM: node failure), and srun ended the job (exit 1) before any rank could say why"
    )


def test_the_supervised_command_names_its_results_folder():
    from cfl_mpi.commands.supervise import out_of

    assert str(out_of(["srun", "python", "-m", "cfl_mpi.main", "c.yaml", "--out", "runs/a"])) == "runs/a"
    assert str(out_of(["srun", "python", "-m", "cfl_mpi.main", "c.yaml", "--resume", "runs/b"])) == "runs/b"
    assert out_of(["srun", "python", "-m", "cfl_mpi.main", "c.yaml"]) is None


def test_srun_numbers_a_heterogeneous_jobs_tasks_within_their_component(tmp_path):
    """The server alone in component 0 (rank 0 on node1), the silo ranks in component 1: task
    1 of the silo component on node2 is rank 2 (seen on a real heterogeneous job)."""
    from cfl_mpi.commands.supervise import _srun_ended, het_components

    write_nodes(tmp_path, ["node1", "node2", "node2"], [10, 20, 21], [[], [0, 1], [2, 3]])
    layout = het_components({"SLURM_HET_SIZE": "2", "SLURM_NTASKS_HET_GROUP_0": "1", "SLURM_NTASKS_HET_GROUP_1": "2"})
    assert layout == [1, 2] and het_components({}) == []
    assert _srun_ended(tmp_path, 137, None, ("node2", [1], "Exited with exit code 3"), layout).startswith(
        "rank 2 (silos 2-3) on node2 ended (Exited with exit code 3)"
    )
    assert _srun_ended(tmp_path, 137, None, ("node1", [0], "Killed"), layout).startswith("rank 0 on node1 ended")
    assert _srun_ended(tmp_path / "none", 137, None, ("node2", [0], "Killed"), layout).startswith(
        "task 0 of srun's step on node2 ended (Killed)"
    )
