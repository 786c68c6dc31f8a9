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


@pytest.mark.parametrize(
    "cores, threads, silos, node_silos, slots",
    [
        (2, 1, 50, 100, 1),  # 100 silos on 2 ranks of a 2-core node: one each
        (2, 1, 100, 100, 2),  # the simulator: the process's 2 cores
        (8, 1, 8, 8, 8),  # 8 silos on one rank of 8 cores: all at once
        (16, 4, 1, 4, 1),  # one silo per rank, 4 threads each
        (2, 1, 1, 41, 1),  # 41 ranks on 2 cores: at least one
    ],
)
def test_the_workers_are_the_process_share_of_the_cores(cores, threads, silos, node_silos, slots):
    with ComputePool.for_share(cores, threads, silos, node_silos) as pool:
        assert pool.slots == slots


def test_callers_of_one_key_queued_behind_a_busy_worker_share_a_call_up_to_the_limit():
    """While the only worker is busy, 7 callers queue items under key "a" (limit 3) and 2 under
    "b": they are computed in calls of 3, 3, 1 and 2 items, and each caller gets its own result."""
    calls: list[tuple[str, list[int]]] = []
    release = threading.Event()
    results: dict[tuple[str, int], int] = {}

    def square_all(key: str):
        def fn(items: list[int]) -> list[int]:
            calls.append((key, list(items)))
            return [i * i for i in items]

        return fn

    with ComputePool(1) as compute:
        blocker = threading.Thread(target=compute, args=(release.wait,))
        blocker.start()
        time.sleep(0.1)  # the worker is now busy
        threads = []
        for key, i in [("a", i) for i in range(7)] + [("b", i) for i in range(2)]:

            def caller(key=key, i=i):
                results[(key, i)] = compute.batched(key, square_all(key), i, limit=3)

            threads.append(threading.Thread(target=caller))
            threads[-1].start()
            time.sleep(0.01)  # in this order
        release.set()
        for t in [blocker, *threads]:
            t.join(10)
    assert results == {(k, i): i * i for k, i in results} and len(results) == 9
    assert sorted(len(items) for key, items in calls if key == "a") == [1, 3, 3]
    assert [items for key, items in calls if key == "b"] == [[0, 1]]


def test_a_failure_of_a_batched_call_reaches_each_of_its_callers():
    def boom(items: list[int]) -> list[int]:
        time.sleep(0.05)
        raise RuntimeError("boom")

    errors = []
    with ComputePool(1) as compute:

        def caller(i: int) -> None:
            try:
                compute.batched("k", boom, i, limit=8)
            except RuntimeError as err:
                errors.append(str(err))

        threads = [threading.Thread(target=caller, args=(i,)) for i in range(3)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(10)
        assert compute.batched("k", lambda items: [len(items)], 0, limit=8) == 1  # the worker lives on
    assert errors == ["boom"] * 3


def test_a_group_computes_together_once_every_member_queued_in_the_members_order():
    """Members 3, 1 and 2 queue one after another (3 first): one call, items in the group's
    order [1, 2, 3], whoever came first; each gets its own result."""
    calls: list[list[int]] = []
    results: dict[int, int] = {}

    def square_all(items: list[int]) -> list[int]:
        calls.append(list(items))
        return [i * i for i in items]

    with ComputePool(2) as compute:

        def member(i: int) -> None:
            results[i] = compute.together("train", square_all, i, i, lambda: [1, 2, 3])

        threads = []
        for i in (3, 1, 2):
            threads.append(threading.Thread(target=member, args=(i,)))
            threads[-1].start()
            time.sleep(0.05)
            assert not calls or i == 2  # nobody computes before the last member queued
        for t in threads:
            t.join(10)
    assert calls == [[1, 2, 3]] and results == {1: 1, 2: 4, 3: 9}


def test_a_member_that_withdraws_is_not_waited_for_now_or_later():
    calls: list[list[int]] = []

    def echo(items: list[int]) -> list[int]:
        calls.append(list(items))
        return items

    with ComputePool(1) as compute:
        got: dict[int, int] = {}
        waiting = threading.Thread(target=lambda: got.update({1: compute.together("r1", echo, 1, 1, lambda: [1, 2])}))
        waiting.start()
        time.sleep(0.05)
        compute.withdraw(2)  # silo 2 left: its mate goes on
        waiting.join(10)
        assert got == {1: 1} and compute.together("r2", echo, 1, 1, lambda: [1, 2]) == 1
    assert calls == [[1], [1]]
    with ComputePool(1) as compute, pytest.raises(ValueError, match="not a member of group 'k'"):
        compute.together("k", echo, 5, 5, lambda: [1, 2])
