"""The agreement before the first round, for data sets whose silos read files of their own:
the silos' reports (data/agreement.py) checked against each other and the model, the same way
by every party, and the shape and classes they agree on filled into the config, which every
party then builds its model from."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import replace

from ..config import Config
from ..data.agreement import DataReport, frame, read_frames
from ..settings import ConfigError

__all__ = ["agreed_config", "agreed_in_process", "local_reports"]


def local_reports(cfg: Config, silos: Iterable[int]) -> dict[int, DataReport]:
    """The reports of this process's silos, each from reading its own files (kept for its
    `build`); ConfigError naming the silo, its file and what is wrong."""
    facts = cfg.data_facts()
    return {silo: DataReport.of_data(cfg.data.read_for_agreement(silo, facts)) for silo in silos}


def agreed_config(cfg: Config, reports: dict[int, DataReport]) -> Config:
    """`cfg` with the example shape and the classes every silo agrees on; ConfigError naming
    the first silo (and its file) that does not fit the others, the config or the model."""
    data = cfg.data
    given = getattr(data, "input_shape", None)
    shape = tuple(given) if given is not None else reports[0].shape
    reference = "data.input_shape" if given is not None else f"silo 0's ({data.files_of(0)})"
    for silo, report in sorted(reports.items()):
        if report.shape != shape:
            raise ConfigError(
                f"data: silo {silo} ({data.files_of(silo)}): its examples are {_size(report.shape)}, {reference} "
                f"{_size(shape)} (every silo's examples must have one shape)"
            )
    top = max(reports.items(), key=lambda item: (item[1].max_label, -item[0]))
    classes = getattr(data, "classes", None) or top[1].max_label + 1
    if top[1].max_label >= classes:
        raise ConfigError(
            f"data: silo {top[0]} ({data.files_of(top[0])}): holds the label {top[1].max_label}, out of range "
            f"for data.classes {classes}"
        )
    if classes < 2:
        raise ConfigError("data.classes: every silo's labels are 0: a classifier needs at least 2 classes")
    for problem in cfg.model.fit_problems(shape):
        raise ConfigError(f"{problem} (as the silos' files hold them, e.g. silo 0's {data.files_of(0)})")
    return replace(cfg, data=data.agreed(shape, classes))


def agreed_in_process(cfg: Config) -> Config:
    """The agreement where one process hosts every silo (the simulator): the reports framed
    and read back as under MPI, so that both check the same bytes."""
    if not cfg.data.per_silo_files:
        return cfg
    silos = list(range(cfg.silos))
    reports = local_reports(cfg, silos)
    return agreed_config(cfg, read_frames(b"".join(frame(s, reports[s]) for s in silos), silos))


def _size(shape: tuple[int, ...]) -> str:
    return "x".join(map(str, shape))
