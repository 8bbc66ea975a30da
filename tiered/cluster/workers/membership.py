"""What the supervisor of a multi-worker node tells the other workers when one is gone.

The supervisor knows for certain when a worker process ended (it reaped it),
so it need not wait out the lease TTL as a peer on another machine must: it
declares the worker's incarnation dead at once (the cluster's ordinary
compare-and-set on its heartbeat, ``tiered/cluster/membership/heartbeat.py``).
The other workers then take its shards at their next pass, and a restarted
worker joins as the next incarnation without waiting.
"""

from __future__ import annotations

import logging
import secrets

from tiered.cluster.membership import keys
from tiered.cluster.membership.cas import CasError, CasStore
from tiered.cluster.membership.heartbeat import (
    HeartbeatRecord,
    Liveness,
    decode_heartbeat,
    encode_heartbeat,
    plan_declare_dead,
)
from tiered.core.errors import TieredError

__all__ = ["SUPERVISOR", "declare_gone", "declare_every_alive"]

log = logging.getLogger(__name__)

#: Who declared a worker dead, as its heartbeat records it.
SUPERVISOR = "supervisor"


async def declare_gone(cas: CasStore, node: str) -> bool:
    """Mark ``node``'s current incarnation dead unless it already is not alive; True if it was alive."""
    for _ in range(5):  # a concurrent beat of a worker that was still exiting: read and try again
        try:
            found = await cas.get(keys.node_key(node))
            if found is None:
                return False
            record = HeartbeatRecord(decode_heartbeat(found.data, node), found.etag)
            if record.body.state is not Liveness.ALIVE:
                return False
            write = plan_declare_dead(node, record, by=SUPERVISOR, nonce=secrets.token_hex(8))
            assert write.if_match is not None
            await cas.put_if_match(keys.node_key(node), encode_heartbeat(write.body), write.if_match)
            log.info("worker %s incarnation %d declared dead", node, record.body.incarnation)
            return True
        except CasError as exc:
            log.info("declaring worker %s dead: %s; trying again", node, exc)
        except TieredError as exc:
            log.warning(
                "worker %s's heartbeat is unreadable (%s); its peers will wait out its TTL", node, exc
            )
            return False
    return False


async def declare_every_alive(cas: CasStore) -> list[str]:
    """At start-up (the data dir's lock held, so no earlier worker runs): every node still marked alive is a
    worker of a node that was killed; declare each dead so the new workers need not wait out their TTL."""
    gone: list[str] = []
    try:
        listed = await cas.list(keys.NODES)
    except CasError as exc:
        log.warning("could not list the workers' heartbeats (%s); new workers wait out their TTL", exc)
        return gone
    for entry in listed:
        node = keys.node_of_key(entry.key)
        if node is not None and await declare_gone(cas, node):
            gone.append(node)
    return gone
