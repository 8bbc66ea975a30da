"""A plain-value view of a StreamState, for tests that compare states (replay, snapshots)."""

from __future__ import annotations

from typing import Any

from tiered.state import StreamState


def fingerprint(state: StreamState) -> dict[str, Any]:
    """Everything the state means, as plain values (touch_journaled_ms excluded)."""
    paths = dict(state.paths)
    return {
        "next_uid": state.next_uid,
        "buckets": dict(state.buckets),
        "hot_bytes": state.hot_bytes,
        "paths": paths,
        "streams": {
            uid: (
                s.bucket,
                s.path,
                s.content_type,
                s.ttl_s,
                s.expires_at,
                s.expires_at_ms,
                s.created_ms,
                s.fork_source,
                s.fork_offset,
                s.fork_spec,
                s.tail,
                s.closed,
                s.closed_by,
                {k: (p.epoch, p.last_seq) for k, p in s.producers.items()},
                s.stream_seq,
                (list(s.chunks.starts), list(s.chunks.lens), list(s.chunks.segs), list(s.chunks.poss)),
                s.forks,
                s.soft_deleted,
                s.last_access_ms,
            )
            for uid, s in state.streams.items()
        },
    }
