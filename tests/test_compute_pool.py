"""The compute pool (runtime/compute.py): where the silos of a process compute."""
from __future__ import annotations

import threading
import time

import pytest

from cfl_mpi.runtime.compute import ComputePool


def test_silos_compute_on_the_pools_workers_at_most_slots_at_once_and_each_gets_its_result():
    inside, most, workers = [0], [0], set()
    lock = threading.Lock()
    results = {}

    def work(i: int) -> int:
        with lock:
            inside[0] += 1
            most[0] = max(most[0], inside[0])
            workers.add(threading.get_ident())
        time.sleep(0.02)
        with lock:
            inside[0] -= 1
        return i * i

    with ComputePool(2) as compute:
        def silo(i: int) -> None:
            results[i] = compute(work, i)

        threads = [threading.Thread(target=silo, args=(i,)) for i in range(12)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(10)
    assert most[0] == 2 and results == {i: i * i for i in range(12)}
    # the computations ran on the pool's two threads, none in a silo's own
    assert len(workers) == 2 and not workers & {t.ident for t in threads}


def test_a_failure_reaches_its_caller_and_frees_the_worker():
    def boom() -> None:
        raise RuntimeError("boom")

    with ComputePool(1) as compute:
        with pytest.raises(RuntimeError, match="boom"):
            compute(boom)
        assert compute(lambda: 7) == 7  # would block forever had the worker been lost


@pytest.mark.parametrize("cores, threads, silos, node_silos, slots", [
    (2, 1, 50, 100, 1),    # 100 silos on 2 ranks of a 2-core node: one each
    (2, 1, 100, 100, 2),   # the simulator: the process's 2 cores
    (8, 1, 8, 8, 8),       # 8 silos on one rank of 8 cores: all at once
    (16, 4, 1, 4, 1),      # one silo per rank, 4 threads each
    (2, 1, 1, 41, 1),      # 41 ranks on 2 cores: at least one
])
def test_the_workers_are_the_process_share_of_the_cores(cores, threads, silos, node_silos, slots):
    with ComputePool.for_share(cores, threads, silos, node_silos) as pool:
        assert pool.slots == slots
