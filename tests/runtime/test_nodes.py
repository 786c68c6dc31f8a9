"""Jobs across emulated nodes (tests/nodes.py): each node a network namespace with its own host
name, address and private folder; MPI between them over TCP. The results are one machine's,
bit for bit, with each node's silos reading their files from that node's folder alone."""
from __future__ import annotations

import csv
import shutil
from pathlib import Path

import pytest

from cfl_mpi.channel import RankLayout
from cfl_mpi.config import load_config
from cfl_mpi.export import export
from jobs import PROJECT_ROOT, assert_same_results, run_results
from nodes import EmulatedNodes, emulated_nodes  # noqa: F401 - the fixture

pytestmark = [pytest.mark.mpi, pytest.mark.nodes]

QUICK = ["silos=8", "train.rounds=2", "train.local_epochs=1", "model.channels=[8,16]", "strategy.pair_keys=seeded"]
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
    own folders: both runs' results, and the bytes over each node's link."""
    from cfl_mpi.simulate import simulate

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
    return {"one": run_results(tmp_path / "one_machine"), "nodes": run_results(tmp_path / "nodes"), "bytes": crossed}


def assert_bit_for_bit(run: dict) -> None:
    assert_same_results(run["one"], run["nodes"])
    assert all(n > 1_000_000 for n in run["bytes"].values()), run["bytes"]  # MPI on the links, every node's


def test_the_quick_start_across_three_nodes_gives_one_machines_results_bit_for_bit(tmp_path, emulated_nodes):
    nodes = emulated_nodes(3)
    assert_bit_for_bit(across_nodes(tmp_path, nodes, "configs/digits.yaml", QUICK, 8))


def test_rotated_mnist_across_three_nodes_gives_one_machines_results_bit_for_bit(
    tmp_path, emulated_nodes, shared_data
):
    sets = [f"data.root={shared_data / 'mnist'}", "data.download=false", "silos=16", "data.silo_images=600", "train.rounds=1",
            "train.local_epochs=1", "model.channels=[8,16]", "strategy.pair_keys=seeded"]  # fmt: skip
    nodes = emulated_nodes(3)
    assert_bit_for_bit(across_nodes(tmp_path, nodes, "configs/rotated.yaml", sets, 16))
