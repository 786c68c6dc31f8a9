import itertools

import pytest

from cfl_mpi.strategies.emdcfl.pairs import MEASURE, SERVE, partner_roles, tournament


@pytest.mark.parametrize("n", [1, 2, 3, 4, 7, 8, 40])
def test_tournament_covers_every_pair_once_in_disjoint_slots(n):
    slots = tournament(list(range(n)))
    pairs = [p for slot in slots for p in slot]
    assert sorted(pairs) == list(itertools.combinations(range(n), 2))
    for slot in slots:
        members = [s for p in slot for s in p]
        assert len(members) == len(set(members))


def test_partner_order_is_consistent_between_the_two_sides():
    wanted = [(0, 1), (2, 3), (0, 3), (1, 2)]
    partners = partner_roles([0, 1, 2, 3], [d for a, b in wanted for d in ((a, b), (b, a))])
    slot_of = {p: i for i, slot in enumerate(tournament([0, 1, 2, 3])) for p in slot}
    for silo, plist in partners.items():
        slots = [slot_of[tuple(sorted((silo, p)))] for p, _ in plist]
        assert slots == sorted(slots)
        assert all(role == SERVE | MEASURE for _, role in plist)
    assert sum(len(p) for p in partners.values()) == 2 * len(wanted)


def test_a_one_way_pair_gives_the_model_owner_serve_and_the_other_measure():
    """(r, c) is W[r][c]: r sends its ω and own cloud, c embeds its data under r's model."""
    partners = partner_roles([0, 1, 2], [(0, 1), (0, 2), (2, 0)])
    assert dict(partners[0]) == {1: SERVE, 2: SERVE | MEASURE}
    assert partners[1] == [(0, MEASURE)]
    assert partners[2] == [(0, SERVE | MEASURE)]
