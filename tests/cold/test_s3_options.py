"""The S3 store options as an operator sets them, and the conditional-write probe at start-up.

* ``s3_addressing_style``, ``s3_checksum_mode``, ``s3_ca_bundle`` and
  ``s3_conditional_writes``: defaults, refusals of bad values, the deprecated
  ``s3_path_style`` folded in, and that they reach the store.
* ``tiered serve`` probes the store before claiming its prefix: against a store
  that ignores ``If-None-Match``/``If-Match`` (moto behind a WSGI layer that drops
  those headers, as some proxies and old S3-compatible servers do) it refuses to
  start, says why and what the way out is, and leaves nothing behind; with
  ``s3_conditional_writes = "off"`` it starts, and says that it is unsafe.
* Over HTTPS with a private CA the store is only reachable with ``--s3-ca-bundle``.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import certifi
import pytest
from moto.moto_server.werkzeug_app import DomainDispatcherApplication, create_backend_app
from werkzeug.serving import make_server

from tests.support.http_helpers import request
from tests.support.s3_backends import S3Backend
from tests.support.s3_server import S3Endpoint
from tests.support.server_process import ServerProcess
from tiered.cold.objects.s3 import S3Store
from tiered.core.config import ConfigError, load_config
from tiered.engine.engine import open_store

pytestmark = pytest.mark.timeout(120)


# --------------------------------------------------------------------------- settings


def test_defaults_are_safe_and_automatic() -> None:
    config = load_config(env={})
    assert config.s3_conditional_writes == "probe"
    assert (config.s3_addressing_style, config.s3_addressing) == ("auto", "auto")
    assert (config.s3_checksum_mode, config.s3_ca_bundle) == ("auto", "")
    assert config.deprecations() == []


@pytest.mark.parametrize(
    ("setting", "value", "message"),
    [
        ("s3_addressing_style", "dns", "s3_addressing_style must be one of auto, path, virtual"),
        ("s3_checksum_mode", "always", "s3_checksum_mode must be one of auto, when_supported, when_required"),
        ("s3_conditional_writes", "trust", "s3_conditional_writes must be one of probe, off"),
        ("s3_ca_bundle", "/no/such/ca.pem", "s3_ca_bundle: no such file: /no/such/ca.pem"),
    ],
)
def test_bad_values_are_refused_by_name(setting: str, value: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        load_config(env={f"TIERED_{setting.upper()}": value})


def test_deprecated_path_style_still_works_and_says_what_replaces_it() -> None:
    config = load_config(env={"TIERED_S3_PATH_STYLE": "true"})
    assert config.s3_addressing == "path"
    assert config.deprecations() == [
        "s3_path_style is deprecated: use s3_addressing_style = 'path' (--s3-addressing-style path)"
    ]
    assert load_config(env={"TIERED_S3_PATH_STYLE": "true", "TIERED_S3_ADDRESSING_STYLE": "path"})
    with pytest.raises(ConfigError, match="s3_path_style = true contradicts s3_addressing_style = 'virtual'"):
        load_config(env={"TIERED_S3_PATH_STYLE": "true", "TIERED_S3_ADDRESSING_STYLE": "virtual"})


def test_options_reach_the_store(moto_s3: S3Endpoint, tmp_path: Path) -> None:
    ca = certifi.where()  # a real CA file (the client loads it even for plain HTTP)
    overrides: dict[str, Any] = {
        "data_dir": str(tmp_path / "data"),
        "cold_store": "s3",
        "s3_bucket": moto_s3.bucket,
        "s3_prefix": "options",
        "s3_endpoint": moto_s3.url,
        "s3_region": moto_s3.region,
    }

    async def main() -> None:
        auto = await open_store(load_config(env={}, overrides=overrides), read_only=False, probe=False)
        assert isinstance(auto, S3Store)
        assert (auto.addressing_style, auto.checksum_mode, auto.conditional_writes) == (
            "auto",
            "when_required",  # auto, with an endpoint: what S3-compatible stores take
            None,
        )
        await auto.close()
        explicit = {
            **overrides,
            "s3_addressing_style": "path",
            "s3_checksum_mode": "when_supported",
            "s3_ca_bundle": ca,
        }
        store = await open_store(load_config(env={}, overrides=explicit), read_only=False, probe=True)
        assert isinstance(store, S3Store)
        assert (store.addressing_style, store.checksum_mode) == ("path", "when_supported")
        assert store._ca_bundle == ca
        assert store.conditional_writes is not None and store.conditional_writes.if_none_match
        assert [info.key async for info in store.list()] == []  # the probe object is gone
        await store.close()

    asyncio.run(main())


# --------------------------------------------------------------------------- the probe at start-up


@pytest.fixture
def ignoring_store(moto_s3: S3Endpoint) -> Iterator[str]:
    """moto (the same buckets as ``moto_s3``) behind a layer that drops the conditional headers."""
    app = DomainDispatcherApplication(create_backend_app)

    def drop_conditions(environ: dict[str, Any], start_response: Any) -> Any:
        environ.pop("HTTP_IF_NONE_MATCH", None)
        environ.pop("HTTP_IF_MATCH", None)
        return app(environ, start_response)

    server = make_server("127.0.0.1", 0, drop_conditions, threaded=True)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_port}"
    finally:
        server.shutdown()
        thread.join(10)


def _store_args(backend: S3Backend, endpoint: str) -> list[str]:
    """The backend's flags with another endpoint in front of the same buckets."""
    args = backend.serve_args()
    args[args.index("--s3-endpoint") + 1] = endpoint
    return args


@pytest.mark.parametrize("s3_backend", ["moto"], indirect=True)
def test_serve_refuses_a_store_that_ignores_conditional_writes(
    tmp_path: Path, ignoring_store: str, s3_backend: S3Backend
) -> None:
    srv = ServerProcess(tmp_path / "data", *_store_args(s3_backend, ignoring_store), env=s3_backend.env)
    with pytest.raises(RuntimeError, match="exited with 1"):
        srv.start()
    log = srv.log()
    assert "cannot start: the object store does not enforce conditional writes" in log, log
    assert "ignored If-None-Match: * and overwrote an existing object" in log
    assert "s3_conditional_writes = 'off'" in log and "Traceback" not in log
    # The probe object is deleted, and no claim was made on a store that cannot keep it.
    assert s3_backend.keys() == []


@pytest.mark.parametrize("s3_backend", ["moto"], indirect=True)
def test_conditional_writes_off_starts_and_says_it_is_unsafe(
    tmp_path: Path, ignoring_store: str, s3_backend: S3Backend
) -> None:
    args = _store_args(s3_backend, ignoring_store)
    at = args.index("--s3-addressing-style")
    args[at : at + 2] = ["--s3-path-style", "true"]  # deprecated, still honoured
    srv = ServerProcess(tmp_path / "data", *args, "--s3-conditional-writes", "off", env=s3_backend.env)
    srv.start()
    try:
        assert request("PUT", srv.url + "/v1/stream/s", {"Content-Type": "text/plain"}, b"x")[0] == 201
    finally:
        assert srv.stop() == 0
    log = srv.log()
    assert "s3_conditional_writes = 'off': the object store's conditional writes are not checked" in log
    assert "s3_path_style is deprecated: use s3_addressing_style = 'path'" in log
    assert s3_backend.keys() == ["_tiered/claim.json"]


@pytest.mark.parametrize("s3_backend", ["ceph-https"], indirect=True)
def test_https_with_a_private_ca_needs_the_ca_bundle(tmp_path: Path, s3_backend: S3Backend) -> None:
    args = s3_backend.serve_args()
    at = args.index("--s3-ca-bundle")
    without = args[:at] + args[at + 2 :]
    srv = ServerProcess(tmp_path / "data", *without, env=s3_backend.env)
    with pytest.raises(RuntimeError, match="exited with 1"):
        srv.start(timeout=60)
    assert "cannot start" in srv.log() and "CERTIFICATE_VERIFY_FAILED" in srv.log(), srv.log()
    srv = ServerProcess(tmp_path / "data", *args, env=s3_backend.env).start()
    try:
        assert request("PUT", srv.url + "/v1/stream/s", {"Content-Type": "text/plain"}, b"x")[0] == 201
    finally:
        assert srv.stop() == 0
