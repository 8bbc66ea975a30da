"""Retention past a link's acked offset: the link moves on, and the range it lost is reported.

A link whose acked offset retention passed would send its worker to
released data. Its acked offset moves to the stream's retained offset with a
``LinksSkipped`` record naming the range (for a link that acked nothing yet,
from the stream's first byte; a fork's inherited bytes, readable from its
retained offset, are no loss): right after a retention record
(``stream_events``), and before every wake, claim, delivery and ack looks at
the links. The range stays on the link (``skipped``, shown in wake bodies,
claims and GET) until an ack reaches its end; an ack inside it (work done
before retention moved the cursor) is no error and changes nothing.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

from tiered.engine.subscriptions.model import Subscription
from tiered.engine.subscriptions.records import LinkSkip, LinksSkipped, SubscriptionRecord
from tiered.engine.subscriptions.streams_view import StreamsView

if TYPE_CHECKING:
    from tiered.engine.subscriptions.state import SubscriptionState


def moved_to(records: list[SubscriptionRecord]) -> dict[str, int]:
    """The acked offsets ``LinksSkipped`` records move links to."""
    return {sk.path: sk.end for r in records if isinstance(r, LinksSkipped) for sk in r.skips}


def skips(
    sub: Subscription, streams: StreamsView, now_ms: int, acks: dict[str, int] | None = None
) -> list[SubscriptionRecord]:
    """``[LinksSkipped]`` moving every link retention passed (once ``acks`` applied), or ``[]``."""
    found = []
    for path in sorted(sub.links):
        link = sub.links[path]
        acked = max(link.acked, (acks or {}).get(path, link.acked))
        got = streams.retained(path)
        if got is None:
            continue
        first, retained = got
        position = acked if acked >= 0 else first
        if position < retained:
            found.append(LinkSkip(path, acked, position, retained))
    return [LinksSkipped(sub.id, now_ms, tuple(found))] if found else []


def skips_on(
    state: SubscriptionState, paths: Iterable[str], streams: StreamsView, now_ms: int
) -> list[SubscriptionRecord]:
    """Links of ``paths`` whose acked offset retention passed, moved (right after retention advanced)."""
    ids = sorted({sub_id for path in paths for sub_id in state.by_path.get(path, ())})
    return decide_skips(state, ids, streams, now_ms)


def decide_skips(
    state: SubscriptionState, sub_ids: Iterable[str], streams: StreamsView, now_ms: int
) -> list[SubscriptionRecord]:
    """Every link of these subscriptions whose acked offset retention passed, moved (before a delivery)."""
    records: list[SubscriptionRecord] = []
    for sub_id in sorted(set(sub_ids)):
        sub = state.subs.get(sub_id)
        if sub is not None:
            records += skips(sub, streams, now_ms)
    return records


def apply_skipped(state: SubscriptionState, sub: Subscription, record: LinksSkipped) -> None:
    for sk in record.skips:
        link = sub.links.get(sk.path)
        if link is None or link.acked != sk.acked or sk.end <= sk.start:
            continue  # stale: acked (or skipped) since, or a replay
        link.acked = sk.end
        gap = link.skipped
        # Skips with no ack reaching past them between are one range.
        link.skipped = (gap[0] if gap is not None and gap[1] == sk.start else sk.start, sk.end)
