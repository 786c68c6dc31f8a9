"""Which pairs of silos talk when: a round-robin tournament (circle method).

A plan lists each silo's partners in slot order (in slot s every silo has at most one
partner). All pairs of a clustering round proceed concurrently: a silo posts its key and ω
to every partner before its first receive, so no two silos wait on each other in a cycle,
and takes its partners' ω in the order they arrive (silo.OmegaSwaps).

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


def tournament_slot(i: int, j: int, n: int) -> int:
    """The slot in which players i ≠ j (indices 0..n−1, n even: pad an odd field with a bye)
    meet in the circle method: player 0 stays put while the others rotate one place per slot
    through positions 1..n−1, and slot s pairs position k with position n−1−k. Player j ≥ 1
    sits at position 1 + (j − 1 + s) mod (n − 1) in slot s, so 0 meets j when that is n − 1,
    and i, j ≥ 1 meet when their positions sum to n − 1: i + j + 2s ≡ 0 (mod n − 1), solvable
    as n − 1 is odd. In closed form, so that planning a stage costs its pairs, not the C²/2
    pairs of the whole tournament, for every plan sent (docs/research/PERFORMANCE.md, "Tournament slot")."""
    m = n - 1
    if i == 0 or j == 0:
        return -(i + j) % m
    return -(i + j) * ((m + 1) // 2) % m  # (m + 1) / 2 is the inverse of 2 mod m


def partner_roles(silos: list[int], directions: Iterable[Pair]) -> dict[int, list[tuple[int, int]]]:
    """Each silo's (partner, role) for the pairs of the wanted `directions` (r, c), in the
    order of the slots of a round-robin tournament of `silos` (sorted): SERVE for r, MEASURE
    for c, both where both directions are wanted."""
    roles: dict[Pair, int] = {}
    for r, c in directions:
        roles[(r, c)] = roles.get((r, c), 0) | SERVE
        roles[(c, r)] = roles.get((c, r), 0) | MEASURE
    index = {s: k for k, s in enumerate(sorted(silos))}
    n = len(silos) + len(silos) % 2  # players, with a bye for an odd field
    slotted: dict[int, list[tuple[int, int, int]]] = {s: [] for s in silos}
    for (a, b), role in roles.items():
        slotted[a].append((tournament_slot(index[a], index[b], n), b, role))
    return {s: [(b, role) for _, b, role in sorted(mine)] for s, mine in slotted.items()}
