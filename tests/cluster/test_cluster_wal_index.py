"""The WAL index: pieces, cuts, deletions, checkpoints, and the keys an owner may release."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tiered.cluster.shards.wal_index import (
    Checkpoint,
    Piece,
    WalCommit,
    WalIndex,
    decode_payload,
    encode_payload,
    wal_epoch,
    wal_key,
)
from tiered.core.errors import TieredError


def materialize(index: WalIndex, objects: dict[str, bytes]) -> dict[str, bytes]:
    out = {}
    for name, pieces in index.files.items():
        buf = bytearray()
        for p in pieces:
            del buf[p.at :]
            buf.extend(objects[p.wal][p.wal_at : p.wal_at + p.length])
        out[name] = bytes(buf[: index.size(name)])
    return out


def test_pieces_extend_cut_and_delete_files() -> None:
    objects = {"w1": b"abcdef", "w2": b"XY", "w3": b""}
    index = WalIndex()
    index.apply(WalCommit([Piece("hot/1", 0, 4, "w1", 0), Piece("snapshots/s", 0, 2, "w1", 4)]))
    assert materialize(index, objects) == {"hot/1": b"abcd", "snapshots/s": b"ef"}
    index.apply(WalCommit([Piece("hot/1", 2, 2, "w2", 0)]))  # a cut at 2, then new bytes
    assert materialize(index, objects)["hot/1"] == b"abXY"
    index.apply(WalCommit([Piece("hot/1", 3, 0, "w3", 0)]))  # recovery cut a torn tail
    assert index.size("hot/1") == 3 and materialize(index, objects)["hot/1"] == b"abX"
    index.apply(WalCommit([], deleted=["snapshots/s"]))
    assert set(index.files) == {"hot/1"}
    assert index.referenced() == {"w1", "w2"}


def test_a_checkpoint_replaces_the_index_and_round_trips() -> None:
    index = WalIndex()
    index.apply(WalCommit([Piece("hot/1", 0, 3, "w1", 0)]))
    ckpt = index.checkpoint()
    again = WalIndex()
    again.apply(WalCommit([Piece("hot/9", 0, 3, "w9", 0)]))
    decoded = decode_payload(encode_payload(ckpt), 0)
    assert isinstance(decoded, Checkpoint)
    again.apply(decoded)
    assert again.files == index.files
    with pytest.raises(TieredError):
        decode_payload(b'{"kind":"nope"}', 3)


def test_wal_keys_carry_their_epoch() -> None:
    key = wal_key(7, 12, 3, "ab12cd34")
    assert key.startswith("_tiered/cluster/wal/0007/") and wal_epoch(key) == 12
    assert wal_epoch("_tiered/cluster/wal/0007/junk") is None


@given(st.lists(st.tuples(st.integers(0, 40), st.binary(max_size=12)), max_size=30))
def test_the_index_reproduces_a_file_written_by_appends_and_cuts(ops: list[tuple[int, bytes]]) -> None:
    """Whatever sequence of 'cut at n, then append bytes' a file sees, the index rebuilds it exactly."""
    index, objects, truth = WalIndex(), {}, bytearray()
    for i, (cut, data) in enumerate(ops):
        at = min(cut, len(truth))
        del truth[at:]
        truth.extend(data)
        objects[f"w{i}"] = data
        index.apply(WalCommit([Piece("hot/1", at, len(data), f"w{i}", 0)]))
    if ops:
        assert materialize(index, objects)["hot/1"] == bytes(truth)
