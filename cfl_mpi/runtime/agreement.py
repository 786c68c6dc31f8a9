"""The agreement before the first round, for data sets whose silos read files of their own:
the silos' reports (data/report.py) checked against each other and the model, the same way
by every party, and the shape and classes they agree on filled into the config, which every
party then builds its model from.

With `runtime.on_silo_failure: drop` a silo whose files cannot be read (gone, damaged, or
`runtime.fault` kind `unreadable_data`) reports why instead (a `Leave` in its frame): every
party then agrees on the others' reports and counts it out of the job (absent.py), unless
that leaves more than `runtime.max_dropped` of the silos out."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from dataclasses import replace

from ..config import Config
from ..data.report import REPORT_BYTES, DataReport, frame, read_frames, shape_fix, shape_text
from ..settings import ConfigError
from ..wire.messages import Message, ProtocolError, check_payload, decode_header, encode_header
from ..wire.round import MAX_WHY, Leave
from .absent import Absent, too_many_gone
from .faults import SiloFaults

__all__ = [
    "agreed_config",
    "agreed_in_process",
    "agreement_in_process",
    "local_reports",
    "read_reports",
    "report_frame",
    "settled",
]

Report = DataReport | str  # a silo's report, or why its data could not be read (drop only)


def local_reports(cfg: Config, silos: Iterable[int]) -> dict[int, Report]:
    """The reports of this process's silos, each from reading its own files (kept for its
    `build`). A silo whose files cannot be read: ConfigError naming the silo, its file and what
    is wrong, or, with `runtime.on_silo_failure: drop`, that line as its report."""
    facts, leaving = cfg.data_facts(), cfg.runtime.on_silo_failure == "drop"
    reports: dict[int, Report] = {}
    for silo in silos:
        try:
            SiloFaults(cfg.runtime.fault, silo).at_start_up()
            reports[silo] = DataReport.of_data(cfg.data.read_for_agreement(silo, facts))
        except (ConfigError, OSError) as err:
            why = str(err)
            if not isinstance(err, ConfigError):
                why = f"data: silo {silo} ({cfg.data.files_of(silo)}): cannot be read ({type(err).__name__}: {err})"
            if not leaving:
                raise ConfigError(why) from None
            reports[silo] = why
    return reports


def report_frame(silo: int, report: Report) -> bytes:
    """`silo`'s report as a frame of REPORT_BYTES bytes: its `DataReport`, or a `Leave` saying
    why its data could not be read (cut to fit the frame)."""
    if isinstance(report, DataReport):
        return frame(silo, report)
    width = MAX_WHY
    while len(header := encode_header(Leave.KIND, 0, silo, {}, Leave(_shortened(report, width)).meta())) > REPORT_BYTES:
        width -= 16  # escaped characters take up to 6 bytes each
    return header.ljust(REPORT_BYTES)


CUT = " ... "


def _shortened(why: str, width: int) -> str:
    """`why` in at most `width` characters: a longer one loses part of its middle, not its end,
    so that the line the others print still names the silo and its file and what is wrong (the
    start, `data: silo 3 (sites/site3.npz): x row 5 ...`) and the fix (the end)."""
    if len(why) <= width:
        return why
    room = width - len(CUT)
    named = why.find("): ") + 3 if why.startswith("data: silo ") else 0  # the silo and its file
    head = named + (room - named) * 2 // 5 if 0 < named <= room // 2 else room * 2 // 5
    return why[:head] + CUT + why[len(why) - (room - head) :]


def read_reports(frames: bytes, silos: list[int], leaving: bool) -> dict[int, Report]:
    """The reports of `silos`, one frame each in that order: a `DataReport`, or with `leaving`
    (runtime.on_silo_failure: drop) a `Leave`'s why; ProtocolError naming the silo, the kind
    and the round for any other frame."""
    reports: dict[int, Report] = {}
    for i, silo in enumerate(silos):
        one = frames[i * REPORT_BYTES : (i + 1) * REPORT_BYTES]
        try:
            reports[silo] = read_frames(one, [silo])[silo]
        except ProtocolError:
            if not leaving:
                raise
            reports[silo] = _why(one, silo)
    return reports


def _why(one: bytes, silo: int) -> str:
    """A frame's `Leave`: why `silo`'s data could not be read (printable text only)."""
    who, expect = f"silo {silo}", Leave.expect(0)
    _, meta = decode_header(one, silo, who, expect)
    check_payload({}, meta, who, expect)
    why = Leave.of(Message(expect.kind, 0, silo, {}, meta, who)).why
    return "".join(c if c.isprintable() else "?" for c in why)


def settled(cfg: Config, reports: dict[int, Report], kept: frozenset[int] = frozenset()) -> tuple[Config, Absent]:
    """`agreed_config` on the silos whose data could be read, and the silos out of the job:
    `kept` out by the run being resumed, and those whose data could not be read. ConfigError
    where these leave more than `runtime.max_dropped` of the silos out."""
    unreadable = {s: r for s, r in sorted(reports.items()) if isinstance(r, str)}
    absent = Absent(kept, unreadable)
    if unreadable and too_many_gone(absent.silos, cfg.silos, cfg.runtime.max_dropped):
        first = next(iter(unreadable.values()))
        raise ConfigError(
            f"runtime.max_dropped: {len(absent.silos)} of {cfg.silos} silos would be out from the start, more "
            f"than {cfg.runtime.max_dropped:g} of them (silos {', '.join(map(str, unreadable))} cannot read their "
            f"data; the first: {first})"
        )
    readable = {s: r for s, r in reports.items() if isinstance(r, DataReport)}
    return agreed_config(cfg, readable), absent


def agreed_config(cfg: Config, reports: dict[int, DataReport]) -> Config:
    """`cfg` with the example shape and the classes every silo agrees on; ConfigError naming
    the first silo (and its file) that does not fit the others, the config or the model. The
    others' shape is the one most silos give (on a tie, the lowest silo's): one grey site
    among colour ones is named itself, though it be silo 0."""
    data = cfg.data
    given = data.input_shape
    first = min(reports)  # silo 0, unless its data could not be read (drop)
    if given is not None:
        shape, reference = tuple(given), "data.input_shape"
    else:
        shape = Counter(report.shape for _, report in sorted(reports.items())).most_common(1)[0][0]
        typical = next(silo for silo, report in sorted(reports.items()) if report.shape == shape)
        reference = f"silo {typical}'s ({data.files_of(typical)})"
    for silo, report in sorted(reports.items()):
        if report.shape != shape:
            raise ConfigError(
                f"data: silo {silo} ({data.files_of(silo)}): its examples are {shape_text(report.shape)}, {reference} "
                f"{shape_text(shape)} ({shape_fix(report.shape, shape)})"
            )
    top = max(reports.items(), key=lambda item: (item[1].max_label, -item[0]))
    classes = data.classes or top[1].max_label + 1
    if top[1].max_label >= classes:
        raise ConfigError(
            f"data: silo {top[0]} ({data.files_of(top[0])}): holds the label {top[1].max_label}, out of range "
            f"for data.classes {classes}"
        )
    if classes < 2:
        raise ConfigError("data.classes: every silo's labels are 0: a classifier needs at least 2 classes")
    for problem in cfg.model.fit_problems(shape):
        raise ConfigError(f"{problem} (as the silos' files hold them, e.g. silo {first}'s {data.files_of(first)})")
    return replace(cfg, data=data.agreed(shape, classes))


def agreement_in_process(cfg: Config, kept: frozenset[int] = frozenset()) -> tuple[Config, Absent]:
    """The agreement where one process hosts every silo (the simulator): the reports framed
    and read back as under MPI, so that both check the same bytes; `kept`: silos the resumed
    run keeps out, whose files are not read."""
    if not cfg.data.per_silo_files:
        return cfg, Absent(kept)
    silos = [s for s in range(cfg.silos) if s not in kept]
    reports = local_reports(cfg, silos)
    frames = b"".join(report_frame(s, reports[s]) for s in silos)
    return settled(cfg, read_reports(frames, silos, cfg.runtime.on_silo_failure == "drop"), kept)


def agreed_in_process(cfg: Config) -> Config:
    """`agreement_in_process`'s config."""
    return agreement_in_process(cfg)[0]
