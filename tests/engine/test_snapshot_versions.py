"""Snapshots written by earlier versions still load: files a version-4 server wrote, read now.

``data/snapshot-v4.bin`` was written by the server as of e092d99 (snapshot
version 4, with the subscriptions' and groups' version-1 snapshots inside)
from the state ``history()`` builds; ``history()`` uses only calls that exist
in both versions, so the file can be written again from that tree
(``python -m tests.engine.test_snapshot_versions OUT`` there). Reading it
now must give exactly the state the same history builds now, and the state
must go on to behave the same (a snapshot round trip in the current format
changes nothing).
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

DATA = Path(__file__).parent / "data"
T0 = 1_700_000_000_000
B = "default"


def history() -> Any:
    """A state touching every kind of snapshotted data: streams, forks, producers, a deleted and an
    expired path, a cold object, retention, subscriptions (links, a claimed wake, a skip) and a group
    (members, a plan, commits), with signing keys."""
    from tiered.cold.parquet.chunk_index import ChunkIndex, ChunkRange, RowGroupSpan, StreamIndex
    from tiered.engine.engine import new_state
    from tiered.engine.groups.state import CommitRequest, GroupSpec
    from tiered.engine.streams.model import AppendRequest, CreateRequest, ForkRequest
    from tiered.engine.streams.records import ColdCopyCommitted, ColdCopyStarted, CopyRange
    from tiered.engine.subscriptions.config import SubscriptionConfig
    from tiered.engine.subscriptions.records import SigningKeyAdded
    from tiered.engine.subscriptions.state import StateStreams

    state = new_state()
    subs, groups = state.extensions["subscriptions"], state.extensions["groups"]
    position = [1, 0]

    def commit(records: Any) -> None:
        """Apply records as the service commits them: with their data's location, then the follow-ups."""
        for r in records if isinstance(records, list) else [records]:
            before = state.streams.get(getattr(r, "uid", -1))
            data = getattr(r, "data", b"")
            location = None
            if data:
                position[1] += 100 + len(data)
                location = (position[0], position[1])
            state.apply(r, location)
            commit(subs.on_stream_event(r, before, state))

    def create(path: str, data: bytes, now: int, **kw: Any) -> None:
        records, _ = state.decide_create(
            B, path, CreateRequest(kw.pop("ct", None), None, None, None, False, data, **kw), now
        )
        commit(records)

    def append(path: str, data: bytes, now: int, producer: tuple[str, int, int] | None = None) -> None:
        pid, epoch, seq = producer or (None, 0, 0)
        commit(state.decide_append(B, path, AppendRequest(None, data, False, pid, epoch, seq), now))

    commit(subs.decide_add_key(SigningKeyAdded("ds_k1", b"p" * 32, b"s" * 32, b"t" * 32, T0)))
    cfg = SubscriptionConfig("pull-wake", "events/*", ("manual/x",), None, "wake/pool", 30_000, "compat")
    create("wake/pool", b"", T0)
    create("events/a", b"abc", T0 + 1)
    records, _ = subs.decide_create("p1", cfg, "http://h", StateStreams(state, T0 + 2), T0 + 2)
    commit(records)
    for now in range(3):
        create("events/b", b"x" * (now + 1), T0 + 10 + now)
        commit(state.decide_delete(B, "events/b", T0 + 20 + now))  # path history: three incarnations
    create("events/b", b"fresh", T0 + 30)
    append("events/a", b"defg", T0 + 31, ("prod-1", 2, 0))
    append("events/a", b"hij", T0 + 32, ("prod-1", 2, 1))
    append("events/a", b"klm", T0 + 33, ("prod-2", 0, 0))
    create("events/c", b"", T0 + 34, fork=ForkRequest(state.find(B, "events/a").uid, 7, "events/a@7"))
    append("events/c", b"forked", T0 + 35)
    records, _ = state.decide_create(B, "ttl/s", CreateRequest(None, 60, None, None, False, b"ttl"), T0 + 36)
    commit(records)
    a = state.find(B, "events/a")
    index = ChunkIndex(
        4096,
        100,
        (RowGroupSpan(0, 3996, 1, 7),),
        (StreamIndex(B, "events/a", (ChunkRange(0, 7, 0, 0, 1),), 0),),
    )
    commit(ColdCopyStarted("objects/0001.parquet", T0 + 40, (CopyRange(a.uid, 0, 7),)))
    commit(ColdCopyCommitted("objects/0001.parquet", T0 + 41, 4096, 1234, index, (CopyRange(a.uid, 0, 7),)))
    commit(ColdCopyStarted("objects/0002.parquet", T0 + 42, ()))  # a copy in flight
    commit(state.decide_retain(B, "events/a", 4, T0 + 43))
    streams = StateStreams(state, T0 + 44)
    commit(subs.decide_claim("p1", "worker-1", streams, T0 + 44))
    commit(state.decide_retention_policy(B, None, 3_600_000, None, T0 + 45))
    spec = GroupSpec(bucket=B, pattern="events/*", session_timeout_ms=30_000)
    commit(groups.decide_create("g1", spec, state, T0 + 50))
    commit(groups.decide_join("g1", "m1", "j1", state, T0 + 51))
    commit(groups.decide_join("g1", "m2", "j2", state, T0 + 52))
    g = groups.get("g1")
    m1 = g.members["m1"]
    held = [t for t in g.targets.values() if t.holder == "m1"]
    commits = [CommitRequest(t.path, t.fence, 1) for t in held if state.streams[t.stream_uid].tail >= 1]
    records, _ = groups.decide_heartbeat(
        "g1", g.incarnation, "m1", m1.generation, commits, [], state, T0 + 53
    )
    commit(records)
    commit(state.decide_bucket("other", T0 + 60))
    return state


def test_a_version_4_snapshot_loads_as_the_state_it_holds() -> None:
    from tests.support.state_fingerprint import fingerprint
    from tiered.engine.engine import new_state
    from tiered.engine.snapshot import decode_snapshot, encode_snapshot
    from tiered.hot.log import LogPosition

    data = (DATA / "snapshot-v4.bin").read_bytes()
    assert int.from_bytes(data[4:8], "little") == 4
    restored, position = decode_snapshot(data, new_state)
    assert position == LogPosition(7, 4096)
    expected = history()
    # Record ordinals (issue 22) came after version 4: its streams have none, and the rest is whole.
    assert restored.extensions["records"].indexes == {}
    expected.extensions["records"].indexes.clear()
    expected.extensions["records"].parents.clear()
    # Integrity digests came later: streams of version-4 data have none (and are not checked by them).
    assert all(s.integrity is None for s in restored.streams.values())
    for s in expected.streams.values():
        s.integrity = None
    assert fingerprint(restored) == fingerprint(expected)
    assert restored.hot_bytes == expected.hot_bytes
    # Derived and soft state is rebuilt: producers' cost, object references, the touch throttle.
    a = restored.find(B, "events/a")
    assert a is not None and a.producer_bytes == expected.find(B, "events/a").producer_bytes > 0
    assert restored.cold_objects["objects/0001.parquet"].refs == 1
    assert all(s.touch_journaled_ms == s.last_access_ms for s in restored.streams.values())
    # The extensions' old formats came back whole, and the current format keeps them.
    for name in ("subscriptions", "groups"):
        assert restored.extensions[name].snapshot() == expected.extensions[name].snapshot(), name
    again, _ = decode_snapshot(encode_snapshot(restored, position), new_state)
    assert fingerprint(again) == fingerprint(expected)


if __name__ == "__main__":  # write the file from the tree this runs in (see the module docstring)
    from tiered.engine.journal.snapshot import encode_snapshot  # the version-4 tree's module
    from tiered.hot.log import LogPosition

    Path(sys.argv[1]).write_bytes(encode_snapshot(history(), LogPosition(7, 4096)))
