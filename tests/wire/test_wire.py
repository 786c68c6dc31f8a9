"""The MPI channel under a real 2-rank job: malformed messages are rejected with the sender,
kind and round named; waiting does not burn CPU; a silent peer times out; silos sharing a
rank reach each other and the server; a message to several parties travels once per rank.
(The same checks in-process: test_channel.py.)"""

import json

import numpy as np
import pytest
from jobs import run_mpi

from cfl_mpi.channel import SERVER
from cfl_mpi.wire.messages import encode_header, message_kind

pytestmark = pytest.mark.mpi


@pytest.fixture(scope="module")
def report():
    proc = run_mpi(2, ["tests/mpi_scripts/wire_faults.py"], timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_good_message_arrives_intact(report):
    assert report["good"] == {"ok": True, "sum": 6.0}


@pytest.mark.parametrize(
    "case,words",
    [
        ("wrong_kind", "kind 'test_eval'"),
        ("wrong_round", "for round 3"),
        ("wrong_shape", "shape (3, 2)"),
        ("wrong_dtype", "dtype float64"),
        ("non_finite", "non-finite"),
        ("missing_meta", "meta 'n_samples'"),
        ("oversized_payload", "does not fit its header"),
        ("short_payload", "header declared 24"),
        ("garbage_header", "not JSON"),
        ("header_without_payload", "whose payload did not follow within 2 s"),
        ("nan_meta", "non-finite number NaN"),
        ("forged_sender", "claims sender 5"),
        ("inline_short_payload", "16 bytes, header declared 24"),
        ("inline_long_payload", "28 bytes, header declared 24"),
        ("inline_header_overrun", "with a header of"),
    ],
)
def test_bad_messages_are_rejected_with_sender_kind_and_round(report, case, words):
    result = report[case]
    assert result["ok"] is False
    assert "silo 0 (rank 1)" in result["error"] and "test_update" in result["error"] and "round 4" in result["error"]
    assert words in result["error"], result["error"]


def test_a_withheld_payload_is_an_error_within_the_payload_timeout(report):
    assert report["header_without_payload"]["seconds"] < 2.0 + 3.0  # the payload timeout, not the message timeout


def test_waiting_rank_does_not_spin(report):
    wait = report["idle_wait"]
    assert wait["wall_s"] > 1.5
    assert wait["cpu_s"] < 0.1 * wait["wall_s"], wait  # a spinning wait would be ~1.0


def test_silent_peer_times_out(report):
    assert "waited" in report["timeout"]["error"] and "silo 0 (rank 1)" in report["timeout"]["error"]


def test_silos_sharing_a_rank_reach_each_other_and_the_server(report):
    shared = report["shared_rank"]
    assert shared["server_got"] == {"0": 0, "1": 1, "2": 2}
    assert shared["silos_heard"] == [[2, 0], [0, 1], [1, 2]]  # (left neighbour, server's echo) per silo


def test_a_message_to_several_silos_of_a_rank_arrives_once_shared_read_only(report):
    assert report["to_several"]["server_got"] == 30.0
    one = len(encode_header(message_kind("test_model"), 1, SERVER, {"w": np.zeros((2, 3), np.float32)}, {})) + 24
    assert report["to_several"]["server_bytes"] == one  # one rank: counted once
    # per silo: sum from the server, writeable, shares silo 0's copy, sum from silo 0
    assert report["to_several_silos"] == [[15, 0, 1, -1], [15, 0, 1, 30], [15, 0, 1, 30]]


def test_large_payloads_arrive_intact_directly_and_to_several(report):
    direct, shared, sent = report["large"]
    assert direct == shared == sent


def test_empty_arrays_arrive_from_their_header_directly_and_to_several(report):
    one = [[0, 1, 2], [0, 4], [1, 1], [0]]
    assert report["empty_arrays"] == [one, one, 6.0]


@pytest.mark.parametrize(
    "case,words",
    [
        ("envelope_bad_receiver", "receivers [3]"),
        ("envelope_repeated_receiver", "for 2 receivers"),
        ("envelope_short_payload", "does not fit its header"),
        ("envelope_wrong_kind", "kind 'test_eval'"),
        ("envelope_without_payload", "did not follow within 2 s"),
        ("payload_without_envelope", "without an envelope"),
    ],
)
def test_bad_messages_to_several_parties_end_the_wait_naming_the_sender(report, case, words):
    result = report[case]
    assert result["ok"] is False and "silo 0 (rank 1)" in result["error"], result
    assert words in result["error"], result["error"]


def test_placement_counts_silos_per_node_when_ranks_span_two_nodes():
    """Two emulated nodes of 3 ranks: the server on node 0 is not a silo; each node numbers
    its own silos from 0 (their device index) and shares its cores among them."""
    import os

    from cfl_mpi.backends.mpi.placement import NODE_GROUPS_ENV
    from cfl_mpi.runtime.placement import usable_cores

    os.environ[NODE_GROUPS_ENV] = "2"
    try:
        proc = run_mpi(6, ["-m", "cfl_mpi.backends.mpi.placement"], timeout=120)
    finally:
        del os.environ[NODE_GROUPS_ENV]
    assert proc.returncode == 0, proc.stderr[-3000:]
    ranks = json.loads(proc.stdout.strip().splitlines()[-1])
    assert [(r["node_rank"], r["local_rank"], r["node_silos"]) for r in ranks] == [
        (0, -1, 2),
        (1, 0, 2),
        (2, 1, 2),
        (0, 0, 3),
        (1, 1, 3),
        (2, 2, 3),
    ]
    cores = usable_cores()
    assert [r["threads"] for r in ranks] == [1, *[max(1, cores // 2)] * 2, *[max(1, cores // 3)] * 3]
