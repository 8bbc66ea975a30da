"""Object-store durability, the pure part: where every byte of a shard's local files lives in WAL objects.

A shard's engine keeps its journal and hot data in append-only segment
files (``hot/``) and its snapshots in immutable files (``snapshots/``). In
object-store durability the owner ships what those files gained since the
last ship as one create-only WAL object, and a ``commit`` entry in the
shard's manifest chain records where each piece went (``WalCommit``). Every
so often (and whenever files were deleted) a ``Checkpoint`` entry records the
whole index, so a new owner reads the chain only back to the latest
checkpoint, and WAL objects no piece refers to any more (their segments were
flushed to the cold tier and deleted) can be released.

A piece writes ``length`` bytes at ``at`` in a file and cuts the file there:
pieces always reach the end of the file as it was when shipped, and a
recovery that cut a torn tail ships a shorter piece (possibly empty) that
cuts what followed.
"""

from __future__ import annotations

from typing import Literal

import msgspec

from tiered.core.errors import ErrorCode, TieredError

__all__ = [
    "Checkpoint",
    "Piece",
    "WalCommit",
    "WalIndex",
    "decode_payload",
    "encode_payload",
    "wal_epoch",
    "wal_key",
]

WAL_ROOT = "_tiered/cluster/wal/"


class Piece(msgspec.Struct, frozen=True, array_like=True):
    file: str  # "hot/<segment>.seg" or "snapshots/<name>"
    at: int  # offset in the file
    length: int
    wal: str  # the WAL object's key
    wal_at: int  # offset in the WAL object


class WalCommit(msgspec.Struct, frozen=True, tag="wal"):
    pieces: list[Piece]
    deleted: list[str] = []


class Checkpoint(msgspec.Struct, frozen=True, tag="checkpoint"):
    files: dict[str, list[Piece]]
    # WAL objects released and not yet known deleted: key -> ms on the releasing owner's clock
    # (``tiered/cluster/shards/wal_lifecycle.py``). Recorded here before any delete, so the latest checkpoint says what is pending.
    released: dict[str, int] = {}


Payload = WalCommit | Checkpoint
_decoder = msgspec.json.Decoder(Payload)


def encode_payload(payload: Payload) -> bytes:
    return msgspec.json.encode(payload)


def decode_payload(data: bytes, shard: int) -> Payload:
    try:
        return _decoder.decode(data)
    except (msgspec.DecodeError, msgspec.ValidationError) as exc:
        raise TieredError(
            ErrorCode.DATA_DAMAGED, f"a WAL entry of shard {shard} is unreadable: {exc}", shard=shard
        ) from None


def wal_prefix(shard: int) -> str:
    return f"{WAL_ROOT}{shard:04d}/"


def wal_key(shard: int, epoch: int, number: int, token: str) -> str:
    """Create-only, one per ship; the epoch in the name lets an owner release only its own and older ones.

    ``token`` is random per shipper, so a shard served again at the same epoch
    (a lost lease write adopted) never reuses a name.
    """
    return f"{wal_prefix(shard)}{epoch:010d}-{token}-{number:012d}"


def wal_epoch(key: str) -> int | None:
    head = key.rsplit("/", 1)[-1].split("-", 1)[0]
    return int(head) if len(head) == 10 and head.isdigit() else None


class WalIndex:
    """Every live file as the list of pieces that make it, in file order."""

    def __init__(self, files: dict[str, list[Piece]] | None = None) -> None:
        self.files: dict[str, list[Piece]] = {k: list(v) for k, v in (files or {}).items()}
        # What the latest checkpoint applied carried for the GC (``tiered/cluster/shards/wal_lifecycle.py``): its pending
        # releases, and its chain position once known (``restore`` sets it).
        self.released: dict[str, int] = {}
        self.checkpoint_seq: int | None = None

    def size(self, name: str) -> int:
        pieces = self.files.get(name)
        if not pieces:
            return 0
        last = pieces[-1]
        return last.at + last.length

    def apply(self, payload: Payload) -> None:
        if isinstance(payload, Checkpoint):
            self.files = {k: list(v) for k, v in payload.files.items()}
            self.released = dict(payload.released)
            return
        for piece in payload.pieces:
            self.add(piece)
        for name in payload.deleted:
            self.files.pop(name, None)

    def add(self, piece: Piece) -> None:
        kept: list[Piece] = []
        for p in self.files.get(piece.file, []):
            if p.at + p.length <= piece.at:
                kept.append(p)
            elif p.at < piece.at:  # straddles the cut: keep its head
                kept.append(Piece(p.file, p.at, piece.at - p.at, p.wal, p.wal_at))
        if piece.length or not kept or kept[-1].at + kept[-1].length != piece.at:
            kept.append(piece)
        self.files[piece.file] = kept

    def referenced(self) -> set[str]:
        """The WAL objects some live byte is in."""
        return {p.wal for pieces in self.files.values() for p in pieces if p.length}

    def checkpoint(self, released: dict[str, int] | None = None) -> Checkpoint:
        return Checkpoint(
            {k: list(v) for k, v in sorted(self.files.items())}, dict(sorted((released or {}).items()))
        )


def replay_from(entries: list[tuple[Literal["fence", "commit"], bytes]], shard: int) -> WalIndex:
    """The index after a chain's entries (oldest first), starting at the latest checkpoint among them."""
    index = WalIndex()
    for kind, data in entries:
        if kind == "commit" and data:
            index.apply(decode_payload(data, shard))
    return index
