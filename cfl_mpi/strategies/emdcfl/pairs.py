"""Which pairs of silos talk when: a round-robin tournament (circle method).

All pairs of a clustering round proceed concurrently: in slot s every silo has at most one
partner, and each silo works through its partners in slot order, so no two silos ever wait
on each other in a cycle.

A pair is measured in one direction or both. The direction (r, c) is W[r][c], silo c's data
and r's own under r's model: r *serves* (sends c its ω and the server its own cloud), c
*measures* (embeds its data under ω and sends the server that cloud).
"""
from __future__ import annotations

from collections.abc import Iterable

SERVE, MEASURE = 1, 2  # a silo's role towards a partner, as bits: both ways is SERVE | MEASURE
Pair = tuple[int, int]  # a direction (r, c): W[r][c], measured under r's model


def both_ways(pairs: list[Pair]) -> list[Pair]:
    """Each unordered pair (a, b) as its two directions."""
    return [d for a, b in pairs for d in ((a, b), (b, a))]


def tournament(silos: list[int]) -> list[list[tuple[int, int]]]:
    """Slots of disjoint pairs covering every pair of `silos` once (n−1 slots, n if odd)."""
    players: list[int | None] = list(silos) + ([None] if len(silos) % 2 else [])
    n = len(players)
    slots = []
    for _ in range(n - 1):
        pairs = [(players[i], players[n - 1 - i]) for i in range(n // 2)]
        slots.append([tuple(sorted(p)) for p in pairs if None not in p])
        players = [players[0], players[-1], *players[1:-1]]  # rotate all but the first
    return slots


def partner_roles(silos: list[int], directions: Iterable[Pair]) -> dict[int, list[tuple[int, int]]]:
    """Each silo's (partner, role) for the pairs of the wanted `directions` (r, c), in
    tournament-slot order: SERVE for r, MEASURE for c, both where both directions are wanted."""
    roles: dict[Pair, int] = {}
    for r, c in directions:
        roles[(r, c)] = roles.get((r, c), 0) | SERVE
        roles[(c, r)] = roles.get((c, r), 0) | MEASURE
    partners: dict[int, list[tuple[int, int]]] = {s: [] for s in silos}
    for slot in tournament(sorted(silos)):
        for a, b in slot:
            if (a, b) in roles:
                partners[a].append((b, roles[(a, b)]))
                partners[b].append((a, roles[(b, a)]))
    return partners
