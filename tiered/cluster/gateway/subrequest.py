"""Requests a node makes to a shard's engine on its own behalf (cross-shard forks, the subscription feed).

They go through shard routing like a client's (served here or forwarded), so
they must look like an adapter's requests: header lookups are
case-insensitive, as ``Request`` promises its handlers.

``system_request`` signs one as a *system* call (``tiered.engine.auth.node_call.SYSTEM``):
the serving engine authorizes it as the operator on stream routes, with no
admin token and no client credential (wake events, fork pins, the pin sweep).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

from tiered.api.kit.types import Request
from tiered.cluster.membership.secret import SIGNATURE_HEADER, target_of
from tiered.engine.auth.node_call import SYSTEM_MARKS

__all__ = ["Sign", "internal_request", "system_request"]

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
