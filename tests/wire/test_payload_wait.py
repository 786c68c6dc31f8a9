"""How long a receiver waits for a payload its rank's inbox is to file behind a header
(`MpiChannel._await_payload`, without MPI: the inbox's state is what the rule reads). An honest
peer posts the payload right behind its header, so it is late once the inbox has caught up (found
nothing more in MPI for the rank) a payload timeout after the wait began; an inbox behind on a
burst has not filed yet what came at once, and its peer is not blamed."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from types import SimpleNamespace

import pytest

from cfl_mpi.backends.mpi.channel import MpiChannel
from cfl_mpi.channel import LocalChannel, LocalHub, RankLayout
from cfl_mpi.wire.messages import ProtocolError

PAYLOAD_TIMEOUT_S = 0.2


def receiver(message_timeout_s: float = 30.0) -> MpiChannel:
    """Silo 0's channel on a rank whose inbox has not found MPI empty yet."""
    channel = object.__new__(MpiChannel)
    LocalChannel.__init__(channel, 0, LocalHub(), message_timeout_s, 0.02)
    channel.layout, channel.payload_timeout_s = RankLayout(1, 1), PAYLOAD_TIMEOUT_S
    channel.inbox = SimpleNamespace(idle_at=0.0)
    return channel


def later(seconds: float, action: Callable[[], object]) -> None:
    threading.Thread(target=lambda: (time.sleep(seconds), action()), daemon=True).start()


def test_a_payload_filed_after_the_timeout_by_an_inbox_still_behind_is_taken_not_blamed():
    channel, filed = receiver(), threading.Event()
    start = time.monotonic()
    later(4 * PAYLOAD_TIMEOUT_S, lambda: (filed.set(), channel.hub.bell(0).set()))
    channel._await_payload(filed.is_set, "silo 7 (rank 2)", "update (round 3)", rung=True)
    assert time.monotonic() - start >= 3 * PAYLOAD_TIMEOUT_S  # well past the payload timeout


def test_a_payload_missing_once_the_inbox_has_caught_up_is_late_naming_the_sender():
    channel, stop = receiver(), threading.Event()

    def inbox_polling() -> None:  # an idle inbox finds MPI empty every poll
        while not stop.is_set():
            channel.inbox.idle_at = time.monotonic()
            time.sleep(0.01)

    threading.Thread(target=inbox_polling, daemon=True).start()
    start = time.monotonic()
    try:
        with pytest.raises(
            ProtocolError, match=r"^silo 7 \(rank 2\) sent a header of update \(round 3\) whose payload"
        ):
            channel._await_payload(lambda: False, "silo 7 (rank 2)", "update (round 3)", rung=True)
    finally:
        stop.set()
    assert PAYLOAD_TIMEOUT_S <= time.monotonic() - start < 10 * PAYLOAD_TIMEOUT_S


def test_an_inbox_that_never_catches_up_still_ends_the_wait_at_the_message_timeout():
    channel = receiver(message_timeout_s=0.6)
    start = time.monotonic()
    with pytest.raises(ProtocolError, match="did not follow within 0.2 s"):
        channel._await_payload(lambda: False, "silo 7 (rank 2)", "update (round 3)", rung=True)
    assert 0.6 <= time.monotonic() - start < 3.0
