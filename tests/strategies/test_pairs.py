import itertools

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cfl_mpi.strategies.emdcfl.pairs import MEASURE, SERVE, partner_roles, tournament_slot


def circle_method(silos: list[int]) -> list[list[tuple[int, int]]]:
    """The tournament written out slot by slot (the reference for the closed form): player 0
    stays, the others rotate one place per slot, position k plays position n − 1 − k."""
    players = list(silos) + ([None] if len(silos) % 2 else [])
    n, slots = len(players), []
    for _ in range(n - 1):
        pairs = [(players[i], players[n - 1 - i]) for i in range(n // 2)]
        slots.append([tuple(sorted(p)) for p in pairs if None not in p])
        players = [players[0], players[-1], *players[1:-1]]
    return slots


def reference_partner_roles(silos, directions):
    """partner_roles by walking circle_method's slots in order."""
    roles = {}
    for r, c in directions:
        roles[(r, c)] = roles.get((r, c), 0) | SERVE
        roles[(c, r)] = roles.get((c, r), 0) | MEASURE
    partners = {s: [] for s in silos}
    for slot in circle_method(sorted(silos)):
        for a, b in slot:
            if (a, b) in roles:
                partners[a].append((b, roles[(a, b)]))
                partners[b].append((a, roles[(b, a)]))
    return partners


@pytest.mark.parametrize("n", [1, 2, 3, 4, 7, 8, 40, 101])
def test_the_closed_form_slot_is_the_circle_methods(n):
    slots = circle_method(list(range(n)))
    assert sorted(p for slot in slots for p in slot) == list(itertools.combinations(range(n), 2))
    for s, slot in enumerate(slots):
        members = [x for p in slot for x in p]
        assert len(members) == len(set(members))
        for i, j in slot:
            assert tournament_slot(i, j, n + n % 2) == tournament_slot(j, i, n + n % 2) == s


@settings(max_examples=200, deadline=None)
@given(
    st.sets(st.integers(0, 60), min_size=1, max_size=25).flatmap(
        lambda silos: st.tuples(
            st.just(sorted(silos)),
            st.lists(
                st.tuples(st.sampled_from(sorted(silos)), st.sampled_from(sorted(silos))).filter(
                    lambda d: d[0] != d[1]
                ),
                max_size=40,
            ),
        )
    )
)
def test_partner_roles_match_the_tournament_walked_slot_by_slot(case):
    silos, directions = case
    assert partner_roles(silos, directions) == reference_partner_roles(silos, directions)


def test_partner_order_is_consistent_between_the_two_sides():
    wanted = [(0, 1), (2, 3), (0, 3), (1, 2)]
    partners = partner_roles([0, 1, 2, 3], [d for a, b in wanted for d in ((a, b), (b, a))])
    slot_of = {p: i for i, slot in enumerate(circle_method([0, 1, 2, 3])) for p in slot}
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


def test_a_partner_the_server_says_left_ends_the_wait_for_it_and_no_other():
    """A silo waiting for its partners' keys takes the server's `PartnerLeft` on the way: it
    stops waiting for that partner and still takes the others'; a notice naming a silo that is
    not its partner is the server's protocol error."""
    import threading

    from cfl_mpi.channel import SERVER, LocalChannel, LocalHub
    from cfl_mpi.strategies.emdcfl.messages import Handshake, PartnerLeft
    from cfl_mpi.strategies.emdcfl.silo import PartnerWaits
    from cfl_mpi.wire.messages import ProtocolError

    hub = LocalHub()
    server, silo = LocalChannel(SERVER, hub, 5.0, 0.01), LocalChannel(0, hub, 5.0, 0.01)
    partners = {p: LocalChannel(p, hub, 5.0, 0.01) for p in (1, 2, 3)}
    waits = PartnerWaits(silo, 4)
    waits.partners.update([1, 2, 3])
    partners[1].send(0, Handshake(np.ones(32, np.uint8)), 4)
    later = threading.Timer(
        0.2, lambda: (server.send(0, PartnerLeft(2), 4), partners[3].send(0, Handshake(np.full(32, 3, np.uint8)), 4))
    )
    later.start()
    got = [msg.sender for msg in waits.each([1, 2, 3], Handshake.expect(4))]
    later.join()
    assert sorted(got) == [1, 3] and waits.left == {2}
    server.send(0, PartnerLeft(7), 4)
    with pytest.raises(ProtocolError, match="said silo 7 left in round 4: not a partner of this silo"):
        silo.recv(SERVER, Handshake.expect(5))
