"""A silo's labels as a site has them, made the class indices 0, 1, ... every model trains on:
integers; whole-number floats (what a table read by pandas gives); text, through
`data.class_names`. Each error names the user's own key and row, and the rows it holds.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from ..settings import ConfigError
from .report import MAX_CLASSES


def class_indices(y: np.ndarray, key: str, class_names: list[str] | None, classes: int | None) -> np.ndarray:
    """`y` (the array `key` of a silo's file, one label per row) as int64 class indices;
    ConfigError naming `key`, the first row at fault and what to do."""
    if y.ndim == 2 and y.shape[1] == 1:  # one column of a table
        y = y[:, 0]
    if y.ndim != 1:
        raise ConfigError(f"{key} has shape {y.shape}: give one label per example (a vector of N labels)")
    rows = len(y)

    def at(row: int) -> str:
        return f"{key} row {row} (of {rows} rows)"

    if y.dtype.kind in "US":
        values: np.ndarray = _named(y, key, class_names, at)
    elif y.dtype.kind == "f":
        finite = np.isfinite(y)
        if not finite.all():
            row = int(np.flatnonzero(~finite)[0])
            raise ConfigError(f"{at(row)} is {y[row]}: every example needs a label (fix or drop that row)")
        whole = y == np.floor(y)
        if not whole.all():
            row = int(np.flatnonzero(~whole)[0])
            raise ConfigError(
                f"{at(row)} holds {y[row]}, not a whole number (labels are the integers 0, 1, ...; "
                f"{_fix(int((~whole).sum()), 'not whole')})"
            )
        values = y
    elif y.dtype.kind in "iu":
        values = y
    else:
        raise ConfigError(
            f"{key} is of dtype {y.dtype}: give integer labels 0, 1, ... (or text labels and data.class_names)"
        )
    negative = values < 0
    if negative.any():
        row = int(np.flatnonzero(negative)[0])
        raise ConfigError(
            f"{at(row)} holds the label {_number(values[row])} (labels run from 0; "
            f"{_fix(int(negative.sum()), 'negative')})"
        )
    limit, why = (classes, f"data.classes {classes}") if classes is not None else (MAX_CLASSES, "a run's classes")
    beyond = values >= limit
    if beyond.any():
        row = int(np.flatnonzero(beyond)[0])
        more = ", or raise data.classes" if classes is not None else ""
        raise ConfigError(
            f"{at(row)} holds the label {_number(values[row])}, out of range for {why} "
            f"(labels run from 0 to {limit - 1}; {_fix(int(beyond.sum()), 'out of range')}{more})"
        )
    return values.astype(np.int64)


def _fix(rows: int, what: str) -> str:
    """How many rows share a label's fault, and the fix: "3 rows are negative: fix them"."""
    return f"1 row is {what}: fix it" if rows == 1 else f"{rows} rows are {what}: fix them"


def _named(y: np.ndarray, key: str, class_names: list[str] | None, at: Callable[[int], str]) -> np.ndarray:
    """Text labels as the index of each in `class_names`."""
    names = np.char.decode(y, "utf-8") if y.dtype.kind == "S" else y
    if class_names is None:
        example = repr(str(names[0])) if len(names) else "text"
        raise ConfigError(
            f"{key} holds text labels (e.g. {example}): list the classes in data.class_names, in label order"
        )
    distinct, inverse = np.unique(names, return_inverse=True)
    index = {name: i for i, name in enumerate(class_names)}
    for name in distinct:
        if str(name) not in index:
            row = int(np.flatnonzero(names == name)[0])
            raise ConfigError(
                f"{at(row)} holds the label {str(name)!r}, which data.class_names does not list "
                f"(add it there, or fix that row)"
            )
    return np.array([index[str(name)] for name in distinct], dtype=np.int64)[inverse.reshape(-1)]


def _number(value: np.generic) -> str:
    """A label as the user wrote it, a whole float without its `.0`."""
    return str(int(value)) if float(value).is_integer() else str(value)
