"""The in-process channel and the rank layout: every message checked as on MPI, waiting that
does not spin, timeouts and failures that end a wait promptly, and silo → rank blocks."""

import threading
import time

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from cfl_mpi.backends.mpi.frames import InlineFrame, inline_buffer
from cfl_mpi.channel import SERVER, ChannelClosed, LocalChannel, LocalHub, PeerTimeout, RankLayout
from cfl_mpi.channel.local import SharedFrame
from cfl_mpi.wire.messages import Expect, ProtocolError, encode_header, message_kind
from cfl_mpi.wire.messages import check_payload as local_check
from cfl_mpi.wire.messages import read_header as local_read

PING = message_kind("test_ping")
PONG = message_kind("test_pong")
GOOD = {"w": np.ones((2, 3), dtype=np.float32)}
EXPECT = Expect.like(PING, 4, GOOD, {"n_samples": int})


def pair(timeout_s: float = 5.0) -> tuple[LocalHub, LocalChannel, LocalChannel]:
    hub = LocalHub()
    return hub, LocalChannel(SERVER, hub, timeout_s, 0.02), LocalChannel(0, hub, timeout_s, 0.02)


def test_a_good_message_arrives_as_a_copy_with_its_meta_and_counted_bytes():
    _, server, silo = pair()
    arrays = {"w": np.arange(6, dtype=np.float32).reshape(2, 3), "steps": np.array(7, dtype=np.int64)}
    silo.send(SERVER, PING, 4, arrays, n_samples=10)
    arrays["w"][:] = -1  # the sender may reuse its buffers at once
    msg = server.recv(0, Expect.like(PING, 4, {"w": GOOD["w"], "steps": arrays["steps"]}, {"n_samples": int}))
    assert msg.sender == 0 and msg.who == "silo 0" and msg.meta["n_samples"] == 10
    np.testing.assert_array_equal(msg.arrays["w"], np.arange(6).reshape(2, 3))
    assert msg.arrays["steps"].shape == () and int(msg.arrays["steps"]) == 7
    assert silo.sent_bytes["test_ping"] > 6 * 4 + 8


def test_a_message_to_several_silos_is_one_read_only_copy_they_share_counted_once():
    hub = LocalHub()
    server, *silos = (LocalChannel(a, hub, 5.0, 0.02) for a in (SERVER, 0, 1, 2))
    arrays = {"w": np.arange(6, dtype=np.float32).reshape(2, 3)}
    sent = server.isend_all([0, 1, 2], PING, 4, arrays, n_samples=10)
    arrays["w"][:] = -1  # the sender may reuse its buffers at once
    expect = Expect.like(PING, 4, GOOD, {"n_samples": int})
    got = [silo.recv(SERVER, expect) for silo in silos[:2]]
    assert not sent.done()  # silo 2 has not taken it
    got.append(silos[2].recv(SERVER, expect))
    assert sent.done()
    for msg in got:
        np.testing.assert_array_equal(msg.arrays["w"], np.arange(6).reshape(2, 3))
        assert msg.meta["n_samples"] == 10 and not msg.arrays["w"].flags.writeable
    assert np.shares_memory(got[0].arrays["w"], got[2].arrays["w"])
    one = len(encode_header(PING, 4, SERVER, arrays, {"n_samples": 10})) + 6 * 4
    assert server.sent_bytes["test_ping"] == one  # once for the process, not once per receiver


class CountingLock:
    """A lock that counts how often it is taken."""

    def __init__(self) -> None:
        self.lock, self.taken = threading.Lock(), 0

    def __enter__(self) -> None:
        self.lock.acquire()
        self.taken += 1

    def __exit__(self, *exc: object) -> None:
        self.lock.release()


def test_a_frame_for_many_receivers_is_queued_under_one_taking_of_the_lock_and_rings_only_theirs():
    """A rank's inbox delivers a message to every silo of the rank: taking the hub's lock once
    per receiver, it would queue behind the silo threads it wakes each time."""
    hub = LocalHub()
    dropped = []
    hub.disown(5, 2, dropped.append)
    hub.deliver(5, 0, SharedFrame(b"{}", 0))  # an earlier frame to silo 0: the numbers count on
    bells = [hub.bell(d) for d in range(4)]
    bells[0].clear()
    hub._lock = counting = CountingLock()
    frame = SharedFrame(b"{}", 1)
    assert hub.deliver_all(5, [0, 1, 2], frame) == [1, 0, 0]
    assert counting.taken == 1
    assert [b.is_set() for b in bells] == [True, True, False, False]  # 2 disowned 5; 3 was not sent it
    assert dropped == [frame] and hub.waiting_among(1, [5]) == [5] and not hub.waiting(5, 2)
    assert hub.taken(5, 2, 0) and not hub.taken(5, 1, 0)


def test_a_shared_frames_last_payload_rings_the_receiver_fetching_it_and_no_other():
    frame, fetcher, other = SharedFrame(b"{}", 2), threading.Event(), threading.Event()
    frame.completed()  # nobody fetching yet: nobody rung, and a fetcher's first look sees it complete
    assert frame.complete.is_set() and not fetcher.is_set()
    frame = SharedFrame(b"{}", 2)
    frame.fetcher = fetcher
    frame.completed()
    assert frame.complete.is_set() and fetcher.is_set() and not other.is_set()


def test_a_message_to_several_silos_is_checked_by_each_receiver():
    hub = LocalHub()
    server, silo = LocalChannel(SERVER, hub, 5.0, 0.02), LocalChannel(0, hub, 5.0, 0.02)
    silo.isend_all([SERVER], PING, 4, {"w": np.full((2, 3), np.nan, np.float32)}, n_samples=1)
    with pytest.raises(ProtocolError, match="silo 0.*non-finite"):
        server.recv(0, EXPECT)
    with pytest.raises(ValueError, match="repeated or itself"):
        silo.isend_all([1, 1], PING, 4, GOOD, n_samples=1)


def test_a_message_to_several_silos_is_read_and_checked_once_yet_each_receiver_gets_its_verdict(monkeypatch):
    """One JSON read and one finite check for every receiver of the rank, but each receiver
    checks the header against what it expects, and a non-finite payload fails each of them."""
    import cfl_mpi.channel.local as local

    reads, checks = [], []
    monkeypatch.setattr(local, "read_header", lambda data: reads.append(data) or local_read(data))
    monkeypatch.setattr(local, "check_payload", lambda *a: checks.append(a) or local_check(*a))
    hub = LocalHub()
    server, *silos = (LocalChannel(a, hub, 5.0, 0.02) for a in (SERVER, 0, 1, 2))
    server.isend_all([0, 1, 2], PING, 4, GOOD, n_samples=10)
    for silo in silos[:2]:
        assert silo.recv(SERVER, EXPECT).meta == {"n_samples": 10}
    with pytest.raises(ProtocolError, match="server sent a bad message .* round 5.*message is for round 4"):
        silos[2].recv(SERVER, Expect.like(PING, 5, GOOD, {"n_samples": int}))
    assert len(reads) == 1 and len(checks) == 1
    server.isend_all([0, 1], PING, 4, {"w": np.full((2, 3), np.inf, np.float32)}, n_samples=10)
    for silo in silos[:2]:
        with pytest.raises(ProtocolError, match="server sent non-finite values in 'w' of test_ping"):
            silo.recv(SERVER, EXPECT)
    assert len(checks) == 2


def bad_frames():
    """(case, header bytes, payload arrays, words the error must hold) as a hostile silo 0 sends them."""
    header = encode_header(PING, 4, 0, GOOD, {"n_samples": 10})
    w = GOOD["w"]
    return [
        ("wrong_kind", encode_header(PONG, 4, 0, GOOD, {"n_samples": 10}), [w], "kind 'test_pong'"),
        ("wrong_round", encode_header(PING, 3, 0, GOOD, {"n_samples": 10}), [w], "for round 3"),
        (
            "wrong_shape",
            encode_header(PING, 4, 0, {"w": np.ones((3, 2), np.float32)}, {"n_samples": 10}),
            [np.ones((3, 2), np.float32)],
            "shape (3, 2)",
        ),
        (
            "wrong_dtype",
            encode_header(PING, 4, 0, {"w": np.ones((2, 3))}, {"n_samples": 10}),
            [np.ones((2, 3))],
            "dtype float64",
        ),
        ("non_finite", header, [np.full((2, 3), np.nan, np.float32)], "non-finite"),
        ("missing_meta", encode_header(PING, 4, 0, GOOD, {}), [w], "meta 'n_samples'"),
        ("short_payload", header, [np.ones(4, np.float32)], "does not fit its header"),
        ("garbage_header", b"\x80\x04not json", [], "not JSON"),
        ("nan_meta", header.replace(b'"n_samples":10', b'"n_samples":NaN'), [w], "non-finite number NaN"),
        ("forged_sender", encode_header(PING, 4, 5, GOOD, {"n_samples": 10}), [w], "claims sender 5"),
    ]


@pytest.mark.parametrize("case,header,payload,words", bad_frames(), ids=[c[0] for c in bad_frames()])
def test_bad_messages_are_rejected_naming_sender_kind_and_round(case, header, payload, words):
    hub, server, _ = pair()
    hub.post(0, SERVER, header, payload)
    with pytest.raises(ProtocolError) as err:
        server.recv(0, EXPECT)
    assert "silo 0" in str(err.value) and "test_ping" in str(err.value) and "round 4" in str(err.value)
    assert words in str(err.value)


def test_waiting_does_not_spin_and_wakes_at_once_on_arrival():
    _, server, silo = pair()
    threading.Timer(1.0, lambda: silo.send(SERVER, PING, 4, GOOD, n_samples=1)).start()
    start = time.monotonic()
    server.recv(0, EXPECT)
    woke = time.monotonic() - start
    assert 0.9 < woke < 1.5 and server.waits.wall_s > 0.9
    assert server.waits.cpu_s < 0.1 * server.waits.wall_s, server.waits  # a spinning wait would be ~1.0


def test_a_silent_peer_times_out_naming_both_parties():
    _, server, _ = pair(timeout_s=0.3)
    with pytest.raises(PeerTimeout, match=r"the server: waited 0 s for a message from silo 0"):
        server.recv(0, EXPECT)


def test_a_silo_waits_twice_as_long_for_the_server_so_the_server_names_a_silent_silo_first():
    """The server's wait for updates restarts with each arrival: with equal timeouts a silo
    that sent early timed out first and blamed the server (seen in CI)."""
    _, server, silo = pair(timeout_s=2)
    with pytest.raises(PeerTimeout, match=r"silo 0: waited 4 s for a message from the server"):
        silo.recv(SERVER, EXPECT)
    with pytest.raises(PeerTimeout, match=r"the server: waited 2 s for a message from silo 0"):
        server.recv(0, EXPECT)


def test_a_failure_elsewhere_in_the_process_ends_every_wait_at_once():
    hub, server, _ = pair(timeout_s=60)
    threading.Timer(0.3, lambda: hub.fail("silo 3 failed: boom")).start()
    start = time.monotonic()
    with pytest.raises(ChannelClosed, match="silo 3 failed: boom"):
        server.recv(0, EXPECT)
    assert time.monotonic() - start < 2 and server.closed()


def test_recv_each_yields_one_message_per_sender():
    hub = LocalHub()
    server = LocalChannel(SERVER, hub, 5, 0.02)
    silos = [LocalChannel(c, hub, 5, 0.02) for c in range(3)]
    for c in (2, 0, 1):
        silos[c].send(SERVER, PING, 4, GOOD, n_samples=c + 1)
    got = {m.sender: m.meta["n_samples"] for m in server.recv_each(range(3), lambda _: EXPECT)}
    assert got == {0: 1, 1: 2, 2: 3}
    assert not any(hub.waiting(c, SERVER) for c in range(3))


def test_recv_each_takes_those_waiting_in_order_then_waits_for_the_rest():
    """A look takes every sender already waiting (in order); a sender's second message stays
    for a later receive; a sender that comes later is waited for."""
    hub = LocalHub()
    server = LocalChannel(SERVER, hub, 5, 0.02)
    silos = [LocalChannel(c, hub, 5, 0.02) for c in range(4)]
    for c in (3, 1, 0, 1):
        silos[c].send(SERVER, PING, 4, GOOD, n_samples=c + 1)
    threading.Timer(0.2, lambda: silos[2].send(SERVER, PING, 4, GOOD, n_samples=3)).start()
    assert server.ready_among({0, 1, 2, 3}) == [0, 1, 3]
    got = [m.sender for m in server.recv_each(range(4), lambda _: EXPECT)]
    assert got == [0, 1, 3, 2]
    assert server.ready_among(range(4)) == [1]  # its second message, not taken


def test_recv_in_turn_takes_a_senders_second_message_before_anothers_first():
    """Each sender's messages in its order, read as expects[i] says, the senders' in the
    order they come: silo 0's second message need not wait for silo 1's first."""
    hub = LocalHub()
    server = LocalChannel(SERVER, hub, 5, 0.02)
    silos = [LocalChannel(c, hub, 5, 0.02) for c in range(2)]
    silos[0].send(SERVER, PING, 4, GOOD, n_samples=1)
    silos[0].send(SERVER, PING, 4, GOOD, n_samples=2)
    threading.Timer(0.2, lambda: silos[1].send(SERVER, PING, 4, GOOD, n_samples=3)).start()
    threading.Timer(0.3, lambda: silos[1].send(SERVER, PING, 4, GOOD, n_samples=4)).start()
    expects = [lambda _: EXPECT, lambda _: EXPECT]
    got = [(step, m.sender, m.meta["n_samples"]) for step, m in server.recv_in_turn([0, 1], expects)]
    assert got == [(0, 0, 1), (1, 0, 2), (0, 1, 3), (1, 1, 4)]
    assert not server.ready_among(range(2))


def test_silos_talk_to_each_other_directly():
    hub = LocalHub()
    a, b = LocalChannel(0, hub, 5, 0.02), LocalChannel(1, hub, 5, 0.02)
    a.send(1, PING, 4, GOOD, n_samples=3)
    assert b.recv(0, EXPECT).meta["n_samples"] == 3 and not hub.waiting(0, SERVER)


@given(silos=st.integers(1, 200), data=st.data())
def test_rank_layout_blocks_cover_every_silo_once_in_order(silos, data):
    ranks = data.draw(st.integers(1, silos))
    layout = RankLayout(silos, ranks)
    blocks = [list(layout.silos_on(r)) for r in range(1, ranks + 1)]
    assert [c for b in blocks for c in b] == list(range(silos))
    assert max(map(len, blocks)) - min(map(len, blocks)) <= 1 and layout.slots == max(map(len, blocks))
    for r, block in enumerate(blocks, start=1):
        assert all(layout.rank_of(c) == r and layout.slot_of(c) == i for i, c in enumerate(block))
    assert layout.rank_of(SERVER) == 0 and layout.slot_of(SERVER) == 0 and not layout.silos_on(0)
    assert layout.world_size == ranks + 1


def test_rank_layout_names_parties_with_their_rank():
    layout = RankLayout(40, 8)
    assert layout.describe(SERVER) == "the server (rank 0)" and layout.describe(7) == "silo 7 (rank 2)"
    with pytest.raises(ValueError):
        RankLayout(4, 5)


@given(
    st.lists(
        st.tuples(st.sampled_from(["uint8", "int64", "float32", "float64"]), st.lists(st.integers(0, 4), max_size=3)),
        min_size=1,
        max_size=4,
    )
)
def test_a_small_message_from_another_rank_arrives_whole_and_writeable(specs):
    """An inline message (MPI: header and arrays in one buffer) gives back the arrays it was
    made of, whatever their dtypes' alignment, as arrays the receiver may write to."""
    arrays = {
        f"a{i}": np.arange(int(np.prod(shape)), dtype=dtype).reshape(shape) for i, (dtype, shape) in enumerate(specs)
    }
    hub, server, _ = pair()
    header = encode_header(PING, 4, 0, arrays, {})
    hub.deliver(0, SERVER, InlineFrame(bytearray(inline_buffer(header, list(arrays.values())).tobytes())))
    msg = server.recv(0, Expect.like(PING, 4, arrays))
    for name, a in arrays.items():
        assert msg.arrays[name].dtype == a.dtype and msg.arrays[name].flags.writeable
        np.testing.assert_array_equal(msg.arrays[name], a)


def test_an_inline_message_whose_bytes_do_not_fit_its_header_is_refused():
    hub, server, _ = pair()
    header = encode_header(PING, 4, 0, GOOD, {"n_samples": 10})
    short = inline_buffer(header, [GOOD["w"]])[:-4]
    hub.deliver(0, SERVER, InlineFrame(bytearray(short.tobytes())))
    with pytest.raises(
        ProtocolError,
        match="silo 0 sent a payload of test_ping .round 4. that does not fit its header: 20 bytes, header declared 24",
    ):
        server.recv(0, EXPECT)


def test_a_silo_may_send_leave_in_place_of_the_awaited_message_and_it_is_handed_over_not_yielded():
    from cfl_mpi.channel import Alternative
    from cfl_mpi.wire.round import Leave, Update

    hub = LocalHub()
    server = LocalChannel(SERVER, hub, 5.0, 0.02)
    silos = [LocalChannel(c, hub, 5.0, 0.02) for c in range(3)]
    model = {"w": np.ones((2, 2), np.float32)}
    silos[0].send(SERVER, Update(model, 10), 2)
    silos[1].send(SERVER, Leave("OutOfMemoryError: CUDA out of memory"), 2)
    silos[2].send(SERVER, Update(model, 30), 2)
    left: list = []
    instead = Alternative(Leave.KIND, lambda c: Leave.expect(2), left.append)
    got = [m.sender for m in server.recv_each([0, 1, 2], lambda c: Update.expect(2, like=model), instead)]
    assert sorted(got) == [0, 2]
    assert [(m.sender, Leave.of(m).why) for m in left] == [(1, "OutOfMemoryError: CUDA out of memory")]
    silos[1].send(SERVER, Leave("late"), 3)
    with pytest.raises(ProtocolError, match="unexpected message of kind 'leave'"):  # not where it is not allowed
        server.recv(1, Update.expect(3, like=model))


def test_a_silo_that_left_takes_what_was_on_its_way_as_declared():
    from cfl_mpi.wire.round import STOP, Control, StartModel

    hub, server, silo = pair()
    server.send(0, StartModel({"w": np.ones(3, np.float32)}, 1), 2)
    server.send(0, Control(STOP, 0, 0), 3)
    assert silo.next_kind(SERVER) == ("model", 2)
    taken = silo.take_as_declared(SERVER)
    assert taken.kind.name == "model" and taken.arrays["w"].tolist() == [1, 1, 1]
    assert silo.next_kind(SERVER) == ("control", 3)
    assert Control.of(silo.recv(SERVER, Control.expect(3))).action == STOP


def test_a_message_that_breaks_the_protocol_is_refused_and_its_sender_disowned_while_the_others_arrive():
    from cfl_mpi.wire.round import Update

    hub = LocalHub()
    server = LocalChannel(SERVER, hub, 5.0, 0.02)
    silos = [LocalChannel(c, hub, 5.0, 0.02) for c in range(3)]
    model = {"w": np.ones((2, 2), np.float32)}
    silos[0].send(SERVER, Update(model, 10), 2)
    silos[1].send(SERVER, Update({"w": np.ones(3, np.float32)}, 20), 2)  # not the model's shape
    silos[2].send(SERVER, Update(model, 30), 2)
    refused: list = []

    def refuse(silo: int, err: ProtocolError) -> None:
        refused.append((silo, str(err)))
        server.disown(silo)

    got = [m.sender for m in server.recv_each([0, 1, 2], lambda c: Update.expect(2, like=model), refused=refuse)]
    assert sorted(got) == [0, 2] and [s for s, _ in refused] == [1]
    assert "silo 1 sent a bad message (expected update of round 2)" in refused[0][1]
    late = silos[1].isend(SERVER, Update(model, 20), 3)  # disowned: dropped unread, its send done
    assert late.done() and server.ready([1]) is None
    with pytest.raises(ProtocolError):  # without `refused`, as before
        silos[0].send(SERVER, Update({"w": np.ones(3, np.float32)}, 10), 3)
        server.recv_each([0], lambda c: Update.expect(3, like=model)).__next__()


def test_a_silo_receiving_the_servers_farewell_in_place_of_any_message_is_ended_by_it():
    from cfl_mpi.channel import Notice
    from cfl_mpi.wire.round import Control, Dropped, StartModel

    hub, server, silo = pair()
    ended: list = []

    def end(msg):
        ended.append(Dropped.of(msg).why)
        raise EOFError

    silo.notices[Dropped.KIND.name] = Notice(Dropped.expect(0), end)
    server.send(0, Control("train", 0, 0), 2)
    assert Control.of(silo.recv(SERVER, Control.expect(2))).action == "train"  # the others arrive as ever
    server.send(0, Dropped("silo 0 sent a bad message"), 0)
    with pytest.raises(EOFError):
        silo.recv(SERVER, StartModel.expect(2, like={"w": np.ones(3, np.float32)}))
    assert ended == ["silo 0 sent a bad message"]
