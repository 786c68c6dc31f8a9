"""Clustering strategies by name. A new one registers its two halves here; the runtime
does not change."""
from __future__ import annotations

from .base import SiloProtocol, Strategy, StrategySpec
from .cfl import Cfl, CflSilo
from .emdcfl import EmdCfl, EmdCflSilo
from .fedavg import FedAvg
from .fedwad_clustering import FedWaDClustering, FedWaDClusteringSilo
from .ifca import Ifca, IfcaSilo
from .oracle import Oracle
from .pacfl import Pacfl, PacflSilo

REGISTRY: dict[str, StrategySpec] = {
    "emdcfl": StrategySpec(EmdCfl, EmdCflSilo),
    "fedavg": StrategySpec(FedAvg),
    "oracle": StrategySpec(Oracle),
    "pacfl": StrategySpec(Pacfl, PacflSilo),
    "cfl": StrategySpec(Cfl, CflSilo),
    "ifca": StrategySpec(Ifca, IfcaSilo),
    "fedwad": StrategySpec(FedWaDClustering, FedWaDClusteringSilo),
}

__all__ = ["REGISTRY", "SiloProtocol", "Strategy", "StrategySpec"]
