"""The agreement before the first round, for data sets whose silos read files of their own:
each silo reports what the server needs of its data and nothing more, as a declared message,
and every party checks the reports against each other the same way (runtime/agreement.py).

The reports travel before the channels exist, right after the config check (the MPI job
gathers them in one collective: backends/job.py), so that a missing or malformed file ends the job in
seconds, before any rank imports torch; as raw header bytes of a fixed width, read with the
same checks as any message from a peer (wire/messages.py).
"""

from __future__ import annotations

import numpy as np

from ..wire.messages import Message, check_payload, decode_header, encode_header
from ..wire.payload import Payload, scalar
from ..wire.round import MAX_SAMPLES
from .spec import SiloData

MAX_EDGE = 1 << 20  # no example has an axis longer than this: a larger one is a lie
MAX_CLASSES = 1 << 20
REPORT_BYTES = 512  # the width of one report's frame (its JSON header, padded with spaces)


class DataReport(Payload, kind="data"):
    """silo → every party, once, before the first round (round 0): the shape of one example
    (`ndim` axes, the unused ones 0), the largest label it holds and how many distinct, and
    its example counts per split."""

    ndim: int = scalar(int, 1, 3)
    axis0: int = scalar(int, 1, MAX_EDGE)
    axis1: int = scalar(int, 0, MAX_EDGE)
    axis2: int = scalar(int, 0, MAX_EDGE)
    max_label: int = scalar(int, 0, MAX_CLASSES - 1)
    labels_seen: int = scalar(int, 1, MAX_CLASSES)
    n_train: int = scalar(int, 1, MAX_SAMPLES)
    n_val: int = scalar(int, 1, MAX_SAMPLES)
    n_test: int = scalar(int, 1, MAX_SAMPLES)

    @property
    def shape(self) -> tuple[int, ...]:
        return (self.axis0, self.axis1, self.axis2)[: self.ndim]

    def problem(self) -> str | None:
        if any((self.axis1, self.axis2)[self.ndim - 1 :]) or 0 in self.shape:
            return f"a shape of {self.ndim} axes given as {self.axis0}x{self.axis1}x{self.axis2}"
        if self.labels_seen > self.max_label + 1:
            return f"{self.labels_seen} distinct labels of at most {self.max_label}"
        return None

    @staticmethod
    def of_data(data: SiloData) -> DataReport:
        """What a silo reports of its data."""
        shape = data.x_train.shape[1:]
        labels = np.concatenate([data.y_train, data.y_val, data.y_test])
        axes = [*shape, 0, 0]
        return DataReport(
            ndim=len(shape),
            axis0=axes[0],
            axis1=axes[1],
            axis2=axes[2],
            max_label=int(labels.max()),
            labels_seen=len(np.unique(labels)),
            n_train=len(data.y_train),
            n_val=len(data.y_val),
            n_test=len(data.y_test),
        )


def frame(silo: int, report: DataReport) -> bytes:
    """The report of `silo` as a frame of REPORT_BYTES bytes."""
    header = encode_header(DataReport.KIND, 0, silo, {}, report.meta())
    return header.ljust(REPORT_BYTES)


def read_frames(frames: bytes, silos: list[int]) -> dict[int, DataReport]:
    """The reports of `silos`, one frame each in that order; ProtocolError naming the silo, the
    kind and the round for any frame that is not a well-formed report of its own."""
    expect = DataReport.expect(0)
    reports = {}
    for i, silo in enumerate(silos):
        who = f"silo {silo}"
        _, meta = decode_header(frames[i * REPORT_BYTES : (i + 1) * REPORT_BYTES], silo, who, expect)
        check_payload({}, meta, who, expect)
        reports[silo] = DataReport.of(Message(expect.kind, 0, silo, {}, meta, who))
    return reports


def shape_text(shape: tuple[int, ...]) -> str:
    """An example's shape as an error writes it: 1x28x28."""
    return "x".join(map(str, shape))


def shape_fix(shape: tuple[int, ...], other: tuple[int, ...]) -> str:
    """How silos whose examples are `shape` and `other` come to agree, as an error's fix says it."""
    if len(shape) == len(other) == 3 and shape[0] != other[0] and {shape[0], other[0]} <= {1, 3}:
        return "set data.channels: 1 or 3 to give every silo's images one channel count"
    if len(shape) == len(other) == 3 and shape[1:] != other[1:]:
        return "image folders: set data.image_size to resize every silo's images to one edge"
    return "every silo's examples must have one shape"
