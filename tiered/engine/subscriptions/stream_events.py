"""What stream records mean to subscriptions: follow-up records for the same journal batch.

Stream events reach ``on_stream_event`` from the committer, right after a
stream record is applied (``service.StreamEvents``): a new stream matching a
pattern is linked before its first byte, an append wakes idle subscriptions
linking it, a deleted stream is unlinked, and retention moves the links it
passed (``skips``). In cluster mode the same follow-ups come from other
shards' reports (``on_remote_stream``).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from tiered.core.ids import DEFAULT_BUCKET
from tiered.engine.streams.model import Stream
from tiered.engine.streams.records import (
    Appended,
    RetentionAdvanced,
    StreamCreated,
    StreamDeleted,
    StreamExpired,
)
from tiered.engine.streams.state import StreamState
from tiered.engine.subscriptions.model import BEFORE_FIRST, is_reserved
from tiered.engine.subscriptions.records import LinkSpec, StreamGone, StreamsLinked, SubscriptionRecord
from tiered.engine.subscriptions.skips import skips_on
from tiered.engine.subscriptions.streams_view import StateStreams, StreamsView
from tiered.engine.subscriptions.wakes import wake_idle

if TYPE_CHECKING:
    from tiered.engine.subscriptions.state import SubscriptionState

log = logging.getLogger(__name__)


def on_stream_event(
    state: SubscriptionState, record: Any, before: Stream | None, streams: StreamState
) -> list[SubscriptionRecord]:
    """Records that follow a stream record the service just applied (see ``StreamService._commit``).

    ``before`` is the stream the record touched, as it was before (None for a
    creation). A stream created under a pattern is linked before its first
    byte (offset -1); an append wakes idle subscriptions linking it; a
    deleted stream is unlinked. Errors are logged, never raised: the stream
    record is already journaled and must still succeed.
    """
    if not state.subs:
        return []
    follow = _FOLLOW.get(type(record))
    if follow is None:
        return []
    try:
        return follow(state, record, before, streams)
    except Exception:
        log.exception("subscriptions: handling %s failed", type(record).__name__)
    return []


def _appended(
    state: SubscriptionState, record: Appended, before: Stream | None, streams: StreamState
) -> list[SubscriptionRecord]:
    if not record.data or before is None or before.bucket != DEFAULT_BUCKET:
        return []
    ids = state.by_path.get(before.path)
    if not ids:
        return []
    view = StateStreams(streams, record.ts_ms)
    return wake_idle(state, sorted(ids), view, record.ts_ms, before.path, {})


def _created(
    state: SubscriptionState, record: StreamCreated, _: Stream | None, streams: StreamState
) -> list[SubscriptionRecord]:
    if record.bucket != DEFAULT_BUCKET or is_reserved(record.path):
        return []
    return on_created(state, record.path, StateStreams(streams, record.ts_ms), record.ts_ms)


def _gone(
    state: SubscriptionState, record: StreamDeleted | StreamExpired, before: Stream | None, _: StreamState
) -> list[SubscriptionRecord]:
    if before is None or before.bucket != DEFAULT_BUCKET or before.path not in state.by_path:
        return []
    return [StreamGone(before.path, record.ts_ms)]


def _retained(
    state: SubscriptionState, record: RetentionAdvanced, _: Stream | None, streams: StreamState
) -> list[SubscriptionRecord]:
    paths = set()
    for uid, _offset in record.advances:
        s = streams.streams.get(uid)
        if s is not None and s.bucket == DEFAULT_BUCKET and s.path in state.by_path:
            paths.add(s.path)
    return skips_on(state, paths, StateStreams(streams, record.ts_ms), record.ts_ms)


# The stream records subscriptions follow, and how.
_FOLLOW: dict[
    type, Callable[[SubscriptionState, Any, Stream | None, StreamState], list[SubscriptionRecord]]
] = {
    Appended: _appended,
    StreamCreated: _created,
    StreamDeleted: _gone,
    StreamExpired: _gone,
    RetentionAdvanced: _retained,
}


def on_remote_stream(
    state: SubscriptionState, kind: str, path: str, streams: StreamsView, now_ms: int
) -> list[SubscriptionRecord]:
    """``on_stream_event`` for a stream this state's engine does not hold (cluster mode: another shard's).

    ``kind`` is what the stream's shard reported: ``created``, ``appended``
    (its tail moved) or ``gone``; ``streams`` already shows the stream as
    reported. The same follow-ups as for a local stream: linked under a
    pattern, idle subscriptions woken, unlinked when gone.
    """
    if not state.subs or is_reserved(path):
        return []
    if kind == "gone":
        return [StreamGone(path, now_ms)] if path in state.by_path else []
    if kind == "created":
        return on_created(state, path, streams, now_ms)
    if kind == "retained":
        return skips_on(state, {path}, streams, now_ms)
    ids = state.by_path.get(path)
    return wake_idle(state, sorted(ids), streams, now_ms, path, {}) if ids else []


def on_created(
    state: SubscriptionState, path: str, streams: StreamsView, now_ms: int
) -> list[SubscriptionRecord]:
    """A stream created at ``path``: glob links for the patterns selecting it, then wakes."""
    records: list[SubscriptionRecord] = []
    ids = set(state.by_path.get(path, ()))
    new_links: dict[str, dict[str, int]] = {}
    for sub in state.subs.values():
        if not sub.matches(path):
            continue
        ids.add(sub.id)
        link = sub.links.get(path)
        if link is None or not link.glob:
            records.append(StreamsLinked(sub.id, now_ms, (LinkSpec(path, "glob", BEFORE_FIRST),)))
            if link is None:
                new_links[sub.id] = {path: BEFORE_FIRST}
    records.extend(wake_idle(state, sorted(ids), streams, now_ms, path, new_links))
    return records
