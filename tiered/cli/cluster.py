"""``tiered cluster take-over``: an operator gives a dead node's local-durability shard to another node.

Reads the shard's manifest chain, its lease and its cold objects in the
store (and, with ``--dead-data-dir``, the dead node's volume), prints what
the takeover loses (``tiered/cluster/shards/takeover.py``), and only with
``--yes-lose-unflushed-data`` writes the grant. ``--dry-run`` opens the store
read-only and changes nothing. Exit codes: 0 done (or nothing to do), 1
refused (unconfirmed, or the shard is not a dead node's), 2 bad use.
"""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path
from typing import TextIO

from tiered.cluster.membership import keys
from tiered.cluster.membership.cas import ObjectStoreCas
from tiered.cluster.membership.lease import decode_lease
from tiered.cluster.membership.manifest import ManifestEntry, decode_entry
from tiered.cluster.shards.takeover import TakeoverFacts, TakeoverGrant, encode_grant, loss_statement
from tiered.cold.objects.keys import DATA_PREFIX
from tiered.cold.objects.store import ObjectStore
from tiered.core.config import Config
from tiered.engine.engine import open_store

__all__ = ["run_take_over"]

CONFIRM = "--yes-lose-unflushed-data"


def run_take_over(
    config: Config, shard: int, to: str, dead_data_dir: str, *, dry_run: bool, confirmed: bool
) -> int:
    return asyncio.run(take_over(config, shard, to, dead_data_dir, dry_run=dry_run, confirmed=confirmed))


async def take_over(
    config: Config,
    shard: int,
    to: str,
    dead_data_dir: str,
    *,
    dry_run: bool,
    confirmed: bool,
    out: TextIO | None = None,
) -> int:
    out = out or sys.stdout  # looked up now: a test may have replaced it
    if not config.cluster_node_id or config.durability != "local":
        print(
            "take-over is for cluster mode with local durability (cluster_node_id set, durability = "
            "'local'); with object-store durability any node serves any shard",
            file=out,
        )
        return 2
    if shard < 0:
        print("--shard must be a shard number", file=out)
        return 2
    store = await open_store(config, read_only=dry_run, probe=False)
    try:
        cas = ObjectStoreCas(store)
        latest = await _latest_entry(cas, shard)
        if latest is None:
            print(f"shard {shard} was never written by any node: nothing to take over", file=out)
            return 0
        if to and to == latest.writer:
            print(f"--to {to!r} is the shard's last writer: it needs no takeover", file=out)
            return 2
        lease = await cas.get(keys.lease_key(shard))
        if lease is not None:
            body = decode_lease(lease.data, shard)
            if not body.free and body.owner == latest.writer:
                print(
                    f"shard {shard}'s lease is held by its last writer {latest.writer!r} (epoch {body.epoch}): "
                    "if that node is really dead, wait until its lease expires and its node record goes stale, "
                    "then run this again",
                    file=out,
                )
        facts = await _facts(config, store, shard, latest, dead_data_dir, out)
        print(loss_statement(facts), file=out)
        target = repr(to) if to else "any node but the dead one"
        if dry_run:
            print(f"dry run: nothing changed (would grant shard {shard} to {target})", file=out)
            return 0
        if not confirmed:
            print(f"refused: nothing changed; pass {CONFIRM} to accept the loss above", file=out)
            return 1
        grant = TakeoverGrant(shard, latest.writer, latest.seq, latest.epoch, to, loss_statement(facts))
        await store.put(keys.takeover_key(shard), encode_grant(grant), if_none_match=False)
        print(
            f"granted: shard {shard} may be taken by {target} while its chain still ends at position "
            f"{latest.seq}; the next lease taker starts it empty",
            file=out,
        )
        return 0
    finally:
        await store.close()


async def _latest_entry(cas: ObjectStoreCas, shard: int) -> ManifestEntry | None:
    listed = await cas.list(keys.manifest_prefix(shard))
    for item in reversed(listed):
        seq = keys.seq_of_manifest_key(item.key)
        if seq is None:
            continue
        found = await cas.get(item.key)
        if found is not None:
            return decode_entry(found.data, shard, seq)
    return None


async def _facts(
    config: Config, store: ObjectStore, shard: int, latest: ManifestEntry, dead_data_dir: str, out: TextIO
) -> TakeoverFacts:
    prefix = f"shards/{shard:04d}/{DATA_PREFIX}"
    objects = size = 0
    async for info in store.list(prefix):
        objects += 1
        size += info.size
    shown = "/".join(p for p in (config.s3_prefix.strip("/"), prefix) if p)
    volume, hot_files, hot_bytes, other = "", 0, 0, 0
    if dead_data_dir:
        root = Path(dead_data_dir) / "shards" / f"{shard:04d}"
        if not root.is_dir():
            print(f"note: {root} does not exist: the dead node's volume is not measured", file=out)
        else:
            volume = str(root)
            for path in root.rglob("*"):
                if not path.is_file():
                    continue
                if (root / "hot") in path.parents:
                    hot_files += 1
                    hot_bytes += path.stat().st_size
                else:
                    other += path.stat().st_size
    return TakeoverFacts(
        shard,
        latest,
        f"s3://{config.s3_bucket}/{shown}",
        objects,
        size,
        config.gc_grace_s,
        volume,
        hot_files,
        hot_bytes,
        other,
    )
