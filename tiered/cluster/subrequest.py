"""Requests a node makes to a shard's engine on its own behalf (cross-shard forks, the subscription feed).

They go through shard routing like a client's (served here or forwarded), so
they must look like an adapter's requests: header lookups are
case-insensitive, as ``Request`` promises its handlers.
"""

from __future__ import annotations

from collections.abc import Mapping

from tiered.http.types import Request

__all__ = ["internal_request"]


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
