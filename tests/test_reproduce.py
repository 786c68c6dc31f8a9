"""`python -m cfl_mpi.experiments.reproduce`: the machinery on one tiny block, the paper scale's sbatch line,
and the paper's figures as transcribed."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time

import pytest
from jobs import PROJECT_ROOT

from cfl_mpi.experiments import reproduce
from cfl_mpi.experiments.paper_figures import TABLE_1_MNIST, TABLE_3_MNIST, TABLE_6

TINY = ("silos=4", "train.rounds=2", "model.channels=[8,16]", "model.embedding_dim=16", "participation.count=2")


@pytest.mark.job
def test_one_tiny_block_writes_the_table_beside_the_paper_and_the_plot(shared_data, tmp_path, capsys):
    sets = [a for o in TINY for a in ("--set", o)]
    code = reproduce.main(
        [
            "E4",
            "--seeds",
            "0",
            "--blocks",
            "1",
            "--out",
            str(tmp_path),
            *sets,
            "--set",
            f"data.root={shared_data / 'mnist'}",
        ]
    )
    assert code == 0
    table = (tmp_path / "table6.md").read_text()
    assert "Rotated MNIST, 10 of 40 silos per round (the paper's Table 6, 10)" in table
    rows = {line.split(" | ")[0].strip("| "): line for line in table.splitlines() if line.startswith("| ")}
    for method in ("EMD-CFL", "Oracle"):
        cells = [c.strip() for c in rows[method].strip("|").split("|")]
        paper_acc, our_acc, paper_ari, our_ari, seeds = cells[1:]
        assert paper_acc == {"EMD-CFL": "93.70 ± 2.11", "Oracle": "93.62 ± 2.12"}[method]
        assert re.fullmatch(r"\d+\.\d\d ± 0\.00", our_acc) and re.fullmatch(r"-?\d\.\d\d ± 0\.00", our_ari)
        assert seeds == "1"
    assert (
        "python -m cfl_mpi.experiments.compare configs/rotated_mnist_test.yaml --methods emdcfl,oracle --seeds 0"
        in table
    )
    assert (tmp_path / "accuracy_per_round.png").stat().st_size > 0
    assert (tmp_path / "block1" / "emdcfl_s0" / "summary.json").exists()
    console = capsys.readouterr().out  # each job's rounds as it runs, then its outcome
    assert "  [emdcfl s0] round 2/2 " in console and "  [oracle s0] round 2/2 " in console
    assert re.search(r"\n\[1/2\] emdcfl seed 0: done in \d+ s: ARI -?\d\.\d{3}, avg acc \d+\.\d\d %", console)


def test_missing_data_is_one_error_before_any_job(tmp_path):
    """Without MNIST (and its download failing) no job starts: one line naming the option and
    the layouts, exit 2, no table, no run folders, no data folder."""
    out, root = tmp_path / "out", tmp_path / "mnist"
    unreachable = {"http_proxy": "http://127.0.0.1:9", "https_proxy": "http://127.0.0.1:9", "no_proxy": ""}
    start = time.monotonic()
    proc = subprocess.run(
        [sys.executable, "-m", "cfl_mpi.experiments.reproduce", "1", "--out", str(out), "--set", f"data.root={root}"],
        cwd=PROJECT_ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, **unreachable},
    )
    assert proc.returncode == 2 and proc.stdout == "", proc.stderr
    (line,) = proc.stderr.splitlines()
    assert line.startswith(
        f"cfl_mpi.experiments.reproduce: config error: data.root: MNIST is not in {root} and downloading it failed ("
    ) and line.endswith(" [Rotated MNIST]")
    assert (
        "(give the folder that holds the files with --set data.root=DIR, where DIR holds the IDX files (gzipped "
        "or not) directly or in DIR/MNIST/raw, as torchvision lays them out; "
    ) in line
    assert list(tmp_path.iterdir()) == []
    print(f"reproduce 1 without MNIST: {time.monotonic() - start:.1f} s")


def test_paper_scale_prints_the_sbatch_line(capsys):
    assert reproduce.main(["1", "--scale", "paper", "--seeds", "0,1"]) == 0
    line = capsys.readouterr().out.strip()
    assert line.startswith("sbatch --nodes=1 --ntasks=41 ")
    assert line.endswith("'python -m cfl_mpi.experiments.reproduce 1 --scale paper --seeds 0,1 --run'")


def test_unknown_table_is_one_line_exit_2(capsys):
    with pytest.raises(SystemExit) as exit_info:
        reproduce.main(["2"])
    assert exit_info.value.code == 2
    assert "TABLE: no reproduction of table '2'" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exit_info:
        reproduce.main(["6", "--methods", "pacfl"])
    assert exit_info.value.code == 2
    assert "--methods: 'pacfl' is not a method of table 6" in capsys.readouterr().err


def test_transcribed_figures_spot_checks():
    """A few cells checked by hand against the EMD-CFL paper's tables."""
    assert TABLE_1_MNIST.figures["emdcfl"]["worst_acc"] == (97.58, 0.26)
    assert TABLE_3_MNIST.figures["fedavg"] == {"target_clean_acc": (97.19, 0.29), "target_backdoor_acc": (88.49, 1.39)}
    assert TABLE_6[30][1].figures["emdcfl"]["avg_acc"] == (94.55, 0.04)
    assert all(set(f) <= set(TABLE_1_MNIST.columns) for f in TABLE_1_MNIST.figures.values())


def test_a_method_whose_runs_all_failed_reads_failed_not_a_dash():
    block = reproduce.TABLES["1"][0]
    failed = reproduce.block_table(
        block, {"emdcfl": []}, block.small, "python -m cfl_mpi.experiments.compare ...", ran=("emdcfl",)
    )
    not_run = reproduce.block_table(block, {}, block.small, "")
    row = next(line for line in failed.splitlines() if line.startswith("| EMD-CFL"))
    assert row.count("failed") == len(block.paper.columns)
    assert "failed" not in not_run
