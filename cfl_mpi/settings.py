"""What every section of the config is made of, below every layer so that a data set's or a
model's own parameters use it too: the one error a user's mistake becomes before any work,
and fields that a section derives from its others."""

from __future__ import annotations

from dataclasses import field
from typing import Any


class ConfigError(ValueError):
    """A config problem, reported as one line: `<field>: <what is wrong> (<fix>)`."""


def derived() -> Any:
    """A field whose null (its default) `__post_init__` replaces with a value derived from the
    other fields: YAML may give null, code reads the field's own type, never None."""
    return field(default=None, metadata={"derived": True})
