"""Where webhooks may be sent: the URL check at creation and the address check at connect time.

Only globally routable unicast addresses are allowed. Loopback (and plain
``http``) only when the operator turns on ``--webhook-allow-loopback`` for
local development; it is off by default, so nobody who can reach the server
can make it POST to its own admin routes or to another local service.

A URL is judged by the host the HTTP client will actually connect to: yarl (which
aiohttp uses) normalizes it first (IDNA maps fullwidth digits to ASCII, names
to punycode), and legacy IPv4 spellings (``2130706433``, ``0x7f.1``) count as
the address a resolver makes of them. IPv6 forms that embed an IPv4 address
(mapped, compatible, NAT64, 6to4, Teredo) are judged by that address too.

Names are resolved only when connecting: the connector's socket factory checks
every address it is about to connect to (resolved names and literal IPs alike;
aiohttp skips the resolver for literal IPs), so DNS rebinding gets nowhere.
"""

from __future__ import annotations

import ipaddress
import re
import socket
from typing import Any

from yarl import URL

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address

MAX_URL_LENGTH = 2048
_LOCAL_SUFFIXES = (".localhost", ".local", ".localdomain", ".internal", ".home.arpa", ".lan")
_COMPAT = ipaddress.IPv6Network("::/96")  # IPv4-compatible (deprecated) ::a.b.c.d
_NAT64 = ipaddress.IPv6Network("64:ff9b::/96")  # well-known NAT64 prefix (RFC 6052)
_LOCAL_NAT64 = ipaddress.IPv6Network("64:ff9b:1::/48")  # local-use NAT64 (RFC 8215): site-specific
_SITE_LOCAL = ipaddress.IPv6Network("fec0::/10")  # deprecated site-local


class WebhookUrlRejected(ValueError):
    """A webhook URL the policy refuses (the message says why)."""


def embedded_ipv4(ip: ipaddress.IPv6Address) -> list[ipaddress.IPv4Address]:
    """IPv4 addresses an IPv6 address stands for (mapped, compatible, NAT64, 6to4, Teredo)."""
    out: list[ipaddress.IPv4Address] = []
    if ip.ipv4_mapped is not None:
        out.append(ip.ipv4_mapped)
    if ip in _COMPAT and int(ip) > 1:
        out.append(ipaddress.IPv4Address(int(ip) & 0xFFFFFFFF))
    if ip in _NAT64:
        out.append(ipaddress.IPv4Address(int(ip) & 0xFFFFFFFF))
    if ip.sixtofour is not None:
        out.append(ip.sixtofour)
    if ip.teredo is not None:
        out.extend(ip.teredo)
    return out


def address_allowed(ip: IPAddress, *, allow_loopback: bool) -> bool:
    """Whether a webhook may connect to ``ip``."""
    if isinstance(ip, ipaddress.IPv6Address):
        if ip.scope_id:
            return False
        if ip in _SITE_LOCAL or ip in _LOCAL_NAT64:
            return False
        v4s = embedded_ipv4(ip)
        if v4s:
            return all(address_allowed(v4, allow_loopback=allow_loopback) for v4 in v4s)
    if ip.is_loopback:
        return allow_loopback
    return ip.is_global and not ip.is_multicast


def literal_ip(host: str) -> IPAddress | None:
    """The address a host string is, if it is one (including legacy IPv4 spellings resolvers accept)."""
    try:
        return ipaddress.ip_address(host)
    except ValueError:
        pass
    if not re.fullmatch(r"[0-9a-fx.]+", host):
        return None
    try:
        return ipaddress.IPv4Address(socket.inet_aton(host))
    except OSError:
        return None


def check_webhook_url(raw: str, *, allow_loopback: bool) -> str:
    """``raw`` if a webhook may be sent there; ``WebhookUrlRejected`` otherwise."""
    if len(raw) > MAX_URL_LENGTH or any(c <= " " or c == "\x7f" for c in raw):
        raise WebhookUrlRejected("webhook.url must be a valid URL")
    try:
        url = URL(raw)
        host = url.raw_host  # what the client connects to: IDNA-mapped, punycode
        _ = url.port
    except (ValueError, UnicodeError):
        raise WebhookUrlRejected("webhook.url must be a valid URL") from None
    scheme = (url.scheme or "").lower()
    if scheme not in ("http", "https") or not host:
        raise WebhookUrlRejected("webhook.url must be an https URL")
    name = host.lower().rstrip(".")
    ip = literal_ip(name.strip("[]"))
    loopback = name == "localhost" or (ip is not None and _is_loopback(ip))
    if scheme == "http" and not loopback:
        raise WebhookUrlRejected(
            "webhook.url must be an https URL (plain http only to loopback, for development)"
        )
    if loopback:
        if not allow_loopback:
            raise WebhookUrlRejected(
                "webhook.url must not target loopback; the operator can allow it for local development "
                "(--webhook-allow-loopback)"
            )
        return raw
    if ip is not None:
        if not address_allowed(ip, allow_loopback=False):
            raise WebhookUrlRejected(
                "webhook.url must not target private, loopback, link-local or reserved addresses"
            )
        return raw
    if "." not in name or name.endswith(_LOCAL_SUFFIXES):
        raise WebhookUrlRejected("webhook.url must not target local network names")
    return raw


def _is_loopback(ip: IPAddress) -> bool:
    if isinstance(ip, ipaddress.IPv6Address):
        v4s = embedded_ipv4(ip)
        if v4s:
            return all(v4.is_loopback for v4 in v4s)
    return ip.is_loopback


def guarded_socket_factory(*, allow_loopback: bool) -> Any:
    """A socket factory for aiohttp's connector that refuses disallowed peer addresses.

    It sees every address the connector is about to connect to, whether it came
    from a resolver or was a literal IP in the URL.
    """

    def factory(addr_info: tuple[Any, ...]) -> socket.socket:
        family, type_, proto, _canon, sockaddr = addr_info
        ip = ipaddress.ip_address(sockaddr[0].split("%", 1)[0])
        if isinstance(ip, ipaddress.IPv6Address) and len(sockaddr) >= 4 and sockaddr[3]:
            raise OSError(f"webhook address {sockaddr[0]} is scoped: refused")
        if not address_allowed(ip, allow_loopback=allow_loopback):
            raise OSError(f"webhook address {ip} is not a public address: refused")
        return socket.socket(family=family, type=type_, proto=proto)

    return factory
