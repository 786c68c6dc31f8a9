"""docs/CONFIG.md is generated from the typed config and must never drift from it."""

import dataclasses
import difflib
from typing import Any

import pytest
from conftest import PROJECT_ROOT

from cfl_mpi.commands import config_reference
from cfl_mpi.commands.config_reference import COMMAND, CONFIG_MD, render, sections
from cfl_mpi.config import Config, load_config
from cfl_mpi.config.runtime import FaultConfig, LateSilo, RuntimeConfig
from cfl_mpi.data import REGISTRY as DATA_SETS
from cfl_mpi.strategies import REGISTRY


def _flatten(value: Any, prefix: str = "") -> set[str]:
    """Dotted keys of a config as `dataclasses.asdict` gives it (list entries as `[i]`)."""
    if isinstance(value, dict):
        return set().union(*(_flatten(v, f"{prefix}{k}.") for k, v in value.items()))
    if isinstance(value, list) and value and isinstance(value[0], dict):
        return _flatten(value[0], prefix[:-1] + "[i].")
    return {prefix[:-1]}


def _documented() -> dict[str, config_reference.Key]:
    return {k.key: k for s in sections() for k in s.keys}


def test_config_md_is_up_to_date():
    """Fails when config.py (a field, a default, a Literal, a comment) changed without regenerating."""
    want = render()
    have = CONFIG_MD.read_text() if CONFIG_MD.is_file() else ""
    if have != want:
        diff = "".join(
            list(difflib.unified_diff(have.splitlines(True), want.splitlines(True), "docs/CONFIG.md", "generated"))[:40]
        )
        pytest.fail(f"docs/CONFIG.md is out of date with cfl_mpi/config/: regenerate it with `{COMMAND}`\n{diff}")


def test_every_key_and_section_is_explained():
    missing = config_reference.missing_explanations()
    assert not missing, (
        f"no explanation in cfl_mpi/config/ for {', '.join(missing)}: add a comment above each "
        f"field (or a docstring for a section), then run `{COMMAND}`"
    )


def test_every_field_is_documented():
    """The reference lists exactly the keys the dataclasses have, found here without its walk."""
    full = Config(runtime=RuntimeConfig(fault=FaultConfig(silo=0, round=1)), late_silos=[LateSilo(silo=1, round=2)])
    expected = _flatten(dataclasses.asdict(full))
    for spec in REGISTRY.values():
        expected |= _flatten(dataclasses.asdict(dataclasses.replace(full, strategy=spec.params())))
    for cls in set(DATA_SETS.values()):
        expected |= _flatten(dataclasses.asdict(dataclasses.replace(full, data=cls())))
    assert set(_documented()) == expected


@pytest.mark.parametrize("strategy", list(REGISTRY))
def test_each_key_is_taken_by_set_at_its_default(tmp_path, strategy):
    """The dotted keys are the ones `--set` takes, and the defaults shown are valid values."""
    path = tmp_path / "c.yaml"
    path.write_text("silos: 4\n")
    section = next(s for s in sections() if s.title == f"strategy.name: {strategy}")
    general = [
        k
        for s in sections()
        if not s.title.startswith(("strategy.name:", "data.name:"))
        for k in s.keys
        if "[i]" not in k.key and k.key not in ("strategy.name", "data.name")
    ]  # lists are set as a whole
    general += next(s for s in sections() if s.title.startswith("data.name: rotated_digits")).keys
    sets = [f"strategy.name={strategy}"] + [
        f"{k.key}={'1' if k.default == 'required' else k.default.strip('`')}" for k in general + section.keys
    ]
    cfg = load_config(path, sets)
    assert cfg.strategy.name == strategy


def test_check_command(capsys):
    assert config_reference.main(["--check"]) == 0
    assert CONFIG_MD == PROJECT_ROOT / "docs" / "CONFIG.md"


def test_the_comment_rule():
    """A block explains the field below it and the next fields it names; nothing else borrows it."""
    src = config_reference.parse_source(
        "class C:\n"
        "    # Bounds lo and hi, in '#' units.\n"
        "    lo: int = 0\n"
        "    hi: int = 1\n"
        "    other: int = 2\n"
        "    inline: str = '#'  # Its own.\n"
        "    # Spread over\n"
        "    # two lines.\n"
        "    wide: float = 0.5\n"
        "\n"
        "    alone: bool = True\n"
    )
    got = {name: (m.text, m.shared_with) for name, m in config_reference.meanings_in(src, "C").items()}
    assert got == {
        "lo": ("Bounds lo and hi, in '#' units.", None),
        "hi": (None, "lo"),
        "other": (None, None),
        "inline": ("Its own.", None),
        "wide": ("Spread over two lines.", None),
        "alone": (None, None),
    }
