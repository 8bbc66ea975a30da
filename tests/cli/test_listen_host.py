"""``--host`` may be a name: resolved before binding, listened on at every address, judged on those addresses.

* ``tiered serve --host localhost`` starts and serves on both HTTP adapters
  (granian refused the name: ``ValueError: invalid IP address syntax``).
* A name that does not resolve is a one-line error and exit code 2, before
  anything is opened.
* Loopback is decided on the resolved addresses (``ipaddress.is_loopback``):
  ``127.attacker.example`` is no loopback address (``startswith("127.")``
  said it was, so the server would have started open to whatever that name
  points at), ``localhost`` pointing at a routable address is not loopback.
* A name with several addresses is listened on at each of them, on one port
  (both adapters, in process, with the resolver answering two loopback
  addresses).
"""

from __future__ import annotations

import asyncio
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support.http_helpers import append, create, read, request, stream_url, unique
from tests.support.server_process import ServerProcess
from tiered.api.kit.types import Request, Response
from tiered.core import hosts
from tiered.core.config import Config

pytestmark = pytest.mark.timeout(120)


@pytest.fixture
def resolver(monkeypatch: pytest.MonkeyPatch) -> Iterator[dict[str, list[str]]]:
    """Names the test resolves itself (``{name: [addresses]}``); every other name resolves as usual."""
    answers: dict[str, list[str]] = {}
    real = socket.getaddrinfo

    def getaddrinfo(host: Any, port: Any, *args: Any, **kwargs: Any) -> Any:
        if host in answers:
            return [
                (socket.AF_INET6 if ":" in a else socket.AF_INET, socket.SOCK_STREAM, 6, "", (a, 0))
                for a in answers[host]
            ]
        return real(host, port, *args, **kwargs)

    monkeypatch.setattr(hosts.socket, "getaddrinfo", getaddrinfo)
    hosts.listen_addresses.cache_clear()
    yield answers
    hosts.listen_addresses.cache_clear()


@pytest.mark.parametrize("adapter", ["granian", "aiohttp"])
def test_serve_on_localhost(tmp_path: Path, adapter: str) -> None:
    srv = ServerProcess(tmp_path / "data", "--host", "localhost", "--http-server", adapter).start()
    try:
        u = stream_url(srv.url, unique("localhost"))
        assert create(u, "text/plain", "hello")[0] == 201
        assert append(u, " world", "text/plain")[0] == 204
        assert read(u, "-1")[2] == b"hello world"
        addresses = hosts.listen_addresses("localhost")
        for address in addresses:
            assert f"tiered listening on http://{hosts.url_host(address)}:{srv.port} ({adapter}" in srv.log()
    finally:
        assert srv.stop() == 0


def test_a_host_name_that_does_not_resolve_is_a_one_line_error(tmp_path: Path) -> None:
    data = tmp_path / "data"
    proc = subprocess.run(
        [sys.executable, "-m", "tiered.cli", "serve", "--host", "no-such-host.invalid", "--auth", "tokens"]
        + ["--port", "4999", "--data-dir", str(data)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith("tiered: cannot start: cannot resolve host 'no-such-host.invalid'"), lines
    assert not data.exists()


def test_an_empty_host_is_refused() -> None:
    from tiered.core.config import ConfigError, load_config

    with pytest.raises(ConfigError, match="host must not be empty"):
        load_config(env={}, overrides={"host": " "})


def test_loopback_is_decided_on_the_resolved_addresses(resolver: dict[str, list[str]]) -> None:
    resolver["localhost"] = ["10.0.0.7"]
    resolver["dual.test"] = ["127.0.0.1", "::1"]
    resolver["mixed.test"] = ["127.0.0.1", "192.0.2.5"]
    assert Config(host="localhost").loopback_only is False
    assert Config(host="localhost").exposure_problem() is not None  # refuses to start without --auth
    assert Config(host="dual.test").loopback_only is True
    assert Config(host="mixed.test").loopback_only is False
    assert Config(host="127.attacker.example").loopback_only is False  # does not resolve: not loopback
    assert Config(host="127.0.0.1").loopback_only is True
    assert Config(host="127.8.9.1").loopback_only is True
    assert Config(host="::1").loopback_only is True
    assert Config(host="[::1]").loopback_only is True
    assert Config(host="0.0.0.0").loopback_only is False
    assert Config(host="::").loopback_only is False


async def _ok(request: Request) -> Response:
    return Response(200, {"Content-Type": "text/plain"}, b"ok")


@pytest.mark.parametrize("adapter", ["granian", "aiohttp"])
def test_a_name_with_two_addresses_is_listened_on_at_both(
    resolver: dict[str, list[str]], adapter: str
) -> None:
    resolver["two.test"] = ["127.0.0.1", "127.0.0.2"]

    async def main() -> None:
        if adapter == "granian":
            from tiered.api.kit.rsgi_server import RsgiListener

            listener: Any = RsgiListener(_ok, max_body_bytes=1024)
        else:
            from tiered.api.kit.aiohttp_server import AiohttpListener

            listener = AiohttpListener(_ok, max_body_bytes=1024)
        bound = await listener.start("two.test", 0)
        try:
            assert [a for a, _ in bound] == ["127.0.0.1", "127.0.0.2"]
            assert len({p for _, p in bound}) == 1  # one port
            for address, port in bound:
                status, _, body = await asyncio.to_thread(request, "GET", f"http://{address}:{port}/")
                assert (status, body) == (200, b"ok")
        finally:
            await listener.stop()

    asyncio.run(main())
