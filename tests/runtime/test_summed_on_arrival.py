"""A server that sums each update as it arrives (unscreened FedAvg, clusters settled before
training) gives the bits of one that holds them all and screens: with honest silos the
screening changes nothing, so only where the sum happens differs."""

from __future__ import annotations

import pytest
from jobs import simulate_job

SLIM = ("model.channels=[16,32]", "train.local_epochs=1")


@pytest.mark.job
@pytest.mark.parametrize(
    ("overrides", "settled_from"),
    [(("strategy.pair_keys=seeded",), 2), (("strategy.name=ifca", "strategy.init=random"), 1)],
    ids=["emdcfl", "ifca"],
)
def test_updates_summed_on_arrival_give_the_bits_of_updates_held_and_screened(tmp_path, overrides, settled_from):
    """EMD-CFL clusters by round 1's trained silos (those updates are held), then sums on
    arrival (seeded pair keys: the same clusters in both runs); IFCA (random start) assigns
    before training every round."""
    args = ("train.rounds=3", *SLIM, *overrides)
    held, held_records = simulate_job("configs/digits.yaml", tmp_path / "held", *args)
    summed, summed_records = simulate_job("configs/digits.yaml", tmp_path / "summed", *args, "aggregation.screen=false")
    assert not any(r.get("rejected") for r in held_records)  # honest silos: the screening took nothing
    assert [r["accuracy"] for r in summed_records] == [r["accuracy"] for r in held_records]
    assert [r["clusters"] for r in summed_records] == [r["clusters"] for r in held_records]
    assert [r.get("summed_on_arrival", False) for r in summed_records] == [
        r["round"] >= settled_from for r in summed_records
    ]
    assert not any("summed_on_arrival" in r for r in held_records)
    assert summed["avg_acc"] == held["avg_acc"]
