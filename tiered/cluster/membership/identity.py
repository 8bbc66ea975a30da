"""Two processes under one node id: which one keeps the id, and how the other learns it must exit. Pure.

A node id names one process at a time: its current incarnation. Two
processes can end up with the same id (a second machine configured with it;
a process paused past its TTL while its replacement started). The process
holding the id's current incarnation keeps it; the other exits with
``EXIT_NODE_ID_IN_USE`` and a message naming the other incarnation:

* a process that has not joined yet and, while it waits out an ``alive``
  heartbeat (a previous process that may have crashed), sees that heartbeat
  change to another ``alive`` version twice: a process is beating under the
  id, so this one refuses to start (``twin_running``). Once is not enough: a
  crashed process may have had one write in flight that lands late (every
  write it makes is a compare-and-set on the version it last knew, so at
  most one of them can land), never two;
* a process that has been an incarnation and finds the id's heartbeat
  ``alive`` at a *higher* incarnation: a newer process replaced it while it
  was paused or cut off, so it exits (``replaced_by``). It has already lost
  every lease (its incarnation is dead to everyone who read the newer one).

Why not let the newer one take over a running older one at once: the older
one's acknowledgement window may still be open (it closes ``ttl - margin``
after its last beat), and nothing but waiting out ``ttl + margin`` proves it
closed. And why exit rather than wait: waiting for an id another live process
holds never ends, and every shard its namesake holds is refused meanwhile.
An exit with a distinct code is what an operator (or a supervisor's
``RestartPreventExitStatus``) can act on.
"""

from __future__ import annotations

from tiered.cluster.membership.heartbeat import HeartbeatRecord, Liveness

__all__ = ["EXIT_NODE_ID_IN_USE", "TWIN_CHANGES", "NodeIdInUse", "replaced_by", "twin_running"]

#: The exit code of ``tiered serve`` when another process holds its node id (docs/cluster.md).
EXIT_NODE_ID_IN_USE = 3


class NodeIdInUse(Exception):
    """This process must exit: another process holds its node id (see the module docstring)."""

    exit_code = EXIT_NODE_ID_IN_USE

    def __init__(self, node: str, message: str) -> None:
        super().__init__(message)
        self.node = node
        self.message = message


def _where(found: HeartbeatRecord) -> str:
    url = found.body.advertise_url
    return f" (advertised at {url})" if url else ""


def replaced_by(node: str, mine: int, found: HeartbeatRecord | None) -> str | None:
    """Why this process, once incarnation ``mine`` of ``node``, must exit; None if it need not.

    ``found``: the id's heartbeat as just read. Only an ``alive`` higher
    incarnation is a replacement; one that is ``dead`` or ``stopped`` is gone,
    and this process may join again as usual.
    """
    if mine < 1 or found is None:
        return None
    body = found.body
    if body.state is not Liveness.ALIVE or body.incarnation <= mine:
        return None
    return (
        f"node {node} incarnation {mine} was replaced by incarnation {body.incarnation}{_where(found)}: "
        f"another process started with this node id while this one was paused or cut off from the store; "
        f"this process exits (code {EXIT_NODE_ID_IN_USE}) and leaves the id to it"
    )


#: New ``alive`` versions a waiting process must see before it concludes another process beats.
TWIN_CHANGES = 2


def twin_running(
    node: str, first_seen: HeartbeatRecord | None, current: HeartbeatRecord | None, changes: int
) -> str | None:
    """Why this process, not joined yet, must not start; None if it may go on waiting or join.

    ``first_seen``: the ``alive`` heartbeat it began to wait out; ``current``:
    the heartbeat now; ``changes``: how many other ``alive`` versions it has
    seen since ``first_seen`` (``current`` included), none of them its own.
    """
    if first_seen is None or current is None or first_seen.body.state is not Liveness.ALIVE:
        return None
    if changes < TWIN_CHANGES or current.body.state is not Liveness.ALIVE:
        return None
    return (
        f"node id {node} is in use: incarnation {current.body.incarnation}{_where(current)} is beating "
        f"(heartbeat {first_seen.body.beat} -> {current.body.beat} while this process waited); two processes "
        f"cannot share a node id, so this one does not start (exit code {EXIT_NODE_ID_IN_USE})"
    )
