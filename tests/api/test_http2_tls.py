"""HTTP/2 and TLS served directly (``--tls-cert``/``--tls-key``), checked with a real HTTP/2 client.

httpx with the ``h2`` stack negotiates HTTP/2 by ALPN over TLS, and speaks it by
prior knowledge over cleartext. Everything is byte-exact: appends and reads,
many concurrent SSE readers multiplexed on one connection (with
tests/support/h2_client.py, one reader task per connection), long-poll, error bodies;
and HTTP/1.1 clients still work on the same TLS port.
"""

from __future__ import annotations

import asyncio
import datetime
import ipaddress
import ssl
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from tests.support.h2_client import H2Connection
from tests.support.http_helpers import unique
from tests.support.server_process import ServerProcess

pytestmark = pytest.mark.timeout(120)


def make_cert(directory: Path) -> tuple[Path, Path]:
    """A self-signed certificate for 127.0.0.1 and localhost (it is its own CA)."""
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "tiered test")])
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(
            x509.SubjectAlternativeName(
                [x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]
            ),
            critical=False,
        )
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )
    cert_path, key_path = directory / "cert.pem", directory / "key.pem"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )
    )
    return cert_path, key_path


class TlsServer(ServerProcess):
    def __init__(self, data_dir: Path, cert: Path, key: Path, *args: str) -> None:
        super().__init__(data_dir, "--tls-cert", str(cert), "--tls-key", str(key), *args)
        self.cert = cert

    @property
    def url(self) -> str:
        return f"https://127.0.0.1:{self.port}"

    def start(self, timeout: float = 20.0) -> TlsServer:
        ServerProcess.start(self, timeout)
        return self

    def ssl_context(self) -> ssl.SSLContext:
        return ssl.create_default_context(cafile=str(self.cert))


@pytest.fixture(scope="module")
def tls(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TlsServer]:
    base = tmp_path_factory.mktemp("tls")
    cert, key = make_cert(base)
    srv = TlsServer(base / "data", cert, key, "--long-poll-timeout-s", "3").start()
    try:
        yield srv
    finally:
        srv.stop()


def client(srv: TlsServer, **kw: object) -> httpx.Client:
    return httpx.Client(http2=True, verify=srv.ssl_context(), timeout=10, **kw)  # type: ignore[arg-type]


def test_https_serves_http2_by_alpn_byte_exact(tls: TlsServer) -> None:
    url = f"{tls.url}/v1/stream/{unique('h2')}"
    payloads = [bytes([i]) * (i * 997 + 1) for i in range(8)] + [bytes(range(256)) * 64]
    with client(tls) as c:
        r = c.put(url, headers={"Content-Type": "application/octet-stream"})
        assert (r.status_code, r.http_version) == (201, "HTTP/2")
        for p in payloads:
            r = c.post(url, content=p, headers={"Content-Type": "application/octet-stream"})
            assert r.status_code == 204, r.text
        r = c.get(url, params={"offset": "-1"})
        assert r.http_version == "HTTP/2"
        assert r.status_code == 200 and r.content == b"".join(payloads)
        assert r.headers["stream-next-offset"] == r.headers["Stream-Next-Offset"]
        # Errors keep their shape over HTTP/2.
        r = c.get(f"{tls.url}/v1/stream/{unique('missing')}")
        assert r.status_code == 404 and r.json()["error"]["code"] == "STREAM_NOT_FOUND"
        r = c.post(url, content=b"x", headers={"Content-Type": "text/plain"})
        assert r.status_code == 409, r.text


def test_http1_clients_still_work_over_tls(tls: TlsServer) -> None:
    url = f"{tls.url}/v1/stream/{unique('h1')}"
    with httpx.Client(http2=False, verify=tls.ssl_context(), timeout=10) as c:
        assert c.put(url, headers={"Content-Type": "text/plain"}).status_code == 201
        r = c.post(url, content=b"hello over tls", headers={"Content-Type": "text/plain"})
        assert r.status_code == 204 and r.http_version == "HTTP/1.1"
        assert c.get(url, params={"offset": "-1"}).content == b"hello over tls"


def test_a_client_that_does_not_trust_the_certificate_is_refused(tls: TlsServer) -> None:
    with httpx.Client(http2=True, timeout=10) as c, pytest.raises(httpx.ConnectError):
        c.get(f"{tls.url}/healthz")


def test_many_sse_readers_share_one_http2_connection(tls: TlsServer) -> None:
    """50 SSE readers and the appends that feed them, all streams of ONE HTTP/2 connection.

    The client is tests/support/h2_client.py (one task reads the connection), not httpx:
    httpcore's shared read lock can hold a POST's finished response behind an idle
    SSE stream's socket read until the next keep-alive (see that module).
    """
    path = f"/v1/stream/{unique('sse')}"
    readers = 50
    messages = [f"event {i} ".encode() * (i + 1) for i in range(5)]
    text = {"content-type": "text/plain"}

    async def main() -> tuple[list[bytes], list[int], int]:
        async with H2Connection("127.0.0.1", tls.port, tls.ssl_context()) as conn:
            assert (await conn.request("PUT", path, text)).status == 201
            all_open = asyncio.Event()
            opened = 0

            async def read_one() -> bytes:
                nonlocal opened
                got, buf, event = b"", b"", ""
                async with conn.stream("GET", f"{path}?offset=-1&live=sse") as (head, body):
                    assert head.status == 200
                    assert head.headers["content-type"].startswith("text/event-stream")
                    opened += 1
                    if opened == readers:
                        all_open.set()
                    async for chunk in body:
                        buf += chunk
                        *lines, buf = buf.split(b"\n")
                        for line in lines:
                            if line.startswith(b"event:"):
                                event = line[6:].strip().decode()
                            elif line.startswith(b"data:") and event == "data":
                                got += line[5:].removeprefix(b" ")
                                if got == b"".join(messages):
                                    return got
                return got

            tasks = [asyncio.create_task(read_one()) for _ in range(readers)]
            await asyncio.wait_for(all_open.wait(), 30)
            statuses = [(await conn.request("POST", path, text, m)).status for m in messages]
            got = await asyncio.wait_for(asyncio.gather(*tasks), 30)
            return got, statuses, conn.streams_opened

    got, statuses, streams = asyncio.run(main())
    assert statuses == [204] * len(messages)
    assert got == [b"".join(messages)] * readers
    assert streams == 1 + readers + len(messages)  # every request a stream of the one connection


def test_long_poll_over_http2_wakes_on_append(tls: TlsServer) -> None:
    url = f"{tls.url}/v1/stream/{unique('lp')}"

    async def main() -> tuple[int, bytes]:
        async with httpx.AsyncClient(http2=True, verify=tls.ssl_context(), timeout=20) as c:
            created = await c.put(url, headers={"Content-Type": "text/plain"})
            assert created.status_code == 201
            tail = created.headers["Stream-Next-Offset"]
            poll = asyncio.create_task(c.get(url, params={"offset": tail, "live": "long-poll"}))
            await asyncio.sleep(0.3)
            assert not poll.done()
            assert (
                await c.post(url, content=b"wake", headers={"Content-Type": "text/plain"})
            ).status_code == 204
            r = await asyncio.wait_for(poll, 10)
            return r.status_code, r.content

    assert asyncio.run(main()) == (200, b"wake")


def test_cleartext_http2_by_prior_knowledge(tmp_path: Path) -> None:
    srv = ServerProcess(tmp_path / "data").start()
    try:
        url = f"{srv.url}/v1/stream/{unique('h2c')}"
        with httpx.Client(http1=False, http2=True, timeout=10) as c:
            r = c.put(url, headers={"Content-Type": "text/plain"})
            assert (r.status_code, r.http_version) == (201, "HTTP/2")
            assert c.post(url, content=b"h2c", headers={"Content-Type": "text/plain"}).status_code == 204
            assert c.get(url, params={"offset": "-1"}).content == b"h2c"
    finally:
        assert srv.stop() == 0


def test_tls_flags_are_checked_before_anything_starts(tmp_path: Path) -> None:
    cert, key = make_cert(tmp_path)
    cases = [
        (["--tls-cert", str(cert)], "tls_cert and tls_key go together"),
        (["--tls-cert", str(cert), "--tls-key", str(tmp_path / "nope.pem")], "is not a readable file"),
        (["--tls-cert", str(cert), "--tls-key", str(key), "--http-server", "aiohttp"], "served by"),
    ]
    for args, message in cases:
        out = subprocess.run(
            [
                sys.executable,
                "-m",
                "tiered.cli",
                "serve",
                "--data-dir",
                str(tmp_path / "d"),
                "--port",
                "1",
                *args,
            ],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert out.returncode == 2 and message in out.stderr, (args, out.returncode, out.stderr)
        assert not (tmp_path / "d").exists()


def test_a_busy_port_is_a_clear_startup_error(tmp_path: Path) -> None:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        out = subprocess.run(
            [
                sys.executable,
                "-m",
                "tiered.cli",
                "serve",
                "--data-dir",
                str(tmp_path / "d"),
                "--port",
                str(port),
            ],
            capture_output=True,
            text=True,
            timeout=60,
        )
    assert out.returncode == 1, (out.returncode, out.stderr)
    assert "cannot start" in out.stderr and str(port) in out.stderr, out.stderr
