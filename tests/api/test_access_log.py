"""The access log: every refused or failed request leaves one structured line that its request id finds.

* Live (granian with text lines, aiohttp with JSON lines; ``--auth tokens``):
  an append refused with 503 ``HOT_TIER_FULL`` and ``X-Request-Id: myreq-3``
  leaves exactly one line with ``myreq-3``, its method, route, bucket,
  status, error code and duration, at WARNING (it left none: docs/operations.md
  told operators to search for it); a 401 and a 404 leave INFO lines; a
  success leaves none (``errors``, the default); no credential, query value
  or header value is ever written.
* ``--access-log all`` writes successes too, ``off`` writes nothing;
  ``access_log`` is a setting like every other (TOML, ``TIERED_ACCESS_LOG``,
  flag) and an unknown mode is refused.
* Units: the formatters render fields (text: `` key=value`` before the
  request id; json: keys that never replace the standard ones), the bucket
  field holds only valid bucket names, the code only an error code.
"""

from __future__ import annotations

import io
import json
import logging
import re
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.http_helpers import request as http
from tests.support.server_process import ServerProcess
from tiered.api.kit.middleware.access_log import AccessLog, bucket_of, error_code
from tiered.api.kit.types import Request, Response
from tiered.core.config import ConfigError, load_config
from tiered.core.logs import REQUEST_ID, configure_logging

pytestmark = pytest.mark.timeout(120)

ADMIN = "adm1n-t0ken-sekrit-41c9"
OPERATOR = {"Authorization": f"Bearer {ADMIN}"}
SECRETS = ("sekrit",)  # every credential, header value and query value the tests send holds this
FIELDS = re.compile(r" (\w+)=(\S+)")


class Server:
    def __init__(self, srv: ServerProcess, log_format: str) -> None:
        self.srv = srv
        self.log_format = log_format

    def lines(self, request_id: str) -> list[dict[str, object]]:
        """The access-log lines of ``request_id``, as dicts (text lines parsed as ``key=value``)."""
        out: list[dict[str, object]] = []
        for line in self.srv.log().splitlines():
            if self.log_format == "json":
                entry = json.loads(line)
                if entry["logger"] == "tiered.access" and entry.get("request_id") == request_id:
                    out.append(entry)
            elif " tiered.access: " in line and line.endswith(f" request_id={request_id}"):
                level = line.split(" ")[2]
                message = line.split(" tiered.access: ", 1)[1].split("=", 1)[0].rsplit(" ", 1)[0]
                entry = {"level": level, "message": message, **dict(FIELDS.findall(line))}
                out.append(entry)
        return out


@pytest.fixture(
    scope="module", params=[("granian", "text"), ("aiohttp", "json")], ids=["granian-text", "aiohttp-json"]
)
def server(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    adapter, log_format = request.param
    srv = ServerProcess(
        tmp_path_factory.mktemp(f"access-{adapter}") / "data",
        "--http-server",
        adapter,
        "--log-format",
        log_format,
        "--auth",
        "tokens",
        "--max-hot-bytes",
        "4096",  # nothing is flushed (below): the hot tier fills at 4 KiB
        "--flush-interval-s",
        "3600",
        "--flush-bytes",
        str(64 * 1024 * 1024),
        env={"TIERED_ADMIN_TOKEN": ADMIN},
    ).start()
    try:
        status, _, body = http(
            "PUT", srv.url + "/v1/stream/full", {**OPERATOR, "Content-Type": "application/octet-stream"}, b""
        )
        assert status == 201, body
        yield Server(srv, log_format)
    finally:
        srv.stop()


def str_fields(entry: dict[str, object]) -> dict[str, str]:
    return {k: str(v) for k, v in entry.items()}


def test_a_refused_append_leaves_one_line_with_its_request_id(server: Server) -> None:
    headers = {**OPERATOR, "Content-Type": "application/octet-stream", "X-Request-Id": "myreq-3"}
    status, response_headers, body = http("POST", server.srv.url + "/v1/stream/full", headers, bytes(5000))
    assert (status, json.loads(body)["error"]["code"]) == (503, "HOT_TIER_FULL")
    assert response_headers["X-Request-Id"] == "myreq-3"
    (line,) = server.lines("myreq-3")
    fields = str_fields(line)
    assert fields["level"] == "WARNING" and fields["message"] == "request failed"
    expected = {
        "method": "POST",
        "route": "append",
        "bucket": "default",
        "status": "503",
        "code": "HOT_TIER_FULL",
    }
    assert {k: fields[k] for k in expected} == expected
    assert float(fields["duration_ms"]) >= 0


def test_refusals_are_logged_and_successes_are_not(server: Server) -> None:
    url = server.srv.url
    status, _, _ = http(
        "GET",
        url + "/v1/stream/full?offset=-1&note=sekrit-query",
        {"Authorization": "Bearer tk_sekrit_x", "X-Request-Id": "denied-1"},
    )
    assert status == 401
    status, _, _ = http(
        "GET", url + "/v1/buckets/acme/stream/nope?offset=sekrit", {**OPERATOR, "X-Request-Id": "missing-1"}
    )
    assert status == 404
    status, _, _ = http("GET", url + "/v1/stream/full?offset=-1", {**OPERATOR, "X-Request-Id": "fine-1"})
    assert status == 200
    (denied,) = server.lines("denied-1")
    expected = {
        "level": "INFO",
        "message": "request refused",
        "method": "GET",
        "route": "read",
        "bucket": "default",
        "status": "401",
        "code": "UNAUTHORIZED",
    }
    assert {k: str_fields(denied).get(k) for k in expected} == expected
    (missing,) = server.lines("missing-1")
    assert {k: str_fields(missing)[k] for k in ("route", "bucket", "status", "code")} == {
        "route": "read",
        "bucket": "acme",
        "status": "404",
        "code": "STREAM_NOT_FOUND",
    }
    assert server.lines("fine-1") == []
    log = server.srv.log()
    for secret in (*SECRETS, ADMIN):
        assert secret not in log


def test_an_unknown_route_and_method_are_labelled_not_echoed(server: Server) -> None:
    status, _, _ = http("GET", server.srv.url + "/sekrit/path?x=sekrit", {"X-Request-Id": "unknown-1"})
    assert status == 404
    (line,) = server.lines("unknown-1")
    fields = str_fields(line)
    assert (fields["route"], fields["status"], fields["code"]) == ("unmatched", "404", "NOT_FOUND")
    assert "bucket" not in fields
    status, _, _ = http("PATCH", server.srv.url + "/v1/buckets", {**OPERATOR, "X-Request-Id": "method-1"})
    assert status == 405
    assert str_fields(server.lines("method-1")[0])["method"] == "PATCH"
    assert "sekrit" not in server.srv.log()


@pytest.mark.parametrize(("mode", "logged"), [("all", {"ok-1", "bad-1"}), ("off", set())])
def test_all_logs_every_request_and_off_none(tmp_path: Path, mode: str, logged: set[str]) -> None:
    srv = ServerProcess(tmp_path / "data", "--access-log", mode).start()
    try:
        assert http("GET", srv.url + "/v1/buckets", {"X-Request-Id": "ok-1"})[0] == 200
        assert http("GET", srv.url + "/v1/stream/none?offset=-1", {"X-Request-Id": "bad-1"})[0] == 404
        access = [line for line in srv.log().splitlines() if " tiered.access: " in line]
        found = {
            rid for rid in ("ok-1", "bad-1") if any(line.endswith(f"request_id={rid}") for line in access)
        }
        assert found == logged, srv.log()[-2000:]
        if mode == "all":
            assert "request served method=GET route=/v1/buckets status=200" in srv.log()
    finally:
        srv.stop()


def test_access_log_is_a_setting_like_every_other(tmp_path: Path) -> None:
    assert load_config(env={}).access_log == "errors"
    assert load_config(env={"TIERED_ACCESS_LOG": "all"}).access_log == "all"
    toml = tmp_path / "t.toml"
    toml.write_text('[tiered]\naccess_log = "off"\n')
    assert load_config(str(toml), env={}).access_log == "off"
    assert load_config(str(toml), env={}, overrides={"access_log": "all"}).access_log == "all"
    with pytest.raises(ConfigError, match="access_log must be one of off, errors, all"):
        load_config(env={"TIERED_ACCESS_LOG": "some"})


# --------------------------------------------------------------------------- units


def _request(method: str, path: str) -> Request:
    async def read() -> bytes:
        return b""

    return Request(method, path, "", {}, read)


@pytest.fixture
def root_logging() -> Iterator[None]:
    """The root logger's handlers and level, and the access logger's level, put back after the test."""
    root, access = logging.getLogger(), logging.getLogger("tiered.access")
    handlers, level, access_level = list(root.handlers), root.level, access.level
    try:
        yield
    finally:
        for handler in list(root.handlers):
            root.removeHandler(handler)
        for handler in handlers:
            root.addHandler(handler)
        root.setLevel(level)
        access.setLevel(access_level)


def test_fields_render_in_both_formats_and_never_replace_standard_keys(root_logging: None) -> None:
    log = logging.getLogger("tiered.access")
    for log_format in ("text", "json"):
        out = io.StringIO()
        configure_logging("error", log_format, out)  # the access log ignores log_level
        token = REQUEST_ID.set("rid-1")
        try:
            fields = {"method": "POST", "status": 503, "message": "forged", "level": "forged"}
            log.warning("request failed", extra={"fields": fields})
        finally:
            REQUEST_ID.reset(token)
        line = out.getvalue().strip()
        if log_format == "text":
            assert line.endswith(
                "WARNING tiered.access: request failed method=POST status=503 message=forged level=forged "
                "request_id=rid-1"
            ), line
        else:
            entry = json.loads(line)
            assert (entry["message"], entry["level"], entry["request_id"]) == (
                "request failed",
                "WARNING",
                "rid-1",
            )
            assert (entry["method"], entry["status"]) == ("POST", 503)
    out = io.StringIO()
    configure_logging("info", "text", out, access_log="off")
    log.warning("request failed", extra={"fields": {}})
    assert out.getvalue() == ""


def test_the_bucket_and_code_fields_hold_only_names_and_codes() -> None:
    assert bucket_of(_request("POST", "/v1/stream/a/b")) == "default"
    assert bucket_of(_request("POST", "/v1/buckets/acme/stream/a")) == "acme"
    assert bucket_of(_request("POST", "/v1/buckets/Not%20A%20Bucket/stream/a")) is None
    assert bucket_of(_request("POST", "/v1/buckets/x/stream/a")) is None  # too short to be a bucket name
    assert bucket_of(_request("GET", "/v1/admin/gc")) is None
    assert (
        error_code(Response(503, {}, b'{"error": {"code": "HOT_TIER_FULL", "message": "x"}}'))
        == "HOT_TIER_FULL"
    )
    assert error_code(Response(400, {}, b'{"error": {"code": "not a code\\nforged=1"}}')) is None
    assert error_code(Response(400, {}, b'{"error": "text"}')) is None
    assert error_code(Response(503, {}, b'{"ready": false}')) is None
    assert error_code(Response(400, {}, b"plain")) is None


def test_methods_outside_http_are_not_echoed(caplog: pytest.LogCaptureFixture) -> None:
    access = AccessLog("errors", lambda: 0.0)
    with caplog.at_level(logging.INFO, logger="tiered.access"):
        access.answered(_request("X" * 300, "/v1/buckets"), Response(405, {}, b""), 0.0)
    (record,) = caplog.records
    assert record.fields["method"] == "OTHER"  # type: ignore[attr-defined]
