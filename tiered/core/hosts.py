"""The addresses a ``--host`` setting names: resolved once, before anything binds.

``host`` may be an IP address (``127.0.0.1``, ``::1``, ``0.0.0.0``) or a name
(``localhost``, ``tiered.internal``). Both HTTP adapters bind addresses, not
names (granian refuses a name outright), so a name is resolved here and the
server listens on every address it resolves to, as ``localhost`` clients may
try either ``127.0.0.1`` or ``::1``. Whether the server is reachable only from
this machine is decided on those addresses (``ipaddress.is_loopback``), never
on the spelling of the name: ``localhost`` mapped to a routable address in
``/etc/hosts`` is not loopback, and ``127.0.0.1.example.com`` is not either.
"""

from __future__ import annotations

import ipaddress
import socket
from functools import lru_cache

__all__ = ["UnresolvableHost", "all_loopback", "listen_addresses", "url_host"]


class UnresolvableHost(ValueError):
    """The host setting names no address this machine can listen on."""


def _literal(host: str) -> str | None:
    """``host`` as an IP address (IPv6 without brackets or zone), or None when it is a name."""
    text = host[1:-1] if host.startswith("[") and host.endswith("]") else host
    try:
        return str(ipaddress.ip_address(text.split("%", 1)[0]))
    except ValueError:
        return None


@lru_cache(maxsize=64)
def listen_addresses(host: str) -> tuple[str, ...]:
    """Every address ``host`` names, in the resolver's order, without repeats (one I/O call, cached).

    Raises ``UnresolvableHost`` with a one-line reason when there is none.
    """
    if not host.strip():
        raise UnresolvableHost("the host is empty: give an address (127.0.0.1, 0.0.0.0, ::) or a name")
    literal = _literal(host)
    if literal is not None:
        return (literal,)
    try:
        infos = socket.getaddrinfo(host, None, type=socket.SOCK_STREAM)
    except (OSError, UnicodeError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        raise UnresolvableHost(f"cannot resolve host {host!r}: {reason}") from None
    found: list[str] = []
    for family, *_, sockaddr in infos:
        if family not in (socket.AF_INET, socket.AF_INET6):
            continue
        address = str(sockaddr[0]).split("%", 1)[0]
        if address not in found:
            found.append(address)
    if not found:
        raise UnresolvableHost(f"host {host!r} resolves to no IPv4 or IPv6 address")
    return tuple(found)


def all_loopback(addresses: tuple[str, ...]) -> bool:
    """True when every address is a loopback one (reachable only from this machine)."""
    return bool(addresses) and all(ipaddress.ip_address(a).is_loopback for a in addresses)


def url_host(address: str) -> str:
    """An address as it goes in a URL: IPv6 in brackets."""
    return f"[{address}]" if ":" in address else address
