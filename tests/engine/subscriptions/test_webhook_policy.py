"""Webhook SSRF: where a webhook may be sent, judged at creation and again at connect time.

* URLs are judged by the host the HTTP client will connect to (IDNA-normalized,
  legacy IPv4 spellings resolved), and IPv6 forms embedding an IPv4 address by
  that address: fullwidth digits, ``[::127.0.0.1]``, NAT64 and 6to4 forms of
  169.254.169.254, site-local ``fec0::/10`` are all refused;
* loopback (and plain http) only with ``--webhook-allow-loopback``;
* at connect time the connector's socket factory refuses every address the
  policy refuses, for literal IPs as for resolved names, so a subscription
  created before the policy changed (or a name that rebinds) still cannot reach them;
* end to end: with the flag off, a server refuses a loopback webhook at creation,
  and a delivery attempted to a loopback address never arrives.
"""

from __future__ import annotations

import asyncio
import ipaddress
import json
import socket
import threading
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path

import aiohttp
import pytest

from tests.support.http_helpers import request
from tests.support.server_process import ServerProcess
from tiered.engine.subscriptions.webhook_policy import (
    WebhookUrlRejected,
    address_allowed,
    check_webhook_url,
    embedded_ipv4,
    guarded_socket_factory,
)

ACCEPTED = [
    "https://hooks.example.com/x",
    "https://hooks.example.com:8443/x?y=1",
    "https://8.8.8.8/hook",
    "https://[2001:4860:4860::8888]/hook",
    "https://exämple.com/hook",
]
LOOPBACK = [
    "http://localhost/hook",
    "http://localhost:8080/hook",
    "http://LOCALHOST./hook",
    "http://127.0.0.1:9/hook",
    "http://127.0.0.255/hook",
    "http://127.1.2.3/hook",
    "http://[::1]:8080/hook",
    "https://localhost/x",
    "https://127.0.0.1:18443/",
    "https://１２７.０.０.１:18443/",  # fullwidth digits: IDNA maps them to 127.0.0.1
    "https://[::127.0.0.1]/",  # IPv4-compatible loopback
    "https://[::ffff:127.0.0.1]/",  # IPv4-mapped loopback
    "http://2130706433/x",  # 127.0.0.1 as one number
    "http://0x7f.1/x",
]
REFUSED_ADDRESSES = [
    "10.0.0.1",
    "172.16.5.4",
    "192.168.1.1",
    "169.254.169.254",
    "0.0.0.0",
    "100.64.0.1",
    "224.0.0.1",
    "[fe80::1]",
    "[fd00::1]",
    "[::ffff:10.0.0.1]",
    "10.1",
    "[64:ff9b::a9fe:a9fe]",  # NAT64 form of 169.254.169.254
    "[2002:a9fe:a9fe::]",  # 6to4 form of 169.254.169.254
    "[fec0::1]",  # site-local
    "[64:ff9b:1::a00:1]",  # local-use NAT64
    "[::a9fe:a9fe]",  # IPv4-compatible 169.254.169.254
    "[2001:0:4136:e378:8000:63bf:3fff:fdd2]",  # Teredo
]


@pytest.mark.parametrize("url", ACCEPTED)
def test_public_https_urls_are_accepted(url: str) -> None:
    assert check_webhook_url(url, allow_loopback=False) == url


@pytest.mark.parametrize("url", LOOPBACK)
def test_loopback_only_with_the_development_flag(url: str) -> None:
    with pytest.raises(WebhookUrlRejected, match="must not target loopback"):
        check_webhook_url(url, allow_loopback=False)
    assert check_webhook_url(url, allow_loopback=True) == url


@pytest.mark.parametrize("host", REFUSED_ADDRESSES)
@pytest.mark.parametrize("allow_loopback", [False, True])
def test_private_reserved_and_embedded_addresses_are_refused(host: str, allow_loopback: bool) -> None:
    with pytest.raises(WebhookUrlRejected, match="private, loopback, link-local or reserved"):
        check_webhook_url(f"https://{host}/x", allow_loopback=allow_loopback)


@pytest.mark.parametrize(
    "url, message",
    [
        ("http://10.0.0.1/hook", "must be an https URL"),
        ("http://hooks.example.com/x", "must be an https URL"),
        ("ftp://hooks.example.com/x", "must be an https URL"),
        ("not a url", "must be a valid URL"),
        ("https:///nohost", "must be an https URL"),
        ("https://hooks.example.com:99999/x", "must be a valid URL"),
        ("https://foo.localhost/x", "local network names"),
        ("https://printer.local/x", "local network names"),
        ("https://metadata.google.internal/x", "local network names"),
        ("https://intranet/x", "local network names"),
    ],
)
def test_other_refusals(url: str, message: str) -> None:
    with pytest.raises(WebhookUrlRejected, match=message):
        check_webhook_url(url, allow_loopback=True)


def test_embedded_ipv4_forms() -> None:
    v6 = ipaddress.IPv6Address
    assert embedded_ipv4(v6("64:ff9b::a9fe:a9fe")) == [ipaddress.IPv4Address("169.254.169.254")]
    assert embedded_ipv4(v6("2002:a9fe:a9fe::")) == [ipaddress.IPv4Address("169.254.169.254")]
    assert embedded_ipv4(v6("::127.0.0.1")) == [ipaddress.IPv4Address("127.0.0.1")]
    assert embedded_ipv4(v6("2001:4860:4860::8888")) == []
    assert address_allowed(v6("64:ff9b::808:808"), allow_loopback=False)  # NAT64 of 8.8.8.8 is public


# --------------------------------------------------------------- at connect time


@pytest.fixture
def receiver() -> object:
    """A plain HTTP server on 127.0.0.1 that records what reaches it."""
    hits: list[str] = []

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:  # noqa: N802
            hits.append(self.path)
            self.send_response(204)
            self.end_headers()

        def log_message(self, *args: object) -> None:
            pass

    srv = HTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    try:
        yield srv.server_address[1], hits
    finally:
        srv.shutdown()


async def _post(url: str, allow_loopback: bool) -> int:
    connector = aiohttp.TCPConnector(socket_factory=guarded_socket_factory(allow_loopback=allow_loopback))
    async with aiohttp.ClientSession(connector=connector, trust_env=False) as session:
        async with session.post(url, data=b"{}", allow_redirects=False) as resp:
            return resp.status


@pytest.mark.parametrize("host", ["127.0.0.1", "localhost", "[::ffff:127.0.0.1]"])
def test_connect_time_check_refuses_literal_ips_and_names(receiver: tuple[int, list[str]], host: str) -> None:
    port, hits = receiver
    if host.startswith("[::ffff") and not socket.has_ipv6:
        pytest.skip("no IPv6")
    with pytest.raises(aiohttp.ClientConnectorError):
        asyncio.run(_post(f"http://{host}:{port}/blocked", allow_loopback=False))
    assert hits == []
    if host != "[::ffff:127.0.0.1]":
        assert asyncio.run(_post(f"http://{host}:{port}/allowed", allow_loopback=True)) == 204
        assert hits == ["/allowed"]


def test_server_refuses_loopback_webhooks_unless_allowed(tmp_path: Path) -> None:
    body = b'{"type": "webhook", "streams": ["s"], "webhook": {"url": "http://127.0.0.1:9/x"}}'
    ct = {"Content-Type": "application/json"}
    srv = ServerProcess(tmp_path / "a", "--host", "127.0.0.1").start()
    try:
        for url in (
            "http://127.0.0.1:9/x",
            "http://localhost:9/x",
            "https://１２７.０.０.１:18443/",
            "https://[::127.0.0.1]/",
            "https://[64:ff9b::a9fe:a9fe]/",
            "https://[2002:a9fe:a9fe::]/",
            "https://[fec0::1]/",
        ):
            raw = json.dumps({"type": "webhook", "streams": ["s"], "webhook": {"url": url}}).encode()
            status, _, answer = request("PUT", srv.url + "/v1/stream/__ds/subscriptions/s1", ct, raw)
            assert status == 400 and b"WEBHOOK_URL_REJECTED" in answer, (url, status, answer)
    finally:
        srv.stop()
    srv = ServerProcess(tmp_path / "b", "--webhook-allow-loopback", "true").start()
    try:
        assert request("PUT", srv.url + "/v1/stream/__ds/subscriptions/s1", ct, body)[0] == 201
    finally:
        srv.stop()
