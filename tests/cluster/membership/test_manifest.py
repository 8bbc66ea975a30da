"""Manifest chains: the fence above the chain, settling lost answers and racing writers, what a valid chain is."""

from __future__ import annotations

import msgspec
import pytest

from tiered.cluster.membership.manifest import (
    EntryKind,
    ManifestEntry,
    ManifestWriter,
    WriteResult,
    check_chain,
    decode_entry,
    encode_entry,
)
from tiered.core.errors import ErrorCode, TieredError


def _entry(
    seq: int, epoch: int, kind: EntryKind = EntryKind.COMMIT, writer: str = "n1", nonce: str = ""
) -> ManifestEntry:
    return ManifestEntry(0, seq, epoch, kind, writer, 1, nonce or f"{seq}-{epoch}")


def test_the_fence_goes_above_the_chain_and_stops_older_writers() -> None:
    new = ManifestWriter(0, epoch=3, writer="n2", incarnation=1)
    with pytest.raises(TieredError) as err:
        new.plan_commit(b"x", "c")
    assert err.value.code is ErrorCode.SHARD_NOT_OWNED  # nothing before the fence
    fence = new.plan_fence(_entry(7, 2, writer="n1"), "f")
    assert fence is not None and (fence.seq, fence.epoch, fence.kind) == (8, 3, EntryKind.FENCE)
    assert new.plan_fence(None, "other") is fence  # pending: the same entry, same bytes, again
    new.written(fence)
    assert new.fenced and new.next_seq == 9

    # The old writer's next position is taken by the fence: it must stop at once.
    old = ManifestWriter(0, epoch=2, writer="n1", incarnation=1, fence_seq=1, next_seq=8)
    mine = old.plan_commit(b"late", "o")
    assert mine.seq == 8
    with pytest.raises(TieredError) as err:
        old.conflict(mine, fence)
    assert err.value.code is ErrorCode.SHARD_FENCED
    assert err.value.context["epoch"] == 3 and err.value.context["owner"] == "n2"
    assert err.value.context["retry_after_s"] == 1

    # A writer finding a higher epoch at the top of the chain never fences.
    with pytest.raises(TieredError) as err:
        ManifestWriter(0, 2, "n1", 1).plan_fence(_entry(9, 3, EntryKind.FENCE, "n2"), "f")
    assert err.value.code is ErrorCode.SHARD_FENCED


def test_fence_settling_own_lost_answers_and_older_writers_racing() -> None:
    writer = ManifestWriter(0, epoch=4, writer="n1", incarnation=1)
    fence = writer.plan_fence(_entry(5, 3, writer="n0"), "f")
    assert fence is not None
    # An older owner's entry took position 6 after we listed: fence again above it.
    assert writer.conflict(fence, _entry(6, 3, writer="n0")) is WriteResult.RETRY
    assert writer.pending is None and not writer.fenced
    fence = writer.plan_fence(_entry(6, 3, writer="n0"), "g")
    assert fence is not None and fence.seq == 7
    # Its answer was lost and it is there: it is ours (by nonce).
    assert writer.conflict(fence, fence) is WriteResult.WRITTEN and writer.fence_seq == 7
    # Our own fence found at the top on a re-plan: nothing to write.
    again = ManifestWriter(0, epoch=4, writer="n1", incarnation=1)
    assert again.plan_fence(fence, "h") is None and again.fenced and again.next_seq == 8
    # Someone else at our epoch: refused, never written over.
    with pytest.raises(TieredError) as err:
        ManifestWriter(0, 4, "n9", 1).plan_fence(fence, "i")
    assert err.value.code is ErrorCode.SHARD_FENCED
    # Outcome unknown and absent: the same entry stays pending for the next commit.
    commit = again.plan_commit(b"p", "j")
    again.vanished(commit)
    assert again.plan_commit(b"q", "k") is commit
    # After the fence, an older epoch at our position is impossible: stop.
    with pytest.raises(TieredError):
        again.conflict(commit, _entry(8, 3, writer="n0"))


def test_check_chain_states_what_every_valid_chain_looks_like() -> None:
    good = [
        _entry(1, 1, EntryKind.FENCE, "n1"),
        _entry(2, 1, writer="n1"),
        _entry(3, 3, EntryKind.FENCE, "n2"),
        _entry(4, 3, writer="n2"),
    ]
    summary = check_chain(good)
    assert (summary.latest_seq, summary.latest_epoch, summary.fences) == (4, 3, {1: 1, 3: 3})
    assert check_chain([]).latest_seq == 0
    assert check_chain([_entry(10, 2, writer="n1")]).latest_epoch == 2  # compacted below: starts anywhere
    bad = {
        "gap": [good[0], good[2]],
        "epoch down": [good[2], _entry(4, 1, writer="n2")],
        "commit opens an epoch": [good[0], _entry(2, 2, writer="n2")],
        "second fence": [good[0], _entry(2, 1, EntryKind.FENCE, "n1")],
        "two writers": [good[0], _entry(2, 1, writer="n2")],
        "first entry not a fence": [_entry(1, 1, writer="n1")],
    }
    for name, entries in bad.items():
        with pytest.raises(TieredError) as err:
            check_chain(entries)
        assert err.value.code is ErrorCode.DATA_DAMAGED, name
    entry = _entry(3, 2, EntryKind.FENCE)
    assert decode_entry(encode_entry(entry), 0, 3) == entry
    for data, seq in ((b"nope", 3), (encode_entry(entry), 4), (msgspec.json.encode({"x": 1}), 3)):
        with pytest.raises(TieredError) as err:
            decode_entry(data, 0, seq)
        assert err.value.code is ErrorCode.DATA_DAMAGED
