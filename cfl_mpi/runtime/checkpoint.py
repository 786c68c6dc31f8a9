"""The server's checkpoint after every round: enough to continue as if never stopped.

Silos keep nothing that cannot be rebuilt (their data come from the config, their RNG
streams from (seed, silo, round)), so the server's state is the whole run's state:
the round, every silo's current model, the strategy's state (clusters, distances, ...)
and the metrics written so far. Arrays go to an `.npz` without pickle, the rest to JSON;
both are written to temporary names and renamed, so a crash mid-write leaves the
previous checkpoint intact.
"""
from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

CHECKPOINT = "checkpoint"


@dataclass
class Checkpoint:
    round: int
    models: list[dict[str, np.ndarray]]      # distinct models, deduplicated
    silo_model: list[int]                     # silo → index into `models`
    strategy: dict[str, np.ndarray]           # the strategy's arrays
    meta: dict[str, Any]                      # JSON-serialisable strategy and run facts

    def model_of(self, silo: int) -> dict[str, np.ndarray]:
        return self.models[self.silo_model[silo]]


def _atomic_write(path: Path, write) -> None:
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "wb") as fh:
        write(fh)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)


def save_checkpoint(out: Path, state: Checkpoint) -> int:
    """Write `state` into `out/checkpoint/` atomically (arrays first, the JSON index last);
    returns the bytes written."""
    folder = out / CHECKPOINT
    folder.mkdir(parents=True, exist_ok=True)
    arrays = {f"strategy/{k}": v for k, v in state.strategy.items()}
    for i, model in enumerate(state.models):
        arrays.update({f"model{i}/{k}": v for k, v in model.items()})
    npz = f"round{state.round}.npz"
    _atomic_write(folder / npz, lambda fh: np.savez(fh, **arrays))
    index = {"round": state.round, "arrays": npz, "n_models": len(state.models),
             "silo_model": state.silo_model, "meta": state.meta}
    _atomic_write(folder / "index.json", lambda fh: fh.write(json.dumps(index).encode()))
    for old in folder.glob("round*.npz"):  # only after the new index points elsewhere
        if old.name != npz:
            old.unlink()
    return (folder / npz).stat().st_size + (folder / "index.json").stat().st_size


def load_checkpoint(out: Path) -> Checkpoint:
    """Read the checkpoint in `out/checkpoint/`; FileNotFoundError if there is none."""
    folder = out / CHECKPOINT
    index = json.loads((folder / "index.json").read_text())
    with np.load(folder / index["arrays"], allow_pickle=False) as data:
        arrays = {k: data[k] for k in data.files}
    models: list[dict[str, np.ndarray]] = [{} for _ in range(index["n_models"])]
    strategy: dict[str, np.ndarray] = {}
    for key, value in arrays.items():
        group, name = key.split("/", 1)
        if group == "strategy":
            strategy[name] = value
        else:
            models[int(group.removeprefix("model"))][name] = value
    return Checkpoint(index["round"], models, index["silo_model"], strategy, index["meta"])


def dedupe_models(per_silo: list[dict[str, np.ndarray]]) -> tuple[list[dict[str, np.ndarray]], list[int]]:
    """Silos of one cluster share one model object: store it once."""
    models: list[dict[str, np.ndarray]] = []
    seen: dict[int, int] = {}
    index = []
    for model in per_silo:
        if id(model) not in seen:
            seen[id(model)] = len(models)
            models.append(model)
        index.append(seen[id(model)])
    return models, index
