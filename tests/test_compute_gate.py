"""The compute gate (runtime/compute.py): how many silos of a process compute at once."""
from __future__ import annotations

import threading
import time

import pytest

from cfl_mpi.runtime.compute import ComputeGate


def test_no_more_than_slots_silos_are_inside_at_once_and_every_one_gets_its_turn():
    gate, inside, most, done = ComputeGate(2), [0], [0], []
    lock = threading.Lock()

    def silo(i: int) -> None:
        with gate:
            with lock:
                inside[0] += 1
                most[0] = max(most[0], inside[0])
            time.sleep(0.02)
            with lock:
                inside[0] -= 1
        done.append(i)

    threads = [threading.Thread(target=silo, args=(i,)) for i in range(12)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    assert most[0] == 2 and sorted(done) == list(range(12))


def test_a_failure_inside_frees_the_slot():
    gate = ComputeGate(1)
    with pytest.raises(RuntimeError), gate:
        raise RuntimeError("boom")
    with gate:  # would block forever had the slot not been freed
        pass


@pytest.mark.parametrize("cores, threads, silos, node_silos, slots", [
    (2, 1, 50, 100, 1),    # 100 silos on 2 ranks of a 2-core node: one each
    (2, 1, 100, 100, 2),   # the simulator: the process's 2 cores
    (8, 1, 8, 8, 8),       # 8 silos on one rank of 8 cores: all at once
    (16, 4, 1, 4, 1),      # one silo per rank, 4 threads each
    (2, 1, 1, 41, 1),      # 41 ranks on 2 cores: at least one
])
def test_the_slots_are_the_process_share_of_the_cores(cores, threads, silos, node_silos, slots):
    assert ComputeGate.for_share(cores, threads, silos, node_silos).slots == slots
