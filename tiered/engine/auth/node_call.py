"""Whether the request being served was sent, and signed, by another node of the cluster.

Shard routing (``tiered/cluster/gateway/shard_router.py``) verifies a request's node
signature (``tiered/cluster/membership/secret.py``) before handing it to a shard's
engine, and sets ``NODE_CALL`` for the duration of that call; the engine's
routes and middleware read it (``current()``). A context variable, not a
header: nothing a client sends can set it. Outside cluster mode it is never set.

A ``system`` call is a node's own work on the data plane (a wake event appended
to a stream of another shard, a cross-shard fork's pin and copy, the pin
sweep): the engine's authorization treats it as the operator on stream routes
only (``tiered.api.access.system_may``), never on admin, token or metrics routes.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass

from tiered.core.errors import ErrorCode, TieredError

__all__ = ["SYSTEM", "SYSTEM_MARKS", "UNCOUNTED", "NodeCall", "current", "node_call", "require"]

#: A fan-out or scatter sub-request to a shard other than the bucket's well-known one: not counted again.
UNCOUNTED = "uncounted"
#: A node's own work on a stream (not a client's request): authorized as the operator on stream routes.
SYSTEM = "system"
#: What a node signs its system calls with: system, and not counted in any bucket's usage (no client asked).
SYSTEM_MARKS = frozenset({SYSTEM, UNCOUNTED})


@dataclass(frozen=True, slots=True)
class NodeCall:
    """What a verified node signature says: the request comes from a node, with these marks."""

    marks: frozenset[str]

    @property
    def uncounted(self) -> bool:
        return UNCOUNTED in self.marks

    @property
    def system(self) -> bool:
        return SYSTEM in self.marks


_NODE_CALL: ContextVar[NodeCall | None] = ContextVar("tiered_node_call", default=None)


def current() -> NodeCall | None:
    return _NODE_CALL.get()


@contextmanager
def node_call(call: NodeCall | None) -> Iterator[None]:
    """Serve what runs inside as ``call`` (None: a client's request)."""
    token = _NODE_CALL.set(call)
    try:
        yield
    finally:
        _NODE_CALL.reset(token)


def require() -> NodeCall:
    """The node call being served; 401 for anyone else (an internal route)."""
    call = _NODE_CALL.get()
    if call is None:
        raise TieredError(
            ErrorCode.UNAUTHORIZED,
            "an internal route: only the cluster's nodes may call it (signed requests)",
        )
    return call
