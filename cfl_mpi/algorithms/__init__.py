"""Clustering strategies by name. A new one registers its two halves and its message kinds
here; the runtime does not change."""
from __future__ import annotations

from . import emdcfl, fedwad_exchange, ifca, pacfl
from .base import SiloProtocol, Strategy, StrategySpec
from .cfl import Cfl, CflSilo
from .emdcfl import EmdCfl, EmdCflSilo
from .fedavg import FedAvg
from .fedwad_clustering import FedWaDClustering, FedWaDClusteringSilo
from .ifca import Ifca, IfcaSilo
from .oracle import Oracle
from .pacfl import Pacfl, PacflSilo

REGISTRY: dict[str, StrategySpec] = {
    "emdcfl": StrategySpec(EmdCfl, EmdCflSilo, emdcfl.KINDS),
    "fedavg": StrategySpec(FedAvg),
    "oracle": StrategySpec(Oracle),
    "pacfl": StrategySpec(Pacfl, PacflSilo, pacfl.KINDS),
    "cfl": StrategySpec(Cfl, CflSilo),
    "ifca": StrategySpec(Ifca, IfcaSilo, ifca.KINDS),
    "fedwad": StrategySpec(FedWaDClustering, FedWaDClusteringSilo, fedwad_exchange.FEDWAD_KINDS),
}

__all__ = ["REGISTRY", "SiloProtocol", "Strategy", "StrategySpec"]
