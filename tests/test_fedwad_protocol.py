"""FedWaD over MPI (cfl_mpi.ot.fedwad_protocol) in a real 3-rank job without torch: the
distributed jobs equal the local `fedwad()` bit for bit, and malformed messages on either
side are refused with the sender, the kind and the round named."""
import json

import pytest

from mpi_helpers import run_mpi

pytestmark = pytest.mark.mpi


@pytest.fixture(scope="module")
def report():
    proc = run_mpi(3, ["tests/mpi_scripts/fedwad_protocol.py"], timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("case", ["good_p1", "good_p2"])
def test_distributed_jobs_equal_local_fedwad(report, case):
    server, *silos = report[case]
    assert server["got"] == server["local"] and set(server["got"]) == {"0>1", "1>0"}
    # Only measures and scalars travel: the server sends ξ, the silos ξ_own and two distances.
    assert set(server["sent"]) == {"fedwad_measure"}
    assert all(set(s["sent"]) == {"fedwad_measure", "fedwad_distance"} for s in silos)


def test_bad_reply_names_the_silo_and_premature_done_is_refused(report):
    server, good_silo, _ = report["bad_reply"]
    assert "rank 2" in server["error"] and "fedwad_measure" in server["error"] and "round 7" in server["error"]
    assert "sum to 2.0" in server["error"]
    assert "rank 0" in good_silo["error"] and "before jobs" in good_silo["error"]


@pytest.mark.parametrize("case,words", [("unknown_job", "one of the jobs"), ("wrong_step", "step 2"),
                                        ("bad_time", "t 1.5")])
def test_bad_requests_are_refused_by_the_silo(report, case, words):
    error = report[case][1]["error"]
    assert "rank 0" in error and "fedwad_measure" in error and "round 7" in error and words in error, error
