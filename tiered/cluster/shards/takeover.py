"""The operator's takeover of a local-durability shard from a dead node, and what it loses. Pure.

With local durability a shard's whole state (its journal: streams, offsets,
producers, and the references to its cold objects) lives on its last writer's
volume, so ``ShardHost.prepare`` refuses every other node. When that node is
gone for good, an operator grants the shard to another node
(``tiered cluster take-over``): a ``TakeoverGrant`` object naming the chain
position it was granted at. It holds only while the chain's latest entry is
still that one (the dead writer's); the new owner's fence moves the chain on
and the grant is spent.

What is lost is everything of the shard: the new owner starts it empty, its
cold objects become orphans of the shard's prefix (deleted by the GC after
the grace delay). ``loss_statement`` says exactly that, with the figures the
command could measure.
"""

from __future__ import annotations

from dataclasses import dataclass

import msgspec

from tiered.cluster.membership.manifest import ManifestEntry

__all__ = ["TakeoverGrant", "TakeoverFacts", "decode_grant", "encode_grant", "grant_allows", "loss_statement"]


class TakeoverGrant(msgspec.Struct, frozen=True, forbid_unknown_fields=False):
    shard: int
    from_writer: str  # the dead last writer
    at_seq: int  # the chain's latest position when granted
    at_epoch: int
    to: str  # the node allowed to take it; "" for any node but the dead one
    lost: str  # the statement the operator confirmed


def encode_grant(grant: TakeoverGrant) -> bytes:
    return msgspec.json.encode(grant)


def decode_grant(data: bytes) -> TakeoverGrant:
    return msgspec.json.decode(data, type=TakeoverGrant)


def grant_allows(grant: TakeoverGrant, latest: ManifestEntry | None, node_id: str) -> bool:
    """May ``node_id`` take the shard whose chain ends at ``latest``? Only from the granted position."""
    if latest is None or node_id == grant.from_writer:
        return False
    return (grant.shard, grant.from_writer, grant.at_seq, grant.at_epoch) == (
        latest.shard,
        latest.writer,
        latest.seq,
        latest.epoch,
    ) and grant.to in ("", node_id)


@dataclass(frozen=True, slots=True)
class TakeoverFacts:
    """What the command could see: the chain's tail, the store, and the dead node's volume if given."""

    shard: int
    latest: ManifestEntry
    cold_prefix: str
    cold_objects: int
    cold_bytes: int
    grace_s: float
    volume: str = ""  # the dead node's shard directory, "" when not given or not found
    hot_files: int = 0
    hot_bytes: int = 0
    other_bytes: int = 0  # journal and snapshots


def loss_statement(facts: TakeoverFacts) -> str:
    f, last = facts, facts.latest
    lines = [
        f"shard {f.shard}: last written by node {last.writer!r} (incarnation {last.incarnation}, "
        f"epoch {last.epoch}, manifest position {last.seq}).",
        "With local durability the shard's state (its journal: streams, offsets, producers, and the "
        f"references to its cold objects) exists only on node {last.writer!r}'s volume. The node that takes "
        "it over starts the shard EMPTY. LOST:",
        f"  - every stream of shard {f.shard}, with all its acknowledged bytes, in the hot and the cold tier;",
        f"  - the cold tier holds {f.cold_objects} object(s), {f.cold_bytes} bytes, under {f.cold_prefix}: "
        f"the new owner does not read them back; they become orphans and the GC deletes them after the "
        f"grace delay ({f.grace_s:g} s).",
    ]
    if f.volume:
        lines.append(
            f"  - node {last.writer!r}'s volume ({f.volume}) holds {f.hot_bytes} bytes in {f.hot_files} hot "
            f"segment file(s) (the acknowledged bytes not yet flushed to the cold tier are among them) and "
            f"{f.other_bytes} bytes of journal and snapshots; they are not read."
        )
    else:
        lines.append(
            f"  - unknown: how many acknowledged bytes node {last.writer!r}'s volume holds that were never "
            "flushed to the cold tier (pass --dead-data-dir with that volume to measure them)."
        )
    lines.append(
        f"If that volume can still be mounted, restart node {last.writer!r} on it instead: nothing is lost then."
    )
    return "\n".join(lines)
