"""How messages travel: one `Channel` per party, in-process or over MPI (see base.py)."""

from .base import (
    SERVER,
    Alternative,
    Channel,
    ChannelClosed,
    Notice,
    PeerTimeout,
    Pending,
    WaitStats,
    party_name,
    wait_all,
)
from .layout import RankLayout
from .local import LocalChannel, LocalHub

__all__ = [
    "SERVER",
    "Alternative",
    "Channel",
    "ChannelClosed",
    "LocalChannel",
    "LocalHub",
    "Notice",
    "Pending",
    "PeerTimeout",
    "RankLayout",
    "WaitStats",
    "party_name",
    "wait_all",
]
