"""Node-to-node credentials, the pure parts and the secret object: signing, verification, the store's secret.

Replays within the window are accepted on purpose (no nonce cache): every
request a signature grants is idempotent or harmless to repeat (a shard's
stream listing, a token installed by id, the ``uncounted`` mark, a node's
``system`` call: see ``tiered/cluster/membership/secret.py``), and the forwarder itself
resends a read after an ownership change. The tests pin that a replay is accepted only
for the very same request (method, URL, shard, body, marks).
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
from pathlib import Path

import pytest

from tiered.cluster.membership.cas import Fault, MemoryCasStore
from tiered.cluster.membership.secret import (
    SECRET_KEY,
    UNCOUNTED,
    WINDOW_MS,
    NodeSigner,
    decode_secret,
    encode_secret,
    load_or_create,
    sign,
    target_of,
    verify,
)
from tiered.core.clock import VirtualClock
from tiered.core.errors import ErrorCode, TieredError
from tiered.engine.auth.node_call import NodeCall, current, node_call, require
from tiered.engine.auth.records import TokenIssued
from tiered.engine.auth.state import AuthState
from tiered.engine.auth.token_format import digest

SECRET = bytes(range(32))
NOW = 1_800_000_000_000


def signed(**kw: object) -> str:
    args: dict[str, object] = {
        "method": "GET",
        "target": "/v1/cluster/shards/2/streams?bucket=b",
        "shard": "",
        "body": b"",
        "now_ms": NOW,
        "nonce": "ab" * 12,
        "marks": frozenset(),
    }
    args.update(kw)
    return sign(SECRET, **args)  # type: ignore[arg-type]


def check(header: str, **kw: object) -> NodeCall:
    args: dict[str, object] = {
        "method": "GET",
        "target": "/v1/cluster/shards/2/streams?bucket=b",
        "shard": "",
        "body": b"",
        "now_ms": NOW,
    }
    args.update(kw)
    return verify(SECRET, header, **args)  # type: ignore[arg-type]


def refused(header: str, **kw: object) -> TieredError:
    with pytest.raises(TieredError) as info:
        check(header, **kw)
    assert info.value.code is ErrorCode.UNAUTHORIZED
    return info.value


def test_a_signature_verifies_for_its_own_request_only() -> None:
    header = signed()
    assert check(header) == NodeCall(frozenset())
    assert check(header) == NodeCall(frozenset())  # replayed within the window: the same request, accepted
    refused(header, method="DELETE")
    refused(header, target="/v1/cluster/shards/2/streams?bucket=c")
    refused(header, target="/v1/cluster/shards/3/streams?bucket=b")
    refused(header, shard="1")
    refused(header, body=b"x")
    refused(signed(body=b'{"secret_sha256": "aa"}'), body=b'{"secret_sha256": "bb"}')


def test_marks_are_signed() -> None:
    header = signed(marks=frozenset({UNCOUNTED}))
    call = check(header)
    assert call.uncounted and call.marks == {UNCOUNTED}
    refused(header.replace(f"marks={UNCOUNTED}", "marks="))
    refused(signed().replace("marks=", f"marks={UNCOUNTED}"))
    refused(signed(marks=frozenset({"admin"})))  # validly signed, but no such mark
    assert not check(signed()).uncounted


def test_stale_and_future_timestamps_are_refused() -> None:
    assert check(signed(now_ms=NOW - WINDOW_MS)) == NodeCall(frozenset())
    assert check(signed(now_ms=NOW + WINDOW_MS)) == NodeCall(frozenset())
    assert "stale" in refused(signed(now_ms=NOW - WINDOW_MS - 1)).message
    assert "stale" in refused(signed(now_ms=NOW + WINDOW_MS + 1)).message
    # Moving the timestamp breaks the MAC (checked first: a forged stamp is not "stale", it is invalid).
    forged = signed().replace(f"ts={NOW}", f"ts={NOW + 1}")
    assert "not valid" in refused(forged).message


@pytest.mark.parametrize(
    "header",
    [
        "",
        "v1",
        "Bearer abc",
        "v2 ts=1 nonce=aa marks= sig=" + "0" * 64,
        "v1 ts=x nonce=aa marks= sig=" + "0" * 64,
        "v1 ts=1 nonce= marks= sig=" + "0" * 64,
        "v1 ts=1 nonce=aa marks= sig=00",
        "v1 nonce=aa marks= sig=" + "0" * 64,
        "v1 ts=1 nonce=aa marks= sig=" + "é" * 64,
    ],
)
def test_malformed_headers_are_401_not_errors(header: str) -> None:
    refused(header)


def test_another_secret_does_not_verify() -> None:
    other = sign(bytes(32), "GET", "/x", "", b"", now_ms=NOW, nonce="aa")
    refused(other, target="/x")


def test_the_signer_uses_its_clock_and_fresh_nonces() -> None:
    clock = VirtualClock(NOW)
    signer = NodeSigner(SECRET, clock)
    a = signer.header("PUT", "/v1/admin/tokens/x", "3", b"{}")
    b = signer.header("PUT", "/v1/admin/tokens/x", "3", b"{}")
    assert a != b  # fresh nonces
    assert signer.verify(a, "PUT", "/v1/admin/tokens/x", "3", b"{}") == NodeCall(frozenset())
    clock.advance(WINDOW_MS + 1)
    with pytest.raises(TieredError):
        signer.verify(a, "PUT", "/v1/admin/tokens/x", "3", b"{}")


def test_the_target_is_compared_with_escapes_decoded() -> None:
    assert target_of("/v1/buckets/a%62", "x=%20") == target_of("/v1/buckets/ab", "x= ")
    assert target_of("/p", "") == "/p"


def test_the_node_call_is_set_only_inside_its_block() -> None:
    assert current() is None
    with pytest.raises(TieredError) as info:
        require()
    assert info.value.code is ErrorCode.UNAUTHORIZED
    with node_call(NodeCall(frozenset({UNCOUNTED}))):
        assert require().uncounted
    assert current() is None


# --------------------------------------------------------------------------- the secret object


def test_the_first_node_creates_the_secret_and_the_others_read_it() -> None:
    async def run() -> None:
        store = MemoryCasStore()
        got = await asyncio.gather(*(load_or_create(store) for _ in range(4)))
        assert len(set(got)) == 1 and len(got[0]) == 32
        assert store.history[SECRET_KEY] == [store.objects[SECRET_KEY].data]  # created once
        assert await load_or_create(store) == got[0]

    asyncio.run(run())


def test_a_lost_create_answer_still_yields_the_stored_secret() -> None:
    async def run() -> None:
        store = MemoryCasStore()
        store.inject(Fault.APPLIED_412, SECRET_KEY)
        secret = await load_or_create(store)
        assert decode_secret(store.objects[SECRET_KEY].data) == secret

    asyncio.run(run())


def test_a_damaged_secret_object_is_refused() -> None:
    for data in (b"{}", b"not json", encode_secret(b"short")):
        with pytest.raises(ValueError):
            decode_secret(data)
    assert decode_secret(encode_secret(SECRET)) == SECRET


# --------------------------------------------------------------------------- installing a minted token


def _record(**kw: object) -> TokenIssued:
    args: dict[str, object] = {
        "id": "a" * 20,
        "bucket": "bkt",
        "scope": "write",
        "prefix": None,
        "name": None,
        "created_ms": NOW,
        "expires_ms": None,
        "secret_sha256": digest("s"),
    }
    args.update(kw)
    return TokenIssued(**args)  # type: ignore[arg-type]


def test_an_install_is_idempotent_by_id() -> None:
    state = AuthState()
    buckets = {"bkt": NOW}
    record = _record()
    assert state.decide_install(record, buckets) == [record]
    state.apply(record)
    assert state.decide_install(record, buckets) == []  # the same record again: nothing
    with pytest.raises(TieredError) as info:
        state.decide_install(_record(secret_sha256=digest("other")), buckets)
    assert info.value.code is ErrorCode.BAD_REQUEST
    assert state.tokens["a" * 20].secret_sha256 == digest("s")


@pytest.mark.parametrize(
    ("kw", "code"),
    [
        ({"bucket": "nope"}, ErrorCode.BUCKET_NOT_FOUND),
        ({"scope": "root"}, ErrorCode.BAD_REQUEST),
        ({"prefix": "/x/"}, ErrorCode.BAD_REQUEST),
        ({"secret_sha256": b"short"}, ErrorCode.BAD_REQUEST),
        ({"replaces": "b" * 20}, ErrorCode.BAD_REQUEST),
    ],
)
def test_an_install_refuses_what_an_issue_would(kw: dict[str, object], code: ErrorCode) -> None:
    state = AuthState()
    with pytest.raises(TieredError) as info:
        state.decide_install(_record(**kw), {"bkt": NOW})
    assert info.value.code is code
    assert state.tokens == {}


def test_an_installed_rotation_starts_the_old_tokens_grace() -> None:
    state = AuthState()
    old = _record()
    state.apply(old)
    new = _record(id="c" * 20, secret_sha256=digest("t"), replaces=old.id, replaced_until_ms=NOW + 5000)
    for record in state.decide_install(new, {"bkt": NOW}):
        state.apply(record)
    assert state.tokens[old.id].expires_ms == NOW + 5000
    assert state.tokens[new.id].expires_ms is None
    assert state.decide_install(new, {"bkt": NOW}) == []  # retried: nothing more


# ---------------------------------------------------------------- the operator's secret file


def test_a_configured_secret_file_is_the_secret(tmp_path: Path) -> None:
    from tiered.core.config import Config, ConfigError

    path = tmp_path / "cluster-secret"
    path.write_text("s" * 48 + "\n")
    assert Config(cluster_secret_file=str(path)).cluster_secret() == b"s" * 48
    assert Config().cluster_secret() is None  # no file: the store's secret object
    path.write_text("too short\n")
    with pytest.raises(ConfigError, match="at least 32 characters"):
        Config(cluster_secret_file=str(path)).cluster_secret()
    with pytest.raises(ConfigError, match="cannot read cluster secret file"):
        Config(cluster_secret_file=str(tmp_path / "missing")).cluster_secret()


def test_serve_refuses_to_start_on_an_unreadable_secret_file(tmp_path: Path) -> None:
    run = subprocess.run(
        [sys.executable, "-m", "tiered.cli.main", "serve", "--data-dir", str(tmp_path / "d"),
         "--cluster-secret-file", str(tmp_path / "missing")],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert run.returncode == 2, run.stderr
    assert "tiered: cannot start: cannot read cluster secret file" in run.stderr
