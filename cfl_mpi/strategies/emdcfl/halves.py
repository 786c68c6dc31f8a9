"""EMD-CFL (Zhang, Williams, Toni: Clustered Federated Learning via Embedding Distributions;
Algorithm 1): one-shot clustering after the first round of local training. Every pair of
silos (c, c') not yet measured agrees on a secret projection R (X25519 + HKDF), swaps
embedding models ω directly, and sends the server its own projected embeddings under both
models plus τ_c; the server forms W[c][c'] = W1(Z_{c|c}R, Z_{c'|c}R) − τ_c (line 16) and
extracts clusters.

The halves are built from a pair plan (plans.py: which pairs a round measures, stage by
stage) and a pair distance (distances.py), and exchange the messages of messages.py:
server.py is the server's half, silo.py a silo's.
"""

from __future__ import annotations

from ..base import Halves
from .messages import KINDS
from .server import EmdCfl
from .silo import EmdCflSilo

HALVES = Halves(EmdCfl, EmdCflSilo, KINDS)
