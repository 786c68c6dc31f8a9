"""The silos that are out of a job before its first round (`runtime.on_silo_failure: drop`):
those whose data could not be read in the agreement before the first round, and those the
run being resumed had dropped, unless `--readmit` lets them back in. No process starts them;
the server counts them as dropped from the start and sends them nothing, so no pair plan,
exchange or group computation ever waits for them. Light: decided before any heavy import."""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass, field

from ..settings import ConfigError

__all__ = ["Absent", "parse_silo_list", "silo_list", "too_many_gone"]


@dataclass(frozen=True)
class Absent:
    """`kept`: silos the resumed run had dropped and keeps out; `unreadable`: silo → why its
    data could not be read in this job's agreement."""

    kept: frozenset[int] = frozenset()
    unreadable: dict[int, str] = field(default_factory=dict)

    @property
    def silos(self) -> frozenset[int]:
        return self.kept | frozenset(self.unreadable)


def too_many_gone(gone: Collection[int], silos: int, max_dropped: float) -> bool:
    """Whether `gone` silos are more than `runtime.max_dropped` of the `silos`: a job must not
    start (or go on) with them all out."""
    return len(gone) > max_dropped * silos


def parse_silo_list(text: str, silos: int, what: str) -> frozenset[int]:
    """Silo indices written as `3,5` ("" for none), each in 0..silos-1; ConfigError naming
    `what` otherwise (the list came from another process or the command line)."""
    items = [t.strip() for t in text.split(",") if t.strip()]
    if not all(t.isdigit() and int(t) < silos for t in items):
        raise ConfigError(f"{what}: expected silo indices in 0..{silos - 1} separated by commas, got {text[:80]!r}")
    return frozenset(int(t) for t in items)


def silo_list(silos: frozenset[int] | set[int]) -> str:
    """`parse_silo_list`'s text of `silos`, in order."""
    return ",".join(str(c) for c in sorted(silos))
