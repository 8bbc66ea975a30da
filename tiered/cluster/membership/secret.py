"""Node-to-node credentials: the cluster secret, and signed internal requests.

**The secret.** One object, ``_tiered/cluster/secret.json`` (32 random bytes),
created only if absent by the first node that starts and read by every other:
whoever holds the store's credentials is a node (as in WarpStream), so the
store is the only thing an operator must share. It never leaves the nodes.

**Signatures.** A request one node makes of another (the streams of a shard
for a group's view, scatter-gather and fan-out sub-requests, token installs)
carries ``Tiered-Node-Signature: v1 ts=<ms> nonce=<hex> marks=<a,b> sig=<hex>``:
an HMAC-SHA256 under the secret over the method, the path with its query, the
``Tiered-Shard`` it is aimed at, the timestamp, the nonce, the marks and the
SHA-256 of the body. The serving node checks it (``verify``, constant-time
compare) before the engine sees the request; a timestamp more than
``WINDOW_MS`` away from its own clock is refused (the nodes' clocks must agree
to well within that: NTP). Every refusal is a 401 ``UNAUTHORIZED`` with the
protocol's error body.

A valid signature within the window may be *replayed* (there is no nonce
cache: the forwarder itself resends a read after an ownership change), but
only as the very request it signs (method, target, shard and body are
covered). What a signature grants: reading a shard's stream listing,
installing a token record by id (identical record: no-op), revoking by id,
the ``uncounted`` mark (a replayed sub-request is simply not counted in usage
again), and the ``system`` mark: the operator's authority on *stream* routes
for that one request (a wake event appended to a wake stream, a fork pin's
create, read or delete, the sweep's ``HEAD`` of a fork). A replay of a
captured system call within the window repeats it: a duplicate wake event
(wakes are at-least-once anyway), a pin created again (swept once its
grace passed), a pin deleted again (harmless unless a fork of the same name
was created again within the window: its source then loses the pin). The body is signed, so a captured
install cannot be turned into one with another secret's hash.

Marks: ``uncounted`` (a fan-out or scatter sub-request to a shard other than
the bucket's well-known one: the client's request is counted once, there);
``system`` (a node's own work, ``tiered.engine.auth.node_call.SYSTEM``).
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import secrets
from urllib.parse import unquote

from tiered.cluster.membership.cas import AlreadyExists, CasStore
from tiered.cluster.membership.keys import ROOT
from tiered.core.clock import Clock
from tiered.engine.auth.credentials import invalid_credential
from tiered.engine.auth.node_call import SYSTEM, UNCOUNTED, NodeCall

__all__ = [
    "SECRET_KEY",
    "SIGNATURE_HEADER",
    "UNCOUNTED",
    "WINDOW_MS",
    "NodeCall",
    "NodeSigner",
    "load_or_create",
    "sign",
    "target_of",
    "verify",
]

SECRET_KEY = ROOT + "secret.json"
SIGNATURE_HEADER = "Tiered-Node-Signature"
SECRET_BYTES = 32
WINDOW_MS = 60_000
MARKS = frozenset({UNCOUNTED, SYSTEM})
_VERSION = "v1"


def target_of(path: str, query: str) -> str:
    """What a signature covers of the URL: path and query with percent-escapes decoded (an HTTP client
    may re-escape them on the way)."""
    return unquote(path + (f"?{query}" if query else ""), errors="surrogateescape")


def _message(method: str, target: str, shard: str, ts_ms: int, nonce: str, marks: str, body: bytes) -> bytes:
    return "\n".join(
        (_VERSION, method.upper(), target, shard, str(ts_ms), nonce, marks, hashlib.sha256(body).hexdigest())
    ).encode("utf-8", "surrogateescape")


def sign(
    secret: bytes,
    method: str,
    target: str,
    shard: str,
    body: bytes,
    *,
    now_ms: int,
    nonce: str,
    marks: frozenset[str] = frozenset(),
) -> str:
    """The signature header's value for one request (``target``: path and ``?query``; ``shard``: Tiered-Shard or "")."""
    joined = ",".join(sorted(marks))
    mac = hmac.new(secret, _message(method, target, shard, now_ms, nonce, joined, body), hashlib.sha256)
    return f"{_VERSION} ts={now_ms} nonce={nonce} marks={joined} sig={mac.hexdigest()}"


def verify(
    secret: bytes, header: str, method: str, target: str, shard: str, body: bytes, *, now_ms: int
) -> NodeCall:
    """The claims of a valid signature; 401 for anything else (malformed, forged, stale)."""
    fields: dict[str, str] = {}
    version, _, rest = header.strip().partition(" ")
    for part in rest.split(" "):
        name, sep, value = part.partition("=")
        if sep:
            fields[name] = value
    try:
        ts_ms = int(fields["ts"])
        nonce, marks, sig = fields["nonce"], fields["marks"], fields["sig"]
    except (KeyError, ValueError):
        raise invalid_credential("the node signature is malformed") from None
    if version != _VERSION or not nonce or len(sig) != 64:
        raise invalid_credential("the node signature is malformed")
    expected = hmac.new(
        secret, _message(method, target, shard, ts_ms, nonce, marks, body), hashlib.sha256
    ).hexdigest()
    if not hmac.compare_digest(expected.encode(), sig.encode("utf-8", "surrogateescape")):
        raise invalid_credential("the node signature is not valid")
    if abs(now_ms - ts_ms) > WINDOW_MS:
        raise invalid_credential("the node signature is stale (are the nodes' clocks synchronized?)")
    named = frozenset(m for m in marks.split(",") if m)
    if not named <= MARKS:
        raise invalid_credential("the node signature names an unknown mark")
    return NodeCall(named)


class NodeSigner:
    """Signs this node's internal requests and verifies other nodes' (one secret, one clock)."""

    def __init__(self, secret: bytes, clock: Clock) -> None:
        self._secret = secret
        self._clock = clock

    def header(
        self, method: str, target: str, shard: str, body: bytes, marks: frozenset[str] = frozenset()
    ) -> str:
        return sign(
            self._secret,
            method,
            target,
            shard,
            body,
            now_ms=self._clock.now_ms(),
            nonce=secrets.token_hex(12),
            marks=marks,
        )

    def verify(self, header: str, method: str, target: str, shard: str, body: bytes) -> NodeCall:
        return verify(self._secret, header, method, target, shard, body, now_ms=self._clock.now_ms())


def encode_secret(secret: bytes) -> bytes:
    return json.dumps({"version": 1, "secret": base64.b64encode(secret).decode()}).encode()


def decode_secret(data: bytes) -> bytes:
    try:
        doc = json.loads(data)
        secret = base64.b64decode(doc["secret"], validate=True)
    except (ValueError, KeyError, TypeError) as exc:
        raise ValueError(f"{SECRET_KEY} is not a cluster secret: {exc}") from None
    if doc.get("version") != 1 or len(secret) != SECRET_BYTES:
        raise ValueError(f"{SECRET_KEY} is not a {SECRET_BYTES}-byte cluster secret")
    return secret


async def load_or_create(store: CasStore) -> bytes:
    """The cluster's secret: read it, or create it (only if absent: two first nodes agree on the winner's)."""
    found = await store.get(SECRET_KEY)
    if found is not None:
        return decode_secret(found.data)
    try:
        await store.put_if_absent(SECRET_KEY, encode_secret(secrets.token_bytes(SECRET_BYTES)))
    except AlreadyExists:
        pass  # another node created it first: use theirs
    found = await store.get(SECRET_KEY)
    if found is None:
        raise ValueError(f"{SECRET_KEY} was created but cannot be read back")
    return decode_secret(found.data)
