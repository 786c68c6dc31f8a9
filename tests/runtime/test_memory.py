"""FreedMemory hands a process's freed memory back to the system, periodically, while open."""

import platform
import threading
import time

import pytest

from cfl_mpi.runtime import memory
from cfl_mpi.runtime.memory import FreedMemory


def test_it_trims_every_period_while_open_and_stops_on_exit(monkeypatch):
    calls = []
    called = threading.Event()

    def trim(pad: int) -> int:
        calls.append(pad)
        called.set()
        return 1

    monkeypatch.setattr(memory, "_malloc_trim", lambda: trim)
    with FreedMemory(period_s=0.01):
        assert called.wait(5)
    time.sleep(0.05)  # a call under way when it closed may still land
    after = len(calls)
    time.sleep(0.1)
    assert len(calls) == after and set(calls) == {0}


def test_where_the_c_library_has_no_malloc_trim_it_does_nothing(monkeypatch):
    monkeypatch.setattr(memory, "_malloc_trim", lambda: None)
    with FreedMemory(period_s=0.01) as freed:
        assert not freed._thread.is_alive()


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="malloc_trim is glibc's")
def test_glibc_has_it():
    assert memory._malloc_trim() is not None
