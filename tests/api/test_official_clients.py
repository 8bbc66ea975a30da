"""The official clients work against tiered with a token, unchanged: they only pass ``Authorization``.

* Python: ``durable-streams`` 0.1.0 (PyPI, in the dev extra): create, append,
  catch-up, long-poll and SSE reads with a token; without it, a 401.
* TypeScript: ``@durable-streams/client`` 0.2.7, pinned in
  ``tests/clients/package.json`` and installed once per run into the run's
  temp dir (``tests/support/node_packages.py``). Without node/npm the test skips, except
  under CI (``CI=true``).
"""

from __future__ import annotations

import json
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support import node_packages
from tests.support.auth_support import OPERATOR, AuthServer, bearer
from tests.support.http_helpers import request

pytestmark = pytest.mark.timeout(600)
HERE = Path(__file__).parent.parent / "clients"


@pytest.fixture(scope="module")
def srv(tmp_path_factory: pytest.TempPathFactory) -> Iterator[AuthServer]:
    s = AuthServer(
        tmp_path_factory.mktemp("clients") / "data", "--long-poll-timeout-s", "2", mode="tokens"
    ).start()
    try:
        s.bucket("acme")
        yield s
    finally:
        s.stop()


def test_python_client_with_a_token(srv: AuthServer) -> None:
    from durable_streams import DurableStream, stream

    token = srv.token("acme", "write")["token"]
    headers = bearer(token)
    url = f"{srv.url}/v1/buckets/acme/stream/py/events"
    with DurableStream.create(url, content_type="text/plain", headers=headers, batching=False) as handle:
        handle.append("one,")
        handle.append("two")
        with handle.stream(live=False) as res:
            assert res.read_bytes() == b"one,two"
        with stream(url, headers=headers, live="long-poll", offset="-1") as res:
            appended = threading.Timer(
                0.3, lambda: request("POST", url, {**OPERATOR, "Content-Type": "text/plain"}, b",3")
            )
            appended.start()
            seen = b""
            for chunk in res:
                seen += chunk
                if seen == b"one,two,3":
                    break
            appended.join()
        with stream(url, headers=headers, live="sse", offset="-1") as res:
            appended = threading.Timer(
                0.3, lambda: request("POST", url, {**OPERATOR, "Content-Type": "text/plain"}, b",4")
            )
            appended.start()
            text = ""
            for piece in res.iter_text():
                text += piece
                if text == "one,two,3,4":
                    break
            appended.join()
    with pytest.raises(Exception) as err:
        with stream(url, live=False) as res:
            res.read_bytes()
    assert getattr(err.value, "status", None) == 401
    with pytest.raises(Exception) as err:
        DurableStream(url, headers=bearer(srv.token("acme", "read")["token"]), batching=False).append("x")
    assert getattr(err.value, "status", None) == 403


@pytest.fixture(scope="module")
def typescript_client(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The pinned client installed (once per run) beside ``ts_client.mjs``, which drives it."""
    node_packages.require_node("the TypeScript client")
    return node_packages.install(
        tmp_path_factory,
        HERE,
        ("package.json", "ts_client.mjs"),
        "@durable-streams/client",
        "TIERED_CLIENTS_HOME",
    )


def test_typescript_client_with_a_token(srv: AuthServer, typescript_client: Path) -> None:
    home = typescript_client
    token = srv.token("acme", "write")["token"]
    url = f"{srv.url}/v1/buckets/acme/stream/ts/events"
    started = time.monotonic()
    proc = subprocess.run(
        ["node", "ts_client.mjs", url, token], cwd=home, capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out == {
        "catchUp": "one,two,three,four",
        "long-poll": "one,two,three,four",
        "sse": "one,two,three,four",
        "withoutToken": 401,
        "badToken": 401,
    }, (out, time.monotonic() - started)
    assert token not in proc.stdout + proc.stderr
