"""Requests a node makes to a shard's engine: on its own behalf (cross-shard forks, the subscription feed),
or on a client's (the sub-requests of a fan-out, a scatter, a token install).

They go through shard routing like a client's (served here or forwarded), so
they must look like an adapter's requests: header lookups are
case-insensitive, as ``Request`` promises its handlers. ``TARGET_SHARD``
names the one shard a sub-request is for (``shard_request``).

``system_request`` signs one as a *system* call (``tiered.engine.auth.node_call.SYSTEM``):
the serving engine authorizes it as the operator on stream routes, with no
admin token and no client credential (wake events, fork pins, the pin sweep).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

from tiered.api.kit.types import Request
from tiered.cluster.membership.secret import SIGNATURE_HEADER, NodeSigner, target_of
from tiered.engine.auth.node_call import SYSTEM_MARKS

__all__ = ["TARGET_SHARD", "Sign", "internal_request", "shard_request", "system_request"]

#: On a request sent to one shard (a fan-out's, a scatter's, a feed's sub-requests): that shard's number.
TARGET_SHARD = "Tiered-Shard"

#: ``(method, target, shard, body, marks)`` -> this node's signature header (``tiered/cluster/membership/secret.py``); None: no signer yet.
Sign = Callable[[str, str, str, bytes, frozenset[str]], str | None]


class _Headers(dict[str, str]):
    """Header names in lower case, looked up case-insensitively like a server adapter's."""

    def get(self, key: str, default: str | None = None) -> str | None:  # type: ignore[override]
        return super().get(key.lower(), default)

    def __getitem__(self, key: str) -> str:
        return super().__getitem__(key.lower())

    def __contains__(self, key: object) -> bool:
        return super().__contains__(key.lower() if isinstance(key, str) else key)


def internal_request(
    method: str, path: str, headers: Mapping[str, str], body: bytes = b"", query: str = ""
) -> Request:
    """A request to ``path`` (percent-encoded) with ``headers`` and ``body``."""

    async def read() -> bytes:
        return body

    return Request(method, path, query, _Headers({k.lower(): v for k, v in headers.items()}), read)


def system_request(
    sign: Sign | None, method: str, path: str, headers: Mapping[str, str], body: bytes = b"", query: str = ""
) -> Request:
    """``internal_request`` signed by this node as a system call (unsigned while it has no signer)."""
    signed = dict(headers)
    header = sign(method, target_of(path, query), "", body, SYSTEM_MARKS) if sign is not None else None
    if header is not None:
        signed[SIGNATURE_HEADER] = header
    return internal_request(method, path, signed, body, query)


def shard_request(
    request: Request,
    shard: int,
    body: bytes,
    signer: NodeSigner | None,
    marks: frozenset[str] | None = None,
    *,
    method: str | None = None,
    path: str | None = None,
) -> Request:
    """``request`` aimed at one shard's engine (``TARGET_SHARD``), with its body already read.

    ``marks`` not None: signed by this node with those marks (``secret.py``; unsigned
    while it has no signer). ``method``/``path`` (no query then): another request on
    the client's behalf, with the client's headers (its own signature never passes).
    """
    headers = _Headers({k.lower(): v for k, v in request.headers.items()})
    headers.pop(SIGNATURE_HEADER.lower(), None)
    headers[TARGET_SHARD.lower()] = str(shard)
    method = method or request.method
    query = request.query_string if path is None or path == request.path else ""
    path = path or request.path
    if marks is not None and signer is not None:
        headers[SIGNATURE_HEADER.lower()] = signer.header(
            method, target_of(path, query), str(shard), body, marks
        )

    async def read() -> bytes:
        return body

    return Request(method, path, query, headers, read, scheme=request.scheme, host=request.host)
