"""The run's results folder (rank 0 only): resolved config, per-round metrics, distances,
clusters, summary and plots."""

from __future__ import annotations

import json
import shutil
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import yaml

from ..config import Config
from .plots import accuracy_curves, pairwise_heatmap

# What a run writes into its folder (README, "Results folder"): the first four mark a folder
# that holds a run; `--overwrite` removes all of them, and the *.npy/*.csv arrays, before a
# new run starts there. Anything else (a launcher's log.txt) stays.
RUN_MARKS = ("config.yaml", "metrics.jsonl", "summary.json", "checkpoint")
FAILURE = "failure.txt"  # why an attempt stopped; a resumed run appends to it
NODES = "nodes.json"  # where each rank and silo of the latest attempt ran
RUN_FILES = (*RUN_MARKS, "clusters.json", "distances.png", "accuracy.png", FAILURE, NODES)
RUN_ARRAYS = ("*.npy", "*.csv")


def run_files(out: Path) -> list[str]:
    """The marks of a run found in `out` (empty: no run there)."""
    return [name for name in RUN_MARKS if (out / name).exists()]


def remove_run(out: Path) -> None:
    """Delete an earlier run's files from `out` (`--overwrite`, once every check passed)."""
    for path in [out / name for name in RUN_FILES] + [p for g in RUN_ARRAYS for p in out.glob(g)]:
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path)
        elif path.exists() or path.is_symlink():
            path.unlink()


def record_failure(out: Path, text: str) -> None:
    """Append why the run stopped to the folder's failure.txt. The console is not enough:
    output written just before MPI_Abort may never reach mpirun (chapel-lang/chapel#14464,
    flux-framework/flux-core#3894). A rank that does not see the folder (another node's
    disk) writes nothing; the server's own record is the one that counts."""
    if out.is_dir():
        try:
            with (out / FAILURE).open("a") as f:
                f.write(text.rstrip() + "\n")
        except OSError:
            pass


def write_nodes(out: Path, hosts: list[str], pids: list[int], silos_of_rank: list[list[int]]) -> None:
    """`nodes.json`: the job's hosts in the order of their first rank (the order of MPICH's
    proxies: commands/supervise.py names a lost node by it), each with its ranks: their process ids and
    silos."""
    nodes: dict[str, list[dict]] = {}
    for rank, (host, pid, silos) in enumerate(zip(hosts, pids, silos_of_rank)):
        nodes.setdefault(host, []).append({"rank": rank, "pid": pid, "silos": silos})
    out.mkdir(parents=True, exist_ok=True)
    (out / NODES).write_text(json.dumps({"nodes": [{"host": h, "ranks": r} for h, r in nodes.items()]}) + "\n")


class RunRecorder:
    """Writes the folder; `done` are the metrics of rounds finished before a resume."""

    def __init__(self, out: Path, cfg: Config, done: Sequence[dict[str, Any]] = ()) -> None:
        self.out = out
        self.cfg = cfg
        out.mkdir(parents=True, exist_ok=True)
        (out / "config.yaml").write_text(yaml.safe_dump(cfg.to_dict(), sort_keys=False))
        self._metrics = (out / "metrics.jsonl").open("w")
        for record in done:
            self.write(record)

    def write(self, record: dict[str, Any]) -> None:
        """One line of metrics.jsonl per round, flushed at once (a crash keeps the rounds done)."""
        self._metrics.write(json.dumps(record) + "\n")
        self._metrics.flush()

    def finish(
        self,
        summary: dict[str, Any],
        records: list[dict[str, Any]],
        clusters: np.ndarray,
        truth: np.ndarray | None,
        artifacts: dict[str, np.ndarray],
    ) -> None:
        self._metrics.close()
        (self.out / "clusters.json").write_text(
            json.dumps(
                {
                    "clusters": {str(s): int(k) for s, k in enumerate(clusters)},
                    **({} if truth is None else {"truth": {str(s): int(k) for s, k in enumerate(truth)}}),
                },
                indent=1,
            )
        )
        for name, array in artifacts.items():
            np.save(self.out / f"{name}.npy", array)
            np.savetxt(self.out / f"{name}.csv", np.atleast_2d(array), delimiter=",", fmt="%.6g")
        (self.out / "summary.json").write_text(json.dumps(summary, indent=1))
        title = f"{self.cfg.name}: {self.cfg.strategy.name}"
        pairwise_heatmap(
            artifacts, truth, title, self.out / "distances.png", found=clusters, strategy=self.cfg.strategy
        )
        per_silo = np.array([[np.nan if a is None else a for a in r["accuracy"]] for r in records])
        accuracy_curves([r["round"] for r in records], per_silo, truth, title, self.out / "accuracy.png", clusters)
