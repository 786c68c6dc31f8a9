"""No party imports a module inside a round: every strategy half names what it calls into
(`modules()`) and the runtime loads it when the party starts. A simulated run of each
strategy records, by an audit hook, the modules first imported while the server ran a round,
a silo half took a step, or a compute worker trained, embedded or evaluated
(imports_in_rounds.py); the list must be empty. POT alone took 4 s of a silo's first
clustering round on a 16-core node when it was imported there."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
SMALL = ["silos=4", "data.rotations=[0,180]", "train.rounds=2", "train.local_epochs=1", "model.channels=[8,16]"]
CASES = {
    "emdcfl": ["configs/digits.yaml"],
    "emdcfl_fedwad_mode": ["configs/digits_fedwad.yaml"],
    "emdcfl_energy_staged_sinkhorn_free": [
        "configs/digits.yaml",
        "strategy.distance=energy",
        "strategy.ground_cost=chordal",
        "strategy.pairs=staged",
        "strategy.pair_sample=2",
    ],
    "emdcfl_sinkhorn": ["configs/digits.yaml", "strategy.distance=sinkhorn"],
    "pacfl": ["configs/digits.yaml", "strategy.name=pacfl"],
    "fedwad": ["configs/digits.yaml", "strategy.name=fedwad"],
    "cfl_trimmed_mean": ["configs/digits.yaml", "strategy.name=cfl", "aggregation.rule=trimmed_mean"],
    "ifca": ["configs/digits.yaml", "strategy.name=ifca"],
}


@pytest.mark.job
@pytest.mark.parametrize("case", CASES)
def test_no_module_is_imported_inside_a_round(case):
    config, *overrides = CASES[case]
    done = subprocess.run(
        [sys.executable, str(HERE / "imports_in_rounds.py"), config, *SMALL, *overrides],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    imported = json.loads(done.stdout.splitlines()[-1])
    assert imported == [], f"imported inside a round (module, thread): {imported[:20]}"
