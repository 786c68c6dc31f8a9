"""Run under `mpirun -n 2`. Part 1 (rank 1 hosts silo 0): silo 0 sends malformed raw messages
on the MPI wire, the server must reject each one with an error naming the sender, the kind
and the round. Part 2 (rank 1 hosts silos 0-2, one thread each): co-located silos and the
server exchange messages concurrently and every one reaches the right party. Part 3: messages
to several parties (`isend_all`) arrive once per rank, shared read-only, and malformed
envelopes end the wait with an error naming the sender. Rank 0 prints a JSON report."""

import json
import threading
import time

import numpy as np
from mpi4py import MPI

from cfl_mpi.backends.mpi.channel import MpiChannel, MpiInbox
from cfl_mpi.backends.mpi.frames import envelope, inline_buffer
from cfl_mpi.channel import SERVER, ChannelClosed, LocalHub, PeerTimeout, RankLayout
from cfl_mpi.wire.messages import Expect, ProtocolError, encode_header, message_kind

world = MPI.COMM_WORLD
UPDATE, EVAL, MODEL = message_kind("test_update"), message_kind("test_eval"), message_kind("test_model")
GOOD = {"w": np.ones((2, 3), dtype=np.float32)}
EXPECT = Expect.like(UPDATE, 4, GOOD, {"n_samples": int})


PAYLOAD_TIMEOUT_S = 2.0


def inbox(layout, comm):
    """The rank's inbox on `comm` (collective use: every rank opens one)."""
    return MpiInbox(comm, layout, LocalHub(), threading.Lock(), 0.02)


def channel(address, box, timeout_s=20.0):
    return MpiChannel(address, box, timeout_s, 0.02, PAYLOAD_TIMEOUT_S)


def raw_send(ch, header: bytes, payloads):
    tag = ch.tag_of(0, SERVER)
    ch.comm.Send([np.frombuffer(header, dtype=np.uint8), MPI.BYTE], dest=0, tag=tag)
    for p in payloads:
        ch.comm.Send([p.view(np.uint8), MPI.BYTE], dest=0, tag=tag + 1)


def overrun(buffer: np.ndarray) -> np.ndarray:
    """An inline message whose header length says more bytes than the message holds."""
    buffer = buffer.copy()
    buffer[4:8] = np.frombuffer((len(buffer) + 1).to_bytes(4, "little"), np.uint8)
    return buffer


def cases():
    """(name, what silo 0 does through its channel on a fresh communicator)."""
    header = encode_header(UPDATE, 4, 0, GOOD, {"n_samples": 10})
    return {
        "good": lambda c: c.send(SERVER, UPDATE, 4, GOOD, n_samples=10),
        "wrong_kind": lambda c: c.send(SERVER, EVAL, 4, {}, accuracy=1.0),
        "wrong_round": lambda c: c.send(SERVER, UPDATE, 3, GOOD, n_samples=10),
        "wrong_shape": lambda c: c.send(SERVER, UPDATE, 4, {"w": np.ones((3, 2), np.float32)}, n_samples=10),
        "wrong_dtype": lambda c: c.send(SERVER, UPDATE, 4, {"w": np.ones((2, 3))}, n_samples=10),
        "non_finite": lambda c: c.send(SERVER, UPDATE, 4, {"w": np.full((2, 3), np.nan, np.float32)}, n_samples=10),
        "missing_meta": lambda c: c.send(SERVER, UPDATE, 4, GOOD),
        "oversized_payload": lambda c: raw_send(c, header, [np.ones(12, np.float32)]),
        "short_payload": lambda c: raw_send(c, header, [np.ones(4, np.float32)]),
        "garbage_header": lambda c: raw_send(c, b"\x80\x04not json", []),
        "header_without_payload": lambda c: c.send_header_only(SERVER, UPDATE, 4, GOOD, n_samples=10),
        "nan_meta": lambda c: raw_send(c, header.replace(b'"n_samples":10', b'"n_samples":NaN'), [GOOD["w"]]),
        "forged_sender": lambda c: raw_send(c, encode_header(UPDATE, 4, 5, GOOD, {"n_samples": 10}), [GOOD["w"]]),
        # a small message travels whole (header and arrays in one MPI message): the same checks
        "inline_short_payload": lambda c: raw_send(c, inline_buffer(header, [np.ones(4, np.float32)]).tobytes(), []),
        "inline_long_payload": lambda c: raw_send(c, inline_buffer(header, [np.ones(7, np.float32)]).tobytes(), []),
        "inline_header_overrun": lambda c: raw_send(c, overrun(inline_buffer(header, [GOOD["w"]])).tobytes(), []),
    }


def bad_messages(report):
    layout = RankLayout(1, 1)
    for name, case in cases().items():
        comm = world.Dup()  # leftovers of a rejected message cannot leak into the next case
        with inbox(layout, comm) as box:
            if world.Get_rank() == 1:
                case(channel(0, box))
            else:
                start = time.monotonic()
                try:
                    msg = channel(SERVER, box).recv(0, EXPECT)
                    report[name] = {"ok": True, "sum": float(msg.arrays["w"].sum())}
                except ProtocolError as err:
                    report[name] = {"ok": False, "error": str(err), "seconds": time.monotonic() - start}
            comm.Barrier()


def idle_wait_and_timeout(report):
    layout = RankLayout(1, 1)
    comm = world.Dup()
    with inbox(layout, comm) as box:
        if world.Get_rank() == 1:
            time.sleep(2.0)
            channel(0, box).send(SERVER, UPDATE, 4, GOOD, n_samples=1)
        else:
            server = channel(SERVER, box)
            server.recv(0, EXPECT)
            report["idle_wait"] = {"wall_s": server.waits.wall_s, "cpu_s": server.waits.cpu_s}
        comm.Barrier()
    silent = world.Dup()  # collective: every rank
    with inbox(layout, silent) as box:
        if world.Get_rank() == 0:
            try:
                channel(SERVER, box, timeout_s=0.5).recv(0, EXPECT)
            except PeerTimeout as err:
                report["timeout"] = {"error": str(err)}
        world.Barrier()


def silos_sharing_a_rank(report):
    """Silos 0-2 on rank 1: each sends the server its index and its right neighbour a message,
    then waits for the server's reply; the server answers each with what it got. (The report
    travels on `world`, where no inbox takes messages.)"""
    layout, comm = RankLayout(3, 1), world.Dup()
    with inbox(layout, comm) as box:
        if world.Get_rank() == 0:
            server = channel(SERVER, box)
            got = {}
            for msg in server.recv_each(range(3), lambda _: Expect(UPDATE, 1, (), {"silo": int})):
                got[msg.sender] = msg.meta["silo"]
                server.send(msg.sender, MODEL, 1, {"echo": np.full(4, msg.sender, np.int64)})
            report["shared_rank"] = {"server_got": got}
        else:
            heard = {}
            channels = {c: channel(c, box) for c in range(3)}

            def silo(c):
                ch = channels[c]
                ch.send((c + 1) % 3, EVAL, 1, None, from_silo=c)
                ch.send(SERVER, UPDATE, 1, None, silo=c)
                left = ch.recv((c - 1) % 3, Expect(EVAL, 1, (), {"from_silo": int})).meta["from_silo"]
                echo = ch.recv(SERVER, Expect.like(MODEL, 1, {"echo": np.zeros(4, np.int64)})).arrays["echo"]
                heard[c] = (left, int(echo[0]))

            threads = [threading.Thread(target=silo, args=(c,)) for c in range(3)]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
        comm.Barrier()
    if world.Get_rank() == 1:
        world.Send([np.array([heard[c] for c in range(3)], dtype=np.int64), MPI.INT64_T], dest=0, tag=999)
    else:
        heard_buf = np.empty((3, 2), dtype=np.int64)
        world.Recv([heard_buf, MPI.INT64_T], source=1, tag=999)
        report["shared_rank"]["silos_heard"] = heard_buf.tolist()
    world.Barrier()


def gather_to_server(report, key, rows):
    """Rank 1's (n, k) int64 rows into report[key] on rank 0 (on `world`: no inbox there)."""
    if world.Get_rank() == 1:
        world.Send([np.asarray(rows, dtype=np.int64), MPI.INT64_T], dest=0, tag=998)
    else:
        buf = np.empty(np.shape(rows), dtype=np.int64)
        world.Recv([buf, MPI.INT64_T], source=1, tag=998)
        report[key] = buf.tolist()
    world.Barrier()


def to_several(report):
    """The server sends silos 0-2 (all on rank 1) one message; silo 0 sends the server and
    silos 1-2 one. Per silo: (sum received from the server, writeable, shares memory with silo
    0's copy, sum received from silo 0)."""
    layout, comm = RankLayout(3, 1), world.Dup()
    w = {"w": np.arange(6, dtype=np.float32).reshape(2, 3)}
    rows = [[0, 0, 0, 0]] * 3
    with inbox(layout, comm) as box:
        if world.Get_rank() == 0:
            server = channel(SERVER, box)
            server.isend_all([0, 1, 2], MODEL, 1, w).wait()
            msg = server.recv(0, Expect.like(EVAL, 1, w))
            report["to_several"] = {
                "server_got": float(msg.arrays["w"].sum()),
                "server_bytes": server.sent_bytes["test_model"],
            }
        else:
            channels = {c: channel(c, box) for c in range(3)}
            got = {}

            def silo(c):
                ch = channels[c]
                if c == 0:
                    ch.isend_all([SERVER, 1, 2], EVAL, 1, {"w": 2 * w["w"]}).wait()
                got[c] = ch.recv(SERVER, Expect.like(MODEL, 1, w)).arrays["w"]
                if c:
                    got[(c, 0)] = ch.recv(0, Expect.like(EVAL, 1, w)).arrays["w"]

            threads = [threading.Thread(target=silo, args=(c,)) for c in range(3)]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            rows = [
                [
                    int(got[c].sum()),
                    int(got[c].flags.writeable),
                    int(np.shares_memory(got[c], got[0])),
                    int(got[(c, 0)].sum()) if c else -1,
                ]
                for c in range(3)
            ]
        comm.Barrier()
    gather_to_server(report, "to_several_silos", rows)


def bad_envelopes(report):
    """Silo 0 (rank 1) sends malformed messages on its multicast tags to the server."""
    layout = RankLayout(1, 1)
    good = encode_header(UPDATE, 4, 0, GOOD, {"n_samples": 10})
    cases = {
        "envelope_bad_receiver": ([3], 1, good, [GOOD["w"]]),
        "envelope_repeated_receiver": ([0, 0], 1, good, [GOOD["w"]]),
        "envelope_short_payload": ([0], 1, good, [np.ones(4, np.float32)]),
        "envelope_wrong_kind": ([0], 1, encode_header(EVAL, 4, 0, GOOD, {"n_samples": 10}), [GOOD["w"]]),
        "envelope_without_payload": ([0], 1, good, []),
        "payload_without_envelope": (None, 0, b"", [GOOD["w"]]),
    }
    for name, (slots, payloads, header, arrays) in cases.items():
        comm = world.Dup()
        with inbox(layout, comm) as box:
            if world.Get_rank() == 1:
                tag = box.multicast_tag(0)
                if slots is not None:
                    comm.Send([envelope(slots, payloads, header), MPI.BYTE], dest=0, tag=tag)
                for a in arrays:
                    comm.Send([a.view(np.uint8), MPI.BYTE], dest=0, tag=tag + 1)
            else:
                try:
                    channel(SERVER, box, timeout_s=10.0).recv(0, EXPECT)
                    report[name] = {"ok": True}
                except (ProtocolError, ChannelClosed) as err:
                    report[name] = {"ok": False, "error": str(err)}
            comm.Barrier()


def large_payloads(report):
    """Payloads larger than MPI's eager messages: silo 0 sends the server a 360 KB array
    directly and as a message to several parties."""
    layout, comm = RankLayout(1, 1), world.Dup()
    big = {"w": np.arange(300 * 300, dtype=np.float32).reshape(300, 300)}
    with inbox(layout, comm) as box:
        if world.Get_rank() == 1:
            ch = channel(0, box)
            ch.send(SERVER, UPDATE, 4, big)
            ch.isend_all([SERVER], EVAL, 4, big).wait()
        else:
            server = channel(SERVER, box)
            direct = server.recv(0, Expect.like(UPDATE, 4, big)).arrays["w"]
            shared = server.recv(0, Expect.like(EVAL, 4, big)).arrays["w"]
            report["large"] = [float(direct.sum()), float(shared.sum()), float(big["w"].sum())]
        comm.Barrier()


def empty_arrays(report):
    """Arrays of 0 bytes travel in their header alone: silo 0 sends the server, directly and
    to several parties, a message with an empty array between two others, then one whose
    only array is empty, then a good one (nothing is left over between them)."""
    layout, comm = RankLayout(1, 1), world.Dup()
    mixed = {"a": np.arange(3, dtype=np.int64), "none": np.zeros((0, 4), np.float32), "b": np.ones(2, np.uint8)}
    empty = {"none": np.zeros(0, np.int64)}
    with inbox(layout, comm) as box:
        if world.Get_rank() == 1:
            ch = channel(0, box)
            ch.send(SERVER, EVAL, 4, mixed)
            ch.send(SERVER, MODEL, 4, empty)
            ch.isend_all([SERVER], EVAL, 4, mixed).wait()
            ch.isend_all([SERVER], MODEL, 4, empty).wait()
            ch.send(SERVER, UPDATE, 4, GOOD, n_samples=10)
        else:
            server, got = channel(SERVER, box), []
            for _ in range(2):
                m = server.recv(0, Expect.like(EVAL, 4, mixed)).arrays
                e = server.recv(0, Expect.like(MODEL, 4, empty)).arrays
                got.append([m["a"].tolist(), list(m["none"].shape), m["b"].tolist(), list(e["none"].shape)])
            got.append(float(server.recv(0, EXPECT).arrays["w"].sum()))
            report["empty_arrays"] = got
        comm.Barrier()


def main():
    report = {}
    bad_messages(report)
    idle_wait_and_timeout(report)
    silos_sharing_a_rank(report)
    to_several(report)
    bad_envelopes(report)
    large_payloads(report)
    empty_arrays(report)
    if world.Get_rank() == 0:
        print(json.dumps(report), flush=True)


main()
