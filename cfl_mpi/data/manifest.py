"""A federation's manifest: the CSV file that names each silo's data (`silo,path[,group]`),
read by every rank's config check and by each silo for its own path; it holds no data.

A silo's `group` is its known group, used only to score the clustering (ARI, the Oracle). It
may be any label. Groups that are all whole numbers from 0 are their own ids, as the built-in
data sets number theirs (`data.group_clusters[g]` is group g's cluster); groups named
otherwise get ids 0, 1, ... in the order they first appear in silo order (silo 0's group is
group 0), and `data.group_clusters` lists one cluster per group in that order.
"""

from __future__ import annotations

import csv
import functools
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..settings import ConfigError


@dataclass(frozen=True)
class ManifestRow:
    """One silo's row: its path (relative to the manifest's folder), its group as written
    (None where the column is empty or absent) and the manifest's line that gives it."""

    path: str
    group: str | None
    line: int


@dataclass(frozen=True)
class Manifest:
    """Every silo's row, in silo order."""

    file: Path
    rows: tuple[ManifestRow, ...]

    def group_names(self) -> list[str] | None:
        """The groups by id (`group_ids`' order), or None where the manifest gives none."""
        if self.rows[0].group is None:
            return None
        labels = [row.group for row in self.rows if row.group is not None]
        if all(_whole(label) for label in labels):
            return [str(g) for g in range(max(int(label) for label in labels) + 1)]
        return list(dict.fromkeys(labels))

    def group_ids(self) -> np.ndarray | None:
        """Each silo's group id (`group_names` gives their order), or None where none is known."""
        names = self.group_names()
        if names is None:
            return None
        labels = [row.group or "" for row in self.rows]
        if all(_whole(label) for label in labels):
            return np.array([int(label) for label in labels], dtype=np.int64)
        index = {name: i for i, name in enumerate(names)}
        return np.array([index[label] for label in labels], dtype=np.int64)

    def where(self, silo: int) -> str:
        """How an error points at silo `silo`'s row."""
        return f"data.manifest {self.file} line {self.rows[silo].line}"


def read_manifest(path: Path) -> Manifest:
    """The manifest at `path`, read again only when it changed; ConfigError naming the file and
    the line for anything it gets wrong."""
    if not path.is_file():
        raise ConfigError(
            f"data.manifest: {path} not found (give a CSV file with the columns silo,path and optionally group)"
        )
    stat = path.stat()
    return _read(path, stat.st_mtime_ns, stat.st_size)


@functools.lru_cache(maxsize=4)
def _read(path: Path, mtime_ns: int, size: int) -> Manifest:
    where = f"data.manifest: {path}"
    try:
        with path.open(newline="") as file:
            reader = csv.DictReader(file)
            rows = [(reader.line_num, row) for row in reader]
    except (OSError, UnicodeDecodeError, csv.Error) as err:
        raise ConfigError(f"{where} cannot be read ({type(err).__name__})") from None
    if not rows or not {"silo", "path"} <= set(rows[0][1]):
        raise ConfigError(f"{where} needs a header row with the columns silo,path (and optionally group)")
    entries: dict[int, ManifestRow] = {}
    for line, row in rows:
        try:
            silo = int(row["silo"])
        except (TypeError, ValueError):
            raise ConfigError(f"{where} line {line}: silo {row['silo']!r} is not a silo index (0, 1, ...)") from None
        if silo in entries or silo < 0 or not row["path"]:
            raise ConfigError(f"{where} line {line}: silo {silo} is listed twice, negative or without a path")
        group = (row.get("group") or "").strip() or None
        if group is not None and _whole(group.lstrip("-")) and int(group) < 0:
            raise ConfigError(f"{where} line {line}: group {group} is negative (number groups from 0, or name them)")
        entries[silo] = ManifestRow(row["path"], group, line)
    if sorted(entries) != list(range(len(entries))):
        raise ConfigError(f"{where}: the silos must be numbered 0 to {len(entries) - 1}, each once")
    ordered = tuple(entries[s] for s in range(len(entries)))
    given = [row for row in ordered if row.group is not None]
    if given and len(given) < len(ordered):
        empty = next(row for row in ordered if row.group is None)
        raise ConfigError(
            f"{where} line {empty.line}: no group, while line {given[0].line} gives one "
            "(give every silo's group, or none)"
        )
    return Manifest(path, ordered)


def _whole(label: str) -> bool:
    """Whether a group label is a whole number from 0 (its own id)."""
    return label.isascii() and label.isdigit()
