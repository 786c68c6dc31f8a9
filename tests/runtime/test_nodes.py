"""Jobs across emulated nodes (tests/nodes.py): each node a network namespace with its own host
name, address and private folder; MPI between them over TCP. The results are one machine's,
bit for bit, with each node's silos reading their files from that node's folder alone."""

from __future__ import annotations

import csv
import json
import shutil
from pathlib import Path

import pytest
from jobs import PROJECT_ROOT, assert_same_results, run_results
from nodes import EmulatedNodes

from cfl_mpi.channel import RankLayout
from cfl_mpi.commands.export import export
from cfl_mpi.config import load_config

pytestmark = [pytest.mark.mpi, pytest.mark.nodes]

QUICK = ["silos=8", "train.rounds=2", "train.local_epochs=1", "model.channels=[8,16]", "strategy.pair_keys=seeded"]
SECURE = ["aggregation.screen=false", "aggregation.secure=true"]
# The server and a silo rank on node1, two silo ranks on node2, one on node3.
RANKS = {"node1": 2, "node2": 2, "node3": 1}


def spread(exported: Path, nodes: EmulatedNodes, ranks: dict[str, int], silos: int) -> dict[str, set[str]]:
    """Move each silo's file to the folder of the node its rank runs on, and point the manifest
    at the path where every node sees its own folder; {node: its files}."""
    layout = RankLayout(silos, sum(ranks.values()) - 1)
    hosts = [host for host, n in ranks.items() for _ in range(n)]  # rank -> node, as mpiexec places them
    manifest = exported / "manifest.csv"
    rows = list(csv.DictReader(manifest.open()))
    placed: dict[str, set[str]] = {host: set() for host in ranks}
    for row in rows:
        host = hosts[layout.rank_of(int(row["silo"]))]
        shutil.move(exported / row["path"], nodes.folder(host) / row["path"])
        placed[host].add(row["path"])
        row["path"] = str(nodes.local / row["path"])
    with manifest.open("w", newline="") as file:
        writer = csv.DictWriter(file, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    return placed


def across_nodes(tmp_path: Path, nodes: EmulatedNodes, config: str, sets: list[str], silos: int) -> dict:
    """The built-in config in the simulator, and its export run across the nodes from their
    own folders: both runs' results, the bytes over each node's link, and the metrics."""
    from cfl_mpi.backends.simulate import simulate

    built_in = load_config(PROJECT_ROOT / config, [*sets, f"out={tmp_path / 'one_machine'}"])
    exported = export(built_in, tmp_path / "files")
    placed = spread(tmp_path / "files", nodes, RANKS, silos)
    simulate(built_in)
    before = nodes.link_bytes()
    job = nodes.run(RANKS, ["-m", "cfl_mpi.main", str(exported), "--out", str(tmp_path / "nodes"), "--quiet"])
    assert job.returncode == 0, job.stdout[-2000:] + job.stderr[-4000:]
    crossed = {host: n - before[host] for host, n in nodes.link_bytes().items()}
    print(f"{config}: bytes over each node's link {crossed}")
    for host, files in placed.items():  # each node's folder holds its own silos' files, and only those
        assert {p.name for p in nodes.folder(host).iterdir()} == files
    metrics = [json.loads(line) for line in (tmp_path / "nodes" / "metrics.jsonl").read_text().splitlines()]
    return {"one": run_results(tmp_path / "one_machine"), "nodes": run_results(tmp_path / "nodes"), "bytes": crossed,
            "metrics": metrics}  # fmt: skip


def assert_bit_for_bit(run: dict) -> None:
    assert_same_results(run["one"], run["nodes"])
    assert all(n > 1_000_000 for n in run["bytes"].values()), run["bytes"]  # MPI on the links, every node's


def test_the_quick_start_across_three_nodes_one_of_them_slow_gives_one_machines_results_bit_for_bit(
    tmp_path, emulated_nodes
):
    """node3's link limited to 5 Mbit/s: the same results, and the update that came last each
    round is from node3's silos, at least as late as their bytes take over that link (its two
    silos' updates, ~0.8 MB: 1.3 s; a round's training takes ~0.7 s here)."""
    nodes = emulated_nodes(3)
    nodes.slow("node3", rate="5mbit")
    run = across_nodes(tmp_path, nodes, "configs/digits.yaml", QUICK, 8)
    assert_bit_for_bit(run)
    slowest = [r["slowest_update"] for r in run["metrics"]]
    print(f"slow node: the last updates {slowest}")
    assert all(s["host"] == "node3" and s["silo"] in (6, 7) for s in slowest), slowest
    at_link_rate = [2 * r["bytes"]["update"] / 8 / (5e6 / 8) for r in run["metrics"]]  # rank 4's two updates
    assert all(s["seconds"] >= t for s, t in zip(slowest, at_link_rate)), (slowest, at_link_rate)


def test_rotated_mnist_across_three_nodes_gives_one_machines_results_bit_for_bit(tmp_path, emulated_nodes, shared_data):
    sets = [f"data.root={shared_data / 'mnist'}", "data.download=false", "silos=16", "data.silo_images=600",
            "train.rounds=1", "train.local_epochs=1", "model.channels=[8,16]", "strategy.pair_keys=seeded"]  # fmt: skip
    nodes = emulated_nodes(3)
    assert_bit_for_bit(across_nodes(tmp_path, nodes, "configs/rotated.yaml", sets, 16))


def test_secure_aggregation_across_three_nodes_gives_one_machines_results_bit_for_bit(tmp_path, emulated_nodes):
    """Keys, shares and masked updates from the silo ranks of three nodes over their links: the
    masks cancel exactly, so the results are the simulated run's, bit for bit."""
    nodes = emulated_nodes(3)
    run = across_nodes(tmp_path, nodes, "configs/digits.yaml", [*QUICK, *SECURE], 8)
    assert_bit_for_bit(run)
    assert all(r["masked"] and r["bytes"]["mask_key"] > 0 and r["bytes"]["update"] == 0 for r in run["metrics"])


# --------------------------------------------------------------------------- a node lost
# The quick start's data (built in: every node reads it from the shared folder, so the nodes
# left can resume the lost node's silos), rounds long enough to lose a node in the middle of one.
LOST = [*QUICK[:1], "train.rounds=3", "train.local_epochs=2", *QUICK[3:]]
# The cut is noticed after runtime.heartbeat_timeout_s (30 s by default: the job ended 30.2 s
# after the cut); the tests take 15 s.
HEARTBEAT_TIMEOUT_S = 15


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory) -> dict:
    """The run no node is lost from (the simulator's results are every rank layout's)."""
    from jobs import require_slow_marker

    from cfl_mpi.backends.simulate import simulate

    require_slow_marker("the uninterrupted run")
    out = tmp_path_factory.mktemp("uninterrupted")
    simulate(load_config(PROJECT_ROOT / "configs/digits.yaml", [*LOST, f"out={out}"]))
    return run_results(out)


def lose_a_node(tmp_path: Path, nodes: EmulatedNodes, how: str) -> tuple[float, str, Path]:
    """Start the job across the nodes as launch/run.sh does (python -m cfl_mpi.commands.launch: mpirun,
    watched), lose node3 (`how`: kill or cut) as round 2 starts; (seconds from the loss to the
    job's end, its output, the results folder)."""
    import time

    out = tmp_path / "run"
    sets = [a for s in [*LOST, "runtime.silos_per_rank=2", f"runtime.heartbeat_timeout_s={HEARTBEAT_TIMEOUT_S}"]
            for a in ("--set", s)]  # fmt: skip
    job = nodes.start(RANKS, ["configs/digits.yaml", "--out", str(out), *sets], launch=True)
    metrics = out / "metrics.jsonl"
    deadline = time.monotonic() + 300
    while not (metrics.exists() and metrics.read_text().strip()):
        assert job.poll() is None and time.monotonic() < deadline, job.communicate()[1][-3000:]
        time.sleep(0.05)
    lost_at = time.monotonic()
    getattr(nodes, how)("node3")
    try:
        said, err = job.communicate(timeout=120)
    finally:
        nodes.kill("node3")  # a cut node's processes live on: gone with their node
    return time.monotonic() - lost_at, said + err, out


def resume_on_the_nodes_left(nodes: EmulatedNodes, out: Path) -> dict:
    """--resume on node1 and node2 only: 3 ranks, 4 silos a rank (the run had 2)."""
    job = nodes.run({"node1": 2, "node2": 1}, ["-m", "cfl_mpi.main", "configs/digits.yaml", "--resume", str(out),
                                               "--quiet", *[a for s in LOST for a in ("--set", s)]])  # fmt: skip
    assert job.returncode == 0, job.stderr[-4000:]
    return run_results(out)


def test_a_node_whose_link_is_cut_ends_the_job_naming_it_and_the_run_resumes_on_the_nodes_left(
    tmp_path, emulated_nodes, uninterrupted
):
    from cfl_mpi.runtime.checkpoint import checkpoint_round

    nodes = emulated_nodes(3)
    seconds, err, out = lose_a_node(tmp_path, nodes, "cut")
    failure = (out / "failure.txt").read_text()
    print(f"link cut: the job ended {seconds:.1f} s later: {failure}")
    assert "node node3 lost: rank 4 (silos 6-7) silent for" in failure and "--resume" in failure, failure
    assert "node node3 lost" in err
    assert seconds <= HEARTBEAT_TIMEOUT_S + 15
    assert checkpoint_round(out) in (1, 2)
    (out / "failure.txt").unlink()
    assert_same_results(uninterrupted, resume_on_the_nodes_left(nodes, out))


def test_a_node_whose_processes_are_killed_ends_the_job_at_once_and_the_run_resumes_on_the_nodes_left(
    tmp_path, emulated_nodes, uninterrupted
):
    """Every process of node3 SIGKILLed mid-round: MPICH's launcher ends the job at once (its
    proxy on the node is gone too) before a rank can speak; its watch names the node. The
    checkpoint is intact and the nodes left resume."""
    from cfl_mpi.runtime.checkpoint import checkpoint_round

    nodes = emulated_nodes(3)
    seconds, err, out = lose_a_node(tmp_path, nodes, "kill")
    failure = (out / "failure.txt").read_text()
    print(f"node killed: the job ended {seconds:.1f} s later: {failure}")
    assert failure.startswith("cfl_mpi: node node3 lost: its processes ended, rank 4 (silos 6-7) with them"), failure
    assert "node node3 lost" in err and f"--resume {out}" in failure
    assert seconds <= 30
    (out / "failure.txt").unlink()
    assert checkpoint_round(out) in (1, 2)
    assert_same_results(uninterrupted, resume_on_the_nodes_left(nodes, out))
