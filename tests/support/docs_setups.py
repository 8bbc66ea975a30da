"""What a documentation block assumes, provided by name: ``<!-- docs-test: setup NAME -->`` in the markdown.

Each setup may prepare the block's workspace before it runs (files a command
names, state on the document's server), give a python block a prelude (stubs
for the application's own functions that the snippet names as placeholders),
and check afterwards what the docs say the block does.
"""

from __future__ import annotations

import datetime
import http.client
import ipaddress
import json
import re
import ssl
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID
from joserfc.jwk import OKPKey

from tests.support.docs_runner import CommandResult, Workspace
from tests.support.http_helpers import request
from tests.support.server_process import ServerProcess

TEXT = {"Content-Type": "text/plain"}


@dataclass(frozen=True)
class DocSetup:
    what: str  # what the block gets, in a few words
    prepare: Callable[[Workspace], None] | None = None
    after: Callable[[Workspace, list[CommandResult]], None] | None = None
    prelude: str = ""  # python blocks: run before the block, in its namespace


# --------------------------------------------------------------------------- certificate


def _certificate(ws: Workspace) -> None:
    """A throwaway self-signed certificate for localhost: cert.pem (the chain) and key.pem."""
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "localhost")])
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
        .sign(key, hashes.SHA256())
    )
    (ws.cwd / "cert.pem").write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    (ws.cwd / "key.pem").write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )
    )


def _https_checks(ws: Workspace, results: list[CommandResult]) -> None:
    """HTTPS, HTTP/2 by ALPN, HTTP/1.1 for clients that do not offer h2 (what the block's comment says)."""
    servers = [r for r in results if r.url and r.url.startswith("https://")]
    assert servers, "no command served HTTPS"
    for result in servers:
        assert result.url is not None
        host, port = result.url.removeprefix("https://").rsplit(":", 1)
        for offered, expected in ((["h2", "http/1.1"], "h2"), (["http/1.1"], "http/1.1")):
            context = ssl.create_default_context(cafile=str(ws.cwd / "cert.pem"))
            context.set_alpn_protocols(offered)
            conn = http.client.HTTPSConnection(host.strip("[]"), int(port), context=context, timeout=15)
            try:
                conn.connect()
                assert conn.sock is not None
                chosen = conn.sock.selected_alpn_protocol()
                assert chosen == expected, f"offered {offered}, the server chose {chosen}"
                if chosen == "http/1.1":
                    conn.request("GET", "/healthz")
                    assert conn.getresponse().status == 200
            finally:
                conn.close()


# --------------------------------------------------------------------------- JWKS


def _jwks(ws: Workspace) -> None:
    """idp-keys.json: the public half of an identity provider's Ed25519 signing key, as a JWK Set."""
    key = OKPKey.generate_key("Ed25519", parameters={"kid": "idp-1"})
    (ws.cwd / "idp-keys.json").write_text(json.dumps({"keys": [key.as_dict(private=False)]}))


# --------------------------------------------------------------------------- gc summary

GC_SUMMARY_ROWS = ("objects deleted", "bytes deleted", "orphans found", "errors", "integrity errors")


def _gc_summary(ws: Workspace, results: list[CommandResult]) -> None:
    """Every ``tiered gc`` printed its summary table; a dry run says it changed nothing."""
    runs = [r for r in results if re.search(r"\btiered\s+gc\b", r.text)]
    assert runs, "no tiered gc command ran"
    for result in runs:
        labels = {line.rsplit(None, 1)[0] for line in result.stdout.splitlines() if line.strip()}
        missing = [row for row in GC_SUMMARY_ROWS if row not in labels]
        assert not missing, f"line {result.command.line}: summary without {missing}:\n{result.stdout}"
        if "--dry-run" in result.text:
            assert result.stdout.startswith("DRY RUN: nothing was changed"), result.stdout


# --------------------------------------------------------------------------- a cold object


def _readme_columns() -> list[str]:
    """The cold object's columns as README's table lists them: the snippet must print exactly these."""
    readme = (Path(__file__).resolve().parent.parent.parent / "README.md").read_text()
    table = readme.split("| column | type | meaning |", 1)[1].split("\n\n", 1)[0]
    return re.findall(r"^\| `(\w+)` \|", table, re.M)


PARQUET_COLUMNS = _readme_columns()


def _cold_object(ws: Workspace) -> None:
    """A server that ran in this directory (data dir ./tiered-data) and flushed one stream to a cold object."""
    srv = ServerProcess(ws.cwd / "tiered-data", "--flush-interval-s", "0.2", "--hot-retention-s", "0")
    srv.start(timeout=90)
    try:
        url = f"{srv.url}/v1/stream/hello"
        assert request("PUT", url, TEXT)[0] == 201
        assert request("POST", url, TEXT, b"first line")[0] == 204
        deadline = time.monotonic() + 60
        while not list((ws.cwd / "tiered-data" / "cold" / "data").glob("*.parquet")):
            assert time.monotonic() < deadline, "no cold object within 60 s"
            time.sleep(0.1)
    finally:
        assert srv.stop() == 0


_COLD_OBJECT_PRELUDE = f"""
def docs_after():
    # The README's table of columns, and the row the setup appended.
    assert t.column_names == {PARQUET_COLUMNS!r}, t.column_names
    rows = t.to_pylist()
    assert [(r["bucket"], r["stream"], r["start_offset"], r["end_offset"], r["payload"]) for r in rows] == [
        ("default", "hello", 0, 10, b"first line")
    ], rows
"""


# --------------------------------------------------------------------------- a consumer group


def _group_billing(ws: Workspace) -> None:
    """On the document's server: streams events/a and events/b, group ``billing`` over ``events/*``, data on
    both, and retention past the group's cursor on events/b (the 4 bytes ``old\\n`` it never processed)."""
    base = ws.server_url
    for name, first in (("a", b""), ("b", b"old\n")):
        status, _, body = request("PUT", f"{base}/v1/stream/events/{name}", TEXT, first)
        assert status == 201, (status, body)
    status, headers, _ = request("GET", f"{base}/v1/stream/events/b?offset=-1")
    assert status == 200
    old_end = headers["Stream-Next-Offset"]
    status, _, body = request(
        "PUT", f"{base}/v1/groups/billing", {"Content-Type": "application/json"}, b'{"pattern": "events/*"}'
    )
    assert status == 201, (status, body)
    assert request("POST", f"{base}/v1/stream/events/a", TEXT, b"first\n")[0] == 204
    assert request("POST", f"{base}/v1/stream/events/b", TEXT, b"kept\n")[0] == 204
    status, _, body = request(
        "POST",
        f"{base}/v1/admin/retain/default/events/b",
        {"Authorization": f"Bearer {ws.admin_token}", "Content-Type": "application/json"},
        json.dumps({"offset": old_end}).encode(),
    )
    assert status in (200, 204), (status, body)


_GROUP_PRELUDE = """
import signal

seen = {}
losses = []


def report_loss(skipped):
    losses.append(skipped)


def handle(stream, data):
    seen[stream] = seen.get(stream, b"") + data
    if seen.get("events/a") == b"first\\n" and seen.get("events/b") == b"kept\\n" and losses:
        raise DocsTestStop


def _too_long(*_):
    raise TimeoutError(f"the consumer did not get both streams within 90 s: seen {seen}, losses {losses}")


signal.signal(signal.SIGALRM, _too_long)
signal.alarm(90)


def docs_after():
    signal.alarm(0)
    assert seen == {"events/a": b"first\\n", "events/b": b"kept\\n"}, seen
    assert [(s.stream, s.bytes) for s in losses] == [("events/b", 4)], losses
"""


SETUPS: dict[str, DocSetup] = {
    "certificate": DocSetup(
        "a throwaway certificate (cert.pem, key.pem); checks ALPN h2 and HTTP/1.1",
        prepare=_certificate,
        after=_https_checks,
    ),
    "jwks": DocSetup("idp-keys.json, an identity provider's public keys", prepare=_jwks),
    "gc-summary": DocSetup("checks each tiered gc printed its summary", after=_gc_summary),
    "cold-object": DocSetup(
        "./tiered-data with one cold object; checks the columns and the row",
        prepare=_cold_object,
        prelude=_COLD_OBJECT_PRELUDE,
    ),
    "group-billing": DocSetup(
        "group billing on the document's server with data and a skipped range; stubs handle and report_loss",
        prepare=_group_billing,
        prelude=_GROUP_PRELUDE,
    ),
}


def setups_named(names: tuple[str, ...]) -> list[DocSetup]:
    unknown = [n for n in names if n not in SETUPS]
    assert not unknown, f"unknown docs-test setup {unknown}; known: {', '.join(sorted(SETUPS))}"
    return [SETUPS[n] for n in names]
