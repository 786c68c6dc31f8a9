"""Parties of a test run as threads over in-process channels (the server and silos of an
exchange), each body's outcome kept."""

import threading

from cfl_mpi.channel import PeerTimeout
from cfl_mpi.wire.messages import ProtocolError


def in_threads(*bodies):
    """Run each body in a thread; return what each returned or raised (a protocol error or a
    timeout). A thread still running after a minute is a hang, and fails the test."""
    results: list = [None] * len(bodies)

    def run(i, body):
        try:
            results[i] = body()
        except (ProtocolError, PeerTimeout) as err:
            results[i] = err

    threads = [threading.Thread(target=run, args=(i, b)) for i, b in enumerate(bodies)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not any(t.is_alive() for t in threads), "the exchange hangs"
    return results
