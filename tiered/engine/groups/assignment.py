"""Which member owns which stream: sticky and balanced, with the fewest moves (pure).

Member quotas differ by at most one, the extra streams go to the members
that already own the most, each member keeps as many of its streams as its
quota allows, and only the excess moves: the fewest moves any balanced
assignment can have.
"""

from __future__ import annotations

from collections.abc import Sequence


def assign(
    members: Sequence[str],
    linked: Sequence[int],
    previous: dict[int, str | None],
    holders: dict[int, str | None],
) -> dict[int, str | None]:
    """Sticky balanced owners for ``linked`` streams among ``members`` (both sorted).

    Quotas differ by at most one; the larger ones go to the members that own
    the most already; members keep their streams up to their quota (actively
    held ones first) and only the excess moves, which is the fewest moves any
    balanced assignment can make. Freed streams go back to their current holder
    when it has room, so a drain in progress can be cancelled.
    """
    if not members:
        return {u: None for u in linked}
    current: dict[str, list[int]] = {m: [] for m in members}
    for u in linked:
        o = previous.get(u)
        if o is not None and o in current:
            current[o].append(u)
    base, extra = divmod(len(linked), len(members))
    order = sorted(members, key=lambda m: (-len(current[m]), m))
    quota = {m: base + (1 if i < extra else 0) for i, m in enumerate(order)}
    result: dict[int, str | None] = {}
    count = dict.fromkeys(members, 0)
    for m in members:
        mine = sorted(current[m], key=lambda u: (holders.get(u) != m, u))
        for u in mine[: quota[m]]:
            result[u] = m
        count[m] = min(len(mine), quota[m])
    free = [u for u in linked if u not in result]
    rest = []
    for u in free:
        h = holders.get(u)
        if h is not None and h in count and count[h] < quota[h]:
            result[u] = h
            count[h] += 1
        else:
            rest.append(u)
    it = iter(rest)
    for m in members:
        while count[m] < quota[m]:
            result[next(it)] = m
            count[m] += 1
    return result
