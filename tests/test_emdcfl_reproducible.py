"""Speed work must not move W (issue 13): a seeded EMD-CFL run of this tree gives the clusters,
W and τ that the code before the speed work (commit BEFORE_COMMIT) gives on the same machine,
and every W1 the server solves equals POT's network simplex on the same embeddings.

Both trees run here, side by side: float32 training and embedding round off differently on
different CPUs (a fixture written on one machine differed from a run on another by 2.6e-4),
so only a comparison on the machine at hand can tell a change of the code from the hardware.
"""
import io
import os
import shutil
import subprocess
import sys
import tarfile

import numpy as np
import ot
import pytest

from cfl_mpi.algorithms.emdcfl import EmdCfl
from cfl_mpi.ot.wasserstein import ground_cost
from jobs import PROJECT_ROOT, read_results, simulate_job

pytestmark = pytest.mark.job

BEFORE_COMMIT = "703ab81"  # the code before issue 13's speed work
CONFIG = "configs/digits.yaml"
# 6 silos in 3 rotations, one round of one epoch of a slim CNN: every EMD-CFL pair is measured.
OVERRIDES = ["silos=6", "data.rotations=[0,90,180]", "train.rounds=1", "train.local_epochs=1",
             "model.channels=[16,32]", "strategy.pair_keys=seeded"]


@pytest.fixture(scope="module")
def before_run(tmp_path_factory):
    """The results folder of the same run by the code of BEFORE_COMMIT (git archive of this clone)."""
    git = shutil.which("git")
    if git is None or subprocess.run([git, "cat-file", "-e", f"{BEFORE_COMMIT}^{{commit}}"], cwd=PROJECT_ROOT,
                                     capture_output=True).returncode:
        pytest.skip(f"needs git and commit {BEFORE_COMMIT} in this clone (a shallow clone lacks it)")
    tree, out = tmp_path_factory.mktemp("before_tree"), tmp_path_factory.mktemp("before_run")
    archive = subprocess.run([git, "archive", "--format=tar", BEFORE_COMMIT, "cfl_mpi", "configs"],
                             cwd=PROJECT_ROOT, capture_output=True, check=True).stdout
    with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
        tar.extractall(tree, filter="data")
    sets = [a for o in OVERRIDES for a in ("--set", o)]
    probe = "import cfl_mpi, sys; sys.stdout.write(cfl_mpi.__file__)"
    env = {**os.environ, "PYTHONPATH": str(tree), "OMP_NUM_THREADS": "1"}
    imported = subprocess.run([sys.executable, "-c", probe], cwd=tree, env=env, capture_output=True, text=True)
    assert imported.stdout.startswith(str(tree)), f"the old tree's cfl_mpi was not the one imported: {imported}"
    proc = subprocess.run([sys.executable, "-m", "cfl_mpi.simulate", CONFIG, "--out", str(out), "--overwrite", *sets],
                          cwd=tree, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return out


def emd2(x: np.ndarray, y: np.ndarray, metric: str) -> float:
    """The plain reference: POT's exact solver on the full transport plan."""
    n, m = len(x), len(y)
    return float(ot.emd2(np.full(n, 1 / n), np.full(m, 1 / m), ground_cost(x, y, metric), numItermax=10_000_000))


def test_seeded_run_gives_the_clusters_and_w_of_the_code_before(before_run, tmp_path, monkeypatch):
    solved: list[tuple[np.ndarray, np.ndarray, str, float]] = []
    server_w1 = EmdCfl._w1

    def recording_w1(self, x, y):
        value = server_w1(self, x, y)
        solved.append((x, y, self.params.ground_cost, value))
        return value

    monkeypatch.setattr(EmdCfl, "_w1", recording_w1)
    _, records = simulate_job(CONFIG, tmp_path, *OVERRIDES)
    _, before = read_results(before_run)
    assert records[0]["clusters"] == before[0]["clusters"]
    for name in ("W", "tau"):
        np.testing.assert_allclose(np.load(tmp_path / f"{name}.npy"), np.load(before_run / f"{name}.npy"),
                                   rtol=0, atol=1e-9, err_msg=name)
    silos = len(records[0]["clusters"])
    assert len(solved) == silos * (silos - 1)
    for x, y, metric, value in solved:
        assert value == pytest.approx(emd2(x, y, metric), abs=1e-9)
