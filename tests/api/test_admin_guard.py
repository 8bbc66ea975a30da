"""With auth on, the admin API needs the admin token wherever the server listens; an open server says so.

* The rule (``Config.admin_open_without_token``, ``AdminGuard``): without an
  admin token, admin routes are open only with auth off (``none`` or unset) on
  a loopback address. With ``--auth tokens`` or ``jwt`` on loopback and no
  token they are 403 ``ADMIN_DISABLED`` (they were open: anyone reaching the
  port, through any local proxy or sidecar, could mint a token for any
  bucket), and the start-up log says how to set one.
* ``--auth none`` off loopback logs that the data plane is open
  (``Config.exposure_warnings``, logged by ``serve``; checked on the
  function, so no test binds a non-loopback address).
* Live, on both HTTP adapters (single server) and in cluster mode (one node:
  the node's own routes, the cluster token routes and the shard engines'
  admin routes): every admin route answers 403 with or without a bearer
  token, nothing changes, and the data plane still asks for credentials.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.cluster_support import cluster_env, start_node, unique_prefix
from tests.support.http_helpers import request
from tests.support.s3_server import S3Endpoint
from tests.support.server_process import ServerProcess
from tiered.cli.serve import warn_exposure
from tiered.core.config import Config

pytestmark = pytest.mark.timeout(120)

#: (method, path, body) of admin routes a single server and a cluster node both serve.
ADMIN_CALLS = [
    ("POST", "/v1/admin/tokens", {"bucket": "default", "scope": "admin"}),
    ("GET", "/v1/admin/tokens", None),
    ("PUT", "/v1/admin/access/default", {"public_read": True}),
    ("PUT", "/v1/admin/quotas/default", {"max_streams": 1}),
    ("GET", "/v1/admin/usage", None),
    ("POST", "/v1/admin/gc", None),
    ("PUT", "/v1/admin/retention/default", {"max_age_s": 1}),
    ("DELETE", "/v1/buckets/default", None),
    ("GET", "/metrics", None),
]
ADMIN_WARNING = "no admin token is configured (--auth tokens)"


@pytest.mark.parametrize(
    ("auth", "host", "open_without_token"),
    [
        ("", "127.0.0.1", True),
        ("none", "127.0.0.1", True),
        ("none", "localhost", True),
        ("none", "::1", True),
        ("tokens", "127.0.0.1", False),
        ("jwt", "127.0.0.1", False),
        ("tokens", "localhost", False),
        ("none", "0.0.0.0", False),
        ("tokens", "0.0.0.0", False),
        ("", "10.1.2.3", False),
    ],
)
def test_admin_routes_are_open_without_a_token_only_with_auth_off_on_loopback(
    auth: str, host: str, open_without_token: bool
) -> None:
    assert Config(host=host, auth=auth).admin_open_without_token is open_without_token


def test_start_up_warnings_name_what_is_open_and_how_to_close_it() -> None:
    open_plane = Config(host="0.0.0.0", auth="none").exposure_warnings(admin_token_configured=True)
    assert len(open_plane) == 1 and "the data plane is open" in open_plane[0] and "0.0.0.0" in open_plane[0]
    both = Config(host="0.0.0.0", auth="none").exposure_warnings(admin_token_configured=False)
    assert len(both) == 2 and "--admin-token-file" in both[1]
    admin = Config(host="127.0.0.1", auth="jwt").exposure_warnings(admin_token_configured=False)
    assert len(admin) == 1 and "no admin token is configured (--auth jwt)" in admin[0]
    assert "403" in admin[0] and "TIERED_ADMIN_TOKEN" in admin[0]
    assert Config(host="127.0.0.1", auth="tokens").exposure_warnings(admin_token_configured=True) == []
    assert Config(host="127.0.0.1", auth="none").exposure_warnings(admin_token_configured=False) == []
    assert Config(host="127.0.0.1").exposure_warnings(admin_token_configured=False) == []


def test_serve_logs_the_open_data_plane_as_a_warning(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("TIERED_ADMIN_TOKEN", raising=False)
    with caplog.at_level(logging.WARNING, logger="tiered.cli.serve"):
        warn_exposure(Config(host="0.0.0.0", auth="none"))
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert any("the data plane is open" in w for w in warnings), warnings


def no_token_env() -> dict[str, str]:
    assert "TIERED_ADMIN_TOKEN" not in os.environ
    return {}


def assert_admin_refused(url: str) -> None:
    for method, path, body in ADMIN_CALLS:
        data = json.dumps(body).encode() if body is not None else b""
        for headers in ({}, {"Authorization": "Bearer anything"}):
            status, _, raw = request(
                method, url + path, {"Content-Type": "application/json", **headers}, data
            )
            assert status == 403, (method, path, status, raw[:300])
            assert json.loads(raw)["error"]["code"] == "ADMIN_DISABLED", (method, path)
            assert "--admin-token-file" in json.loads(raw)["error"]["message"]


@pytest.fixture(params=["granian", "aiohttp"])
def single(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[ServerProcess]:
    srv = ServerProcess(
        tmp_path / "data", "--auth", "tokens", "--http-server", request.param, env=no_token_env()
    ).start()
    try:
        yield srv
    finally:
        srv.stop()


def test_auth_on_without_an_admin_token_refuses_every_admin_route_on_loopback(single: ServerProcess) -> None:
    assert_admin_refused(single.url)
    # Nothing changed: the default bucket is still there, with no token and no public read.
    assert request("GET", single.url + "/v1/stream/anything?offset=-1")[0] == 401
    assert request("GET", single.url + "/v1/buckets")[0] == 401
    assert request("GET", single.url + "/healthz")[0] == 200
    log = single.log()
    assert ADMIN_WARNING in log and "--admin-token-file" in log, log[-2000:]


def test_auth_none_on_loopback_keeps_the_development_default(tmp_path: Path) -> None:
    srv = ServerProcess(tmp_path / "data", "--auth", "none", env=no_token_env()).start()
    try:
        status, _, raw = request("GET", srv.url + "/v1/admin/gc")
        assert status == 200, raw
        assert request("GET", srv.url + "/metrics")[0] == 200
        assert "WARNING" not in srv.log()
    finally:
        srv.stop()


@pytest.fixture
def cluster_node(moto_s3: S3Endpoint, tmp_path: Path) -> Iterator[ServerProcess]:
    env = cluster_env()
    assert "TIERED_ADMIN_TOKEN" not in env
    node = start_node(
        tmp_path, moto_s3, unique_prefix("admin-guard"), "n1", env=env, shards=4, ttl_s=4.0, extra=("--auth", "tokens")
    )  # fmt: skip
    try:
        yield node
    finally:
        node.stop()


def test_cluster_mode_with_auth_on_and_no_admin_token_refuses_every_admin_route(
    cluster_node: ServerProcess,
) -> None:
    assert_admin_refused(cluster_node.url)
    assert request("GET", cluster_node.url + "/v1/stream/anything?offset=-1")[0] == 401
    log = cluster_node.log()
    assert ADMIN_WARNING in log
    # Cluster mode has the access log too: each refusal left its line.
    assert log.count("tiered.access: request refused") >= 2 * len(ADMIN_CALLS) + 1
    assert "route=/v1/admin/tokens status=403 code=ADMIN_DISABLED" in log
