"""Client-level differential privacy of each cluster's model: the `privacy:` section and its
accountant.

DP-FedAvg (McMahan, Ramage, Talwar, Zhang, *Learning Differentially Private Recurrent
Language Models*, ICLR 2018, Algorithm 1 with the fixed denominator): each member's update
Δ_c = θ_c − s_c is clipped to norm C, and the cluster's model is s̄ + (Σ_c clip(Δ_c) + N(0,
σ²I)) / W, with σ = z·C and W the cluster's members drawn to train in the round. Adding or
removing one silo moves the sum by at most C, so every round a silo's update enters is a
Gaussian mechanism of noise multiplier z for it, and its rounds compose (a draw of
participants known from the seed amplifies nothing: the rounds are counted as they were).
The ε spent comes from the Rényi DP accountant (Mironov, *Rényi Differential Privacy*, CSF
2017) of Google's dp-accounting library.

`dp: central` trusts the server: it receives each update in the clear and adds the noise.
The noise protects the models it hands out (to the silos, and whoever they reach), not the
updates from the server. `dp: distributed` runs under secure aggregation, where the server
reads each cluster's sum only: each of the W silos that mask in the round clips its own update
and adds N(0, σ²/W · I), so that the sum carries N(0, σ²I) (the distributed Gaussian
mechanism, as in Kairouz, Liu, Steinke, *The Distributed Discrete Gaussian Mechanism for
Federated Learning with Secure Aggregation*, ICML 2021, here with continuous noise rounded to
the fixed point). A silo that leaves mid-round takes its share of the noise with it: the sum
then carries σ²(W − d)/W for d silos gone, and the ε reported assumes none left.

Neither covers the clustering round's own messages (EMD-CFL's projected embeddings and
distances, PACFL's principal vectors, ...)."""

from __future__ import annotations

import functools
import importlib.util
import math
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Literal

import numpy as np

# What a seeded noise draw mixes into the run seed, so that it shares no stream with the
# run's other draws.
NOISE_STREAM = 0x4450


# Client-level differential privacy of each cluster's model (DP-FedAvg: each update clipped,
# the cluster's sum noised). none; central: the server clips and adds the noise (it sees every
# update in the clear: the noise protects the models it hands out, not the updates from it);
# distributed: under aggregation.secure, each silo clips and adds its share of the noise.
@dataclass(frozen=True)
class PrivacyConfig:
    # none; central: DP-FedAvg at the server, which sees every update in the clear;
    # distributed: each silo clips its update and adds its share of the noise, and the server
    # reads only each cluster's sum (needs aggregation.secure).
    dp: Literal["none", "central", "distributed"] = "none"
    # C: the bound on the L2 norm of a silo's update θ_c − s_c (its floating-point arrays).
    clip: float = 1.0
    # z: the noise on a cluster's sum of clipped updates is Gaussian with standard deviation
    # z·C per value; ε grows as z shrinks.
    noise_multiplier: float = 1.0
    # δ of the (ε, δ) reported each round: below one over the number of silos.
    delta: float = 1e-5
    # The ε the run may spend over train.rounds; null: no budget. A config whose
    # noise_multiplier would spend more is refused before any work, with the z that fits.
    epsilon: float | None = None
    # ephemeral: noise from the OS's entropy (deploy with this); seeded: from the run seed, so
    # that a run is repeatable, and anyone holding the config can remove the noise
    # (experiments only).
    noise: Literal["ephemeral", "seeded"] = "ephemeral"

    @property
    def on(self) -> bool:
        return self.dp != "none"

    def problems(self) -> Iterator[str]:
        """One config-error line per value the types cannot rule out (`privacy.<key>: …`)."""
        if self.clip <= 0:
            yield f"privacy.clip: must be positive, got {self.clip}"
        if self.noise_multiplier <= 0:
            yield f"privacy.noise_multiplier: must be positive, got {self.noise_multiplier}"
        if not 0 < self.delta < 1:
            yield f"privacy.delta: must lie in (0, 1), got {self.delta}"
        if self.epsilon is not None and self.epsilon <= 0:
            yield f"privacy.epsilon: must be positive or null, got {self.epsilon}"
        if self.on and importlib.util.find_spec("dp_accounting") is None:
            yield "privacy.dp: its accountant needs Google's dp-accounting (pip install 'cfl_mpi[privacy]')"

    def spent(self, rounds: int) -> float:
        """ε at `delta` after `rounds` rounds (0 before the first)."""
        return epsilon_spent(self.noise_multiplier, rounds, self.delta)

    def noise_generator(self, seed: int, round: int, cluster: int) -> np.random.Generator:
        """The generator of one cluster's noise in one round (central)."""
        if self.noise == "seeded":
            return np.random.default_rng([seed, round, cluster, NOISE_STREAM])
        return np.random.default_rng()

    def silo_noise(self, seed: int, round: int, silo: int, members: int, size: int) -> np.ndarray:
        """A silo's share of its cluster's noise in one round (distributed): N(0, (zC)²/W) per
        value, W the `members` that mask."""
        rng = np.random.default_rng([seed, round, NOISE_STREAM, silo]) if self.noise == "seeded" else None
        std = self.noise_multiplier * self.clip / math.sqrt(members)
        return (rng or np.random.default_rng()).normal(0.0, std, size=size)


def noise_multiplier_for(epsilon: float, rounds: int, delta: float) -> float:
    """The smallest z, to 3 significant digits, whose `rounds` rounds spend at most `epsilon`
    (ε falls as z grows: bisection)."""
    low, high = 1e-3, 1e4
    if epsilon_spent(high, rounds, delta) > epsilon:
        raise ValueError(f"no noise multiplier up to {high:g} spends at most ε = {epsilon:g} in {rounds} rounds")
    while high / low > 1 + 1e-6:
        middle = math.sqrt(low * high)
        low, high = (low, middle) if epsilon_spent(middle, rounds, delta) <= epsilon else (middle, high)
    digits = 2 - math.floor(math.log10(high))
    z = math.ceil(high * 10**digits) / 10**digits
    return z


@functools.cache  # a run asks for the same few (z, rounds, δ) every round and cluster
def epsilon_spent(noise_multiplier: float, rounds: int, delta: float) -> float:
    """ε at δ of `rounds` Gaussian mechanisms of noise multiplier z, composed (RDP accountant)."""
    if rounds <= 0:
        return 0.0
    import dp_accounting
    from dp_accounting.rdp import RdpAccountant

    accountant = RdpAccountant()
    accountant.compose(dp_accounting.GaussianDpEvent(noise_multiplier), rounds)
    return float(accountant.get_epsilon(delta))
