"""Checkpoints round-trip exactly, share cluster models, replace each other atomically, and
a resume refuses every missing, truncated, altered, stale or misfitting one with one line."""

import json

import numpy as np
import pytest
import yaml

from cfl_mpi.config import ConfigError, config_digest, load_config
from cfl_mpi.models.build import initial_model
from cfl_mpi.reporting.results import remove_run
from cfl_mpi.runtime.checkpoint import (
    Checkpoint,
    check_results_folder,
    check_resume_arrays,
    dedupe_models,
    load_checkpoint,
    save_checkpoint,
)
from cfl_mpi.runtime.halves import server_half
from cfl_mpi.strategies import REGISTRY

DIGEST = "0" * 64


def model(v):
    return {"w": np.full((2, 3), v, dtype=np.float32), "steps": np.array(v, dtype=np.int64)}


def test_round_trip_and_dedup(tmp_path):
    a, b = model(1.0), model(2.0)
    models, index = dedupe_models([a, a, b, a])
    assert len(models) == 2 and index == [0, 0, 1, 0]
    W = np.array([[0.0, np.nan], [0.5, 0.0]])
    state = Checkpoint(3, models, index, {"W": W, "clusters": np.array([0, 0, 1, 0])}, {"rng": [1, 2]}, DIGEST)
    save_checkpoint(tmp_path, state)
    loaded = load_checkpoint(tmp_path)
    assert loaded.round == 3 and loaded.silo_model == index and loaded.meta == {"rng": [1, 2]}
    assert loaded.config_sha256 == DIGEST
    np.testing.assert_array_equal(loaded.strategy["W"], W)  # NaN included
    for silo in range(4):
        for k in ("w", "steps"):
            np.testing.assert_array_equal(loaded.model_of(silo)[k], [a, a, b, a][silo][k])
            assert loaded.model_of(silo)[k].dtype == [a, a, b, a][silo][k].dtype


def test_newer_checkpoint_replaces_older(tmp_path):
    for r in (1, 2):
        save_checkpoint(tmp_path, Checkpoint(r, [model(r)], [0], {}, {}, DIGEST))
    assert load_checkpoint(tmp_path).round == 2
    assert sorted(p.name for p in (tmp_path / "checkpoint").iterdir()) == ["index.json", "round2.npz"]


def test_interrupted_write_keeps_the_last_checkpoint(tmp_path):
    save_checkpoint(tmp_path, Checkpoint(1, [model(1)], [0], {}, {}, DIGEST))
    # A crash while writing round 2 leaves only a temporary file behind.
    (tmp_path / "checkpoint" / "round2.npz.tmp").write_bytes(b"partial")
    loaded = load_checkpoint(tmp_path)
    assert loaded.round == 1 and loaded.model_of(0)["w"][0, 0] == 1.0


# ------------------------------------------------------------------ resume: what is refused

SMALL = ["silos=2", "data.rotations=[0,180]", "train.rounds=3", "model.channels=[4,8]", "model.embedding_dim=8"]


def small_config(out, *overrides):
    return load_config("configs/digits.yaml", [*SMALL, f"out={out}", *overrides])


def write_run(out, *overrides, round=1, theta=None, strategy_arrays=None):
    """A results folder as the server leaves it after `round`: config.yaml and a checkpoint
    of θ(0) (or `theta`) with a fresh strategy's state, written by the real writer."""
    cfg = small_config(out, *overrides)
    out.mkdir(parents=True, exist_ok=True)
    (out / "config.yaml").write_text(yaml.safe_dump(cfg.to_dict(), sort_keys=False))
    arrays, meta = server_half(cfg).state_dict()
    run_meta = {
        "strategy": meta,
        "trained": [0, 1],
        "first_counts": {"0": 10, "1": 12},
        "records": [{"round": r + 1} for r in range(round)],
    }
    save_checkpoint(
        out,
        Checkpoint(
            round,
            [theta or initial_model(cfg.architecture, cfg.seed)],
            [0] * cfg.silos,
            strategy_arrays or arrays,
            run_meta,
            config_digest(cfg),
        ),
    )
    return cfg


def resume_checks(cfg):
    """Both halves of `--resume`'s checks, as the job runs them: the folder's text files, then
    the arrays against θ(0) and the strategy."""
    check_results_folder(cfg, resume=True, overwrite=False)
    check_resume_arrays(cfg, cfg.results_dir())


def refused(cfg, *words):
    with pytest.raises(ConfigError) as err:
        resume_checks(cfg)
    message = str(err.value)
    assert message.startswith(("--resume: ", "train.")) and "\n" not in message, message
    for w in words:
        assert w in message, message
    return message


def test_an_intact_checkpoint_resumes(tmp_path):
    cfg = write_run(tmp_path / "run")
    resume_checks(cfg)
    # runtime settings are not the experiment: a resume may change them
    resume_checks(small_config(tmp_path / "run", "runtime.message_timeout_s=5"))


@pytest.mark.parametrize("strategy", sorted(REGISTRY))
def test_every_strategy_s_fresh_state_passes_the_checks(tmp_path, strategy):
    resume_checks(write_run(tmp_path / "run", f"strategy.name={strategy}"))


def test_no_checkpoint_is_an_error_not_a_fresh_start(tmp_path):
    refused(small_config(tmp_path / "nothing"), "nothing does not exist", "start a fresh run with --out")
    (tmp_path / "empty").mkdir()
    refused(small_config(tmp_path / "empty"), "holds no checkpoint/index.json")
    cfg = write_run(tmp_path / "run")
    (tmp_path / "run" / "checkpoint" / "index.json").unlink()
    refused(cfg, "holds no checkpoint/index.json")


def test_missing_truncated_or_altered_arrays_are_refused(tmp_path):
    cfg = write_run(tmp_path / "run")
    npz = tmp_path / "run" / "checkpoint" / "round1.npz"
    data = npz.read_bytes()
    npz.write_bytes(data[: len(data) // 2])
    refused(cfg, "round1.npz", "checksum", "truncated or altered")
    flipped = bytearray(data)
    flipped[len(data) // 2] ^= 0xFF
    npz.write_bytes(bytes(flipped))
    refused(cfg, "checksum")
    npz.unlink()
    refused(cfg, "round1.npz is missing")


@pytest.mark.parametrize(
    "change,words",
    [
        (lambda i: i.update(arrays="../round1.npz"), ["'../round1.npz' is not a plain file name"]),
        (lambda i: i.update(arrays="/etc/passwd"), ["is not a plain file name"]),
        (lambda i: i.update(arrays=".."), ["is not a plain file name"]),
        (lambda i: i.update(arrays="round2.npz"), ["not the file of round 1"]),
        (lambda i: i.update(round=2), ["not the file of round 2"]),
        (lambda i: i.update(round=True), ["must be integers"]),
        (lambda i: i.update(silo_model=[0, 5]), ["silo_model must index"]),
        (lambda i: i.pop("arrays_sha256"), ["must hold exactly the keys"]),
        (lambda i: i.update(config_sha256="x"), ["SHA-256 hex"]),
        (lambda i: i["meta"].update(records=[]), ["one record per round"]),
        (lambda i: i["meta"].update(trained=[7]), ["meta.trained"]),
    ],
)
def test_a_tampered_index_is_refused(tmp_path, change, words):
    cfg = write_run(tmp_path / "run")
    path = tmp_path / "run" / "checkpoint" / "index.json"
    index = json.loads(path.read_text())
    change(index)
    path.write_text(json.dumps(index))
    refused(cfg, *words)


def test_an_index_that_is_not_json_is_refused(tmp_path):
    cfg = write_run(tmp_path / "run")
    (tmp_path / "run" / "checkpoint" / "index.json").write_text('{"round": 1,')
    refused(cfg, "index.json is not valid JSON")


def test_a_stale_checkpoint_of_another_config_is_refused(tmp_path):
    write_run(tmp_path / "run")
    other = small_config(tmp_path / "run", "train.lr=0.5")
    refused(other, "train.lr")  # config.yaml names the field
    (tmp_path / "run" / "config.yaml").unlink()  # without it, the checkpoint's digest decides
    refused(other, "another experiment's config")
    refused(small_config(tmp_path / "run", "train.rounds=4"), "another experiment's config")


def test_a_renamed_round_beyond_the_config_is_refused(tmp_path):
    cfg = write_run(tmp_path / "run")
    folder = tmp_path / "run" / "checkpoint"
    index = json.loads((folder / "index.json").read_text())
    (folder / "round1.npz").rename(folder / "round7.npz")  # checksum intact, round and name consistent
    index.update(round=7, arrays="round7.npz")
    index["meta"]["records"] = [{"round": r} for r in range(1, 8)]
    (folder / "index.json").write_text(json.dumps(index))
    refused(cfg, "is of round 7 with 2 silos but the config has 3 rounds")


def test_arrays_that_do_not_fit_theta0_or_the_strategy_are_refused(tmp_path):
    cfg = small_config(tmp_path / "a")
    theta = initial_model(cfg.architecture, cfg.seed)
    name = next(iter(theta))
    wrong = {**theta, name: np.zeros((1, *theta[name].shape[1:]), dtype=theta[name].dtype)}
    write_run(tmp_path / "a", theta=wrong)
    refused(cfg, f"model 0: {name} is float32", "expected float32")
    retyped = {**theta, name: theta[name].astype(np.float64)}
    write_run(tmp_path / "b", theta=retyped)
    refused(small_config(tmp_path / "b"), "expected float32")
    arrays, _ = server_half(cfg).state_dict()
    write_run(tmp_path / "c", strategy_arrays={**arrays, "W": np.zeros((1, 1))})
    refused(small_config(tmp_path / "c"), "the strategy's state: W is float64[1, 1], expected float64[2, 2]")


# ------------------------------------------------------------------ fresh runs and --overwrite


def test_a_fresh_run_refuses_a_folder_holding_a_run_unless_asked_to_overwrite(tmp_path):
    out = tmp_path / "run"
    cfg = write_run(out)
    with pytest.raises(ConfigError, match=rf"^out: {out} already holds a run \(config.yaml, checkpoint\).*--overwrite"):
        check_results_folder(cfg, resume=False, overwrite=False)
    check_results_folder(cfg, resume=False, overwrite=True)
    with pytest.raises(ConfigError, match=r"^--overwrite: cannot be combined with --resume"):
        check_results_folder(cfg, resume=True, overwrite=True)
    (out / "log.txt").write_text("launcher's log")
    (out / "W.npy").write_bytes(b"")
    remove_run(out)
    assert sorted(p.name for p in out.iterdir()) == ["log.txt"]
    check_results_folder(cfg, resume=False, overwrite=False)  # an empty folder (or one with a log) is free
    check_results_folder(small_config(tmp_path / "new"), resume=False, overwrite=False)


def test_a_finished_run_is_not_resumed_and_keeps_its_results(tmp_path):
    """--resume of a run whose summary is written would only rewrite it (its wall time with
    the resume's 0.01 s): refused; a run checkpointed after its last round but stopped before
    its summary still finishes."""
    out = tmp_path / "run"
    cfg = write_run(out, round=3)  # SMALL has 3 rounds
    resume_checks(cfg)
    (out / "summary.json").write_text('{"wall_s": 53.3}')
    refused(cfg, "finished all 3 rounds", "nothing to continue")
    assert json.loads((out / "summary.json").read_text()) == {"wall_s": 53.3}
