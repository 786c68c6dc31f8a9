"""The server's checkpoint after every round: enough to continue as if never stopped.

Silos keep nothing that cannot be rebuilt (their data come from the config, their RNG
streams from (seed, silo, round)), so the server's state is the whole run's state:
the round, every silo's current model, the strategy's state (clusters, distances, ...)
and the metrics written so far. Arrays go to an `.npz` without pickle, the rest to JSON;
both are written to temporary names and renamed, so a crash mid-write leaves the
previous checkpoint intact.

A resume trusts nothing in the folder: `index.json` records the SHA-256 of the arrays
file and of the experiment's config (config.config_digest). With one line and exit code 2
before any work, `check_resume` refuses (from index.json and config.yaml, before any rank
imports torch) a checkpoint that is missing, inconsistent, of another config or of a finished
run, and `check_resume_arrays` (after data preparation) one whose arrays are truncated,
altered, or do not fit θ(0) and the strategy.
"""

from __future__ import annotations

import hashlib
import json
import os
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn

import numpy as np
import yaml

from ..config import NOT_THE_EXPERIMENT, ConfigError, config_digest, experiment_dict, read_yaml

if TYPE_CHECKING:
    from ..config import Config

CHECKPOINT = "checkpoint"
INDEX = "index.json"
INDEX_KEYS = ("round", "arrays", "arrays_sha256", "config_sha256", "n_models", "silo_model", "meta")


class CheckpointError(ConfigError):
    """A checkpoint that cannot be continued from; one line, exit code 2 like a config error."""


@dataclass
class Checkpoint:
    round: int
    models: list[dict[str, np.ndarray]]  # distinct models, deduplicated
    silo_model: list[int]  # silo → index into `models`
    strategy: dict[str, np.ndarray]  # the strategy's arrays
    meta: dict[str, Any]  # JSON-serialisable strategy and run facts
    config_sha256: str  # config.config_digest of the run that wrote it

    def model_of(self, silo: int) -> dict[str, np.ndarray]:
        return self.models[self.silo_model[silo]]


def _atomic_write(path: Path, write) -> None:
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "wb") as fh:
        write(fh)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)


def file_sha256(path: Path) -> str:
    """SHA-256 of a file, read in 1 MiB blocks (a 40-silo ResNet checkpoint is GBs)."""
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def save_checkpoint(out: Path, state: Checkpoint) -> int:
    """Write `state` into `out/checkpoint/` atomically (arrays first, the JSON index last);
    returns the bytes written."""
    folder = out / CHECKPOINT
    folder.mkdir(parents=True, exist_ok=True)
    arrays: dict[str, Any] = {f"strategy/{k}": v for k, v in state.strategy.items()}  # Any: savez's **kwds
    for i, model in enumerate(state.models):
        arrays.update({f"model{i}/{k}": v for k, v in model.items()})
    npz = arrays_name(state.round)
    _atomic_write(folder / npz, lambda fh: np.savez(fh, **arrays))
    index = {
        "round": state.round,
        "arrays": npz,
        "arrays_sha256": file_sha256(folder / npz),
        "config_sha256": state.config_sha256,
        "n_models": len(state.models),
        "silo_model": state.silo_model,
        "meta": state.meta,
    }
    _atomic_write(folder / INDEX, lambda fh: fh.write(json.dumps(index).encode()))
    for old in folder.glob("round*.npz"):  # only after the new index points elsewhere
        if old.name != npz:
            old.unlink()
    return (folder / npz).stat().st_size + (folder / INDEX).stat().st_size


def arrays_name(round: int) -> str:
    return f"round{round}.npz"


def load_checkpoint(out: Path) -> Checkpoint:
    """Read and verify the checkpoint in `out/checkpoint/`: the index's fields and types,
    `arrays` a plain file name inside the folder, its SHA-256, and the array names.
    CheckpointError (one line naming the file) on any problem, a missing index included."""
    folder = out / CHECKPOINT
    index = _read_index(folder / INDEX)
    path = folder / index["arrays"]
    if not path.is_file():
        _fail(path, "is missing")
    if file_sha256(path) != index["arrays_sha256"]:
        _fail(path, "does not match the checksum in index.json (truncated or altered)")
    try:
        with np.load(path, allow_pickle=False) as data:
            arrays = {k: data[k] for k in data.files}
    except (OSError, ValueError, zipfile.BadZipFile) as err:
        _fail(path, f"cannot be read ({type(err).__name__})")
    models: list[dict[str, np.ndarray]] = [{} for _ in range(index["n_models"])]
    strategy: dict[str, np.ndarray] = {}
    for key, value in arrays.items():
        group, _, name = key.partition("/")
        number = group.removeprefix("model")
        if group == "strategy" and name:
            strategy[name] = value
        elif number.isdigit() and int(number) < len(models) and name:
            models[int(number)][name] = value
        else:
            _fail(path, f"holds an unexpected array {key!r}")
    if not all(models):
        _fail(path, f"lacks one of the {len(models)} models index.json announces")
    return Checkpoint(index["round"], models, index["silo_model"], strategy, index["meta"], index["config_sha256"])


def checkpoint_round(out: Path) -> int | None:
    """The round the folder's checkpoint was written after, or None where it holds none that reads."""
    try:
        return int(_read_index(out / CHECKPOINT / INDEX)["round"])
    except CheckpointError:
        return None


def resume_hint(out: Path) -> str:
    """What to run after a lost node, from the folder's checkpoint."""
    after = checkpoint_round(out)
    if not after:
        return "no round was checkpointed: start again with --overwrite"
    return (
        f"the checkpoint after round {after} is intact: continue on the nodes left with --resume {out} "
        f"(fewer ranks run more silos each)"
    )


def _read_index(path: Path) -> dict[str, Any]:
    if not path.is_file():
        _fail(
            path.parent.parent,
            "holds no checkpoint/index.json",
            "a run writes it after its first round with runtime.checkpoint: true; start a fresh run with --out",
        )
    try:
        index = json.loads(path.read_text())
    except (UnicodeDecodeError, json.JSONDecodeError):
        _fail(path, "is not valid JSON")
    if not isinstance(index, dict) or set(index) != set(INDEX_KEYS):
        _fail(path, f"must hold exactly the keys {', '.join(INDEX_KEYS)}")
    name = index["arrays"]
    if not isinstance(name, str) or name in ("", ".", "..") or "/" in name or "\\" in name:
        _fail(path, f"arrays: {name!r} is not a plain file name")
    ints = (index["round"], index["n_models"], *_list(index["silo_model"], path))
    if not all(isinstance(v, int) and not isinstance(v, bool) for v in ints):
        _fail(path, "round, n_models and silo_model must be integers")
    if index["round"] < 1 or name != arrays_name(index["round"]):
        _fail(path, f"arrays: {name!r} is not the file of round {index['round']} ({arrays_name(index['round'])})")
    if not 1 <= index["n_models"] or not all(0 <= m < index["n_models"] for m in index["silo_model"]):
        _fail(path, f"silo_model must index the {index['n_models']} models")
    if not all(isinstance(index[k], str) and len(index[k]) == 64 for k in ("arrays_sha256", "config_sha256")):
        _fail(path, "arrays_sha256 and config_sha256 must be SHA-256 hex digests")
    if not isinstance(index["meta"], dict):
        _fail(path, "meta must be a mapping")
    return index


def _list(value: Any, path: Path) -> list:
    if not isinstance(value, list):
        _fail(path, "silo_model must be a list")
    return value


DAMAGED = "a damaged checkpoint cannot be continued: start the run afresh in that folder with --out and --overwrite"


def _fail(path: Path, problem: str, fix: str = DAMAGED) -> NoReturn:
    raise CheckpointError(f"--resume: {path} {problem} ({fix})")


def check_results_folder(cfg: Config, resume: bool, overwrite: bool) -> None:
    """Rank 0 (the only rank sure to see the folder), before data preparation and before any
    rank imports torch, so that a mistaken `--resume` or `--out` is one line at once:
    `--resume` needs a checkpoint whose index and saved config fit (`check_resume`); a fresh
    run refuses a folder that already holds a run, whose rounds it would mix with its own,
    unless `--overwrite` asks to replace it. What needs θ(0) is `check_resume_arrays`, later."""
    from ..reporting.results import run_files

    out = cfg.results_dir()
    if resume and overwrite:
        raise ConfigError(
            "--overwrite: cannot be combined with --resume (--resume continues the run in the folder, "
            "--overwrite replaces it: choose one)"
        )
    if resume:
        check_resume(cfg, out)
        return
    found = run_files(out)
    if found and not overwrite:
        raise ConfigError(
            f"out: {out} already holds a run ({', '.join(found)}) (continue it with --resume {out}, "
            f"choose another folder with --out, or replace it with --overwrite)"
        )


def check_resume(cfg: Config, out: Path) -> None:
    """What `--resume out` needs that the folder's text files tell, without torch: the folder,
    the saved config (check_resumable names a differing field), the checkpoint's index
    and its arrays file's presence, its config digest, its round (not past the config's, nor a
    finished run) and the server's facts in it."""
    if not out.is_dir():
        raise CheckpointError(
            f"--resume: {out} {'is not a folder' if out.exists() else 'does not exist'} (give the "
            f"results folder of the run to continue, or start a fresh run with --out)"
        )
    check_resumable(cfg, out)
    index_path = out / CHECKPOINT / INDEX
    index = _read_index(index_path)
    if not (out / CHECKPOINT / index["arrays"]).is_file():
        _fail(out / CHECKPOINT / index["arrays"], "is missing")
    if index["config_sha256"] != config_digest(cfg):
        _fail(
            index_path,
            "was written by another experiment's config (config_sha256 differs)",
            "resume with the config and --set options the run was started with",
        )
    if index["round"] > cfg.train.rounds or len(index["silo_model"]) != cfg.silos:
        _fail(
            index_path,
            f"is of round {index['round']} with {len(index['silo_model'])} silos but the config has "
            f"{cfg.train.rounds} rounds and {cfg.silos} silos",
        )
    if index["round"] == cfg.train.rounds and (out / "summary.json").is_file():
        raise ConfigError(
            f"--resume: {out} finished all {index['round']} rounds (its summary.json is written): nothing to continue"
        )
    check_run_meta(index["round"], index["meta"], cfg.silos, index_path)


def check_resume_arrays(cfg: Config, out: Path) -> None:
    """The rest of `--resume out`, after `check_resume` and data preparation (it builds θ(0)
    and a fresh strategy, with torch): the arrays file's checksum and names (`load_checkpoint`),
    the models against θ(0), and the strategy's arrays against a fresh strategy, whose
    `load_state_dict` must accept them."""
    from ..models.build import initial_model
    from .halves import server_half

    ckpt = load_checkpoint(out)
    index = out / CHECKPOINT / INDEX
    theta0 = initial_model(cfg.architecture, cfg.seed)
    for i, model in enumerate(ckpt.models):
        _check_like(model, theta0, index, f"model {i}")
    strategy = server_half(cfg)
    _check_like(ckpt.strategy, strategy.state_dict()[0], index, "the strategy's state", extra_allowed=True)
    try:
        strategy.load_state_dict(ckpt.strategy, ckpt.meta["strategy"])
    except (KeyError, IndexError, TypeError, ValueError) as err:
        _fail(index, f"holds a {cfg.strategy.name} state that does not load ({type(err).__name__}: {err})")


def check_run_meta(rounds: int, meta: dict[str, Any], silos: int, index: Path) -> None:
    """The server's facts (runtime/server.py `Server.checkpoint`): which silos trained, the
    sample count each first reported, one metrics record per round done, and the strategy's
    own facts."""
    required = {"strategy", "trained", "first_counts", "records"}  # and `dropped`, since silos are kept out
    if not required <= set(meta) <= required | {"dropped"} or not isinstance(meta["strategy"], dict):
        _fail(index, "meta must hold strategy, trained, first_counts, records and dropped")
    trained, first_counts, records = meta["trained"], meta["first_counts"], meta["records"]
    if not isinstance(trained, list) or not all(isinstance(c, int) and 0 <= c < silos for c in trained):
        _fail(index, f"meta.trained must list silos in 0..{silos - 1}")
    if not isinstance(first_counts, dict) or not all(
        k.isdigit() and int(k) < silos and isinstance(n, int) and n >= 1 for k, n in first_counts.items()
    ):
        _fail(index, f"meta.first_counts must map silos in 0..{silos - 1} to positive counts")
    if (
        not isinstance(records, list)
        or len(records) != rounds
        or any(not isinstance(r, dict) or r.get("round") != i + 1 for i, r in enumerate(records))
    ):
        _fail(index, f"meta.records must hold one record per round 1..{rounds}")
    dropped = meta.get("dropped", {})
    if not isinstance(dropped, dict) or not all(
        k.isdigit() and int(k) < silos and _is_drop_record(d, rounds) for k, d in dropped.items()
    ):
        _fail(index, f"meta.dropped must map silos in 0..{silos - 1} to the round they left, who they were and why")


def _is_drop_record(record: Any, rounds: int) -> bool:
    """A dropped silo's record: the round it left (or was kept out from) and who it was and why,
    as text."""
    return (
        isinstance(record, dict)
        and set(record) == {"round", "from", "why"}
        and isinstance(record["round"], int)
        and 1 <= record["round"] <= rounds
        and all(isinstance(record[k], str) for k in ("from", "why"))
    )


def dropped_in(out: Path) -> frozenset[int]:
    """The silos the folder's checkpoint records as dropped (none in a checkpoint written
    before dropped silos were kept)."""
    return frozenset(int(c) for c in _read_index(out / CHECKPOINT / INDEX)["meta"].get("dropped", {}))


def kept_out(cfg: Config, out: Path, readmit: frozenset[int]) -> frozenset[int]:
    """`--resume out` (after `check_resume`): the silos the run dropped that stay out, all but those
    `readmit` names. ConfigError where `readmit` names a silo the run did not drop, or where the
    silos kept out are more than `runtime.max_dropped` of them (the resumed run would stop
    again after its first round)."""
    from .absent import silo_list, too_many_gone

    dropped = dropped_in(out)
    if stray := sorted(readmit - dropped):
        raise ConfigError(
            f"--readmit: silo {stray[0]} was not dropped in the run being resumed in {out} "
            f"(dropped: {silo_list(dropped) or 'none'})"
        )
    kept = dropped - readmit
    if too_many_gone(kept, cfg.silos, cfg.runtime.max_dropped):
        raise ConfigError(
            f"--resume: {len(kept)} of {cfg.silos} silos were dropped in {out} ({silo_list(kept)}), over "
            f"runtime.max_dropped ({cfg.runtime.max_dropped:g}): readmit those mended with --readmit SILOS "
            f"(e.g. --readmit {silo_list(kept)}), or raise runtime.max_dropped"
        )
    return kept


def _check_like(
    arrays: dict[str, np.ndarray], reference: dict[str, np.ndarray], index: Path, what: str, extra_allowed: bool = False
) -> None:
    """Same names, shapes and dtypes as `reference` (extra names allowed for a strategy's
    state, whose cached models and bases come and go)."""
    for name, ref in reference.items():
        ref = np.asarray(ref)
        got = arrays.get(name)
        if got is None or got.shape != ref.shape or got.dtype != ref.dtype:
            found = "missing" if got is None else f"{got.dtype}{list(got.shape)}"
            _fail(index, f"{what}: {name} is {found}, expected {ref.dtype}{list(ref.shape)}")
    if not extra_allowed and set(arrays) != set(reference):
        _fail(index, f"{what}: unexpected arrays {sorted(set(arrays) - set(reference))[:3]}")


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


def check_resumable(cfg: Config, out: Path) -> None:
    """`--resume DIR` continues the same experiment: the config must match the one saved in
    DIR (NOT_THE_EXPERIMENT may differ); names the first differing field. Without a saved
    config.yaml the checkpoint's config digest decides (runtime/checkpoint.py)."""
    saved_path = out / "config.yaml"
    if not saved_path.is_file():
        return
    try:
        saved = read_yaml(saved_path.read_text()) or {}
    except yaml.YAMLError:
        raise ConfigError(
            f"--resume: {saved_path} is not valid YAML (the run's saved config was damaged; "
            f"start afresh with --out {out} --overwrite)"
        ) from None
    if not isinstance(saved, dict):
        raise ConfigError(f"--resume: {saved_path} does not hold a config (start afresh with --out {out} --overwrite)")
    now = read_yaml(yaml.safe_dump(experiment_dict(cfg), sort_keys=False))
    for key in cfg.data.agreed_fields:  # learned in the agreement, which the resumed run holds again
        if isinstance(saved.get("data"), dict) and now["data"].get(key) is None:
            saved["data"].pop(key, None)
            now["data"].pop(key, None)
    for section in sorted(set(saved) | set(now)):
        if section in NOT_THE_EXPERIMENT:
            continue
        old, new = saved.get(section), now.get(section)
        if old != new:
            field_name = section
            if isinstance(old, dict) and isinstance(new, dict):
                field_name += "." + next(k for k in sorted(set(old) | set(new)) if old.get(k) != new.get(k))
            raise ConfigError(
                f"{field_name}: differs from the run being resumed in {out} "
                f"(resume with the config and --set options it was started with)"
            )
