"""What the console says, in one voice: the few words every part of the job prints with."""

from __future__ import annotations


def count(n: int, noun: str) -> str:
    """ "1 round", "3 rounds"."""
    return f"{n} {noun}{'' if n == 1 else 's'}"
