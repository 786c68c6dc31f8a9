"""Configs that tests write: YAML text or a mapping of sections, loaded as the job loads them."""

from __future__ import annotations

import textwrap
from collections.abc import Mapping
from pathlib import Path

import yaml

from cfl_mpi.config import Config, load_config

# Four rotated-digits silos in two rotations, PACFL: the section each test overrides.
FOUR_SILOS = """
name: t
silos: 4
data: {name: rotated_digits, rotations: [0, 180]}
train: {rounds: 2, local_epochs: 1}
strategy: {name: pacfl}
"""


def write_config(folder: Path, body: str | Mapping) -> Path:
    """`folder/c.yaml` from YAML text (dedented) or from a mapping of sections."""
    path = folder / "c.yaml"
    path.write_text(textwrap.dedent(body) if isinstance(body, str) else yaml.safe_dump(dict(body)))
    return path


def config_from(folder: Path, body: str | Mapping, *overrides: str) -> Config:
    """The config of `body` with `--set`-style overrides, as `load_config` reads it."""
    return load_config(write_config(folder, body), list(overrides))
