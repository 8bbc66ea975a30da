"""Log lines and request ids (``tiered.core.logs``, ``tiered.api.kit.middleware.request_id``).

* ``--log-format json`` on a live server (both HTTP adapters): every line the
  process writes is one JSON object with timestamp, level, logger and
  message; each line logged while a request is handled carries that request's
  id, the one the client sent when it is a plain token, a generated one
  otherwise, and the response echoes it (errors included); lines logged
  outside requests carry none; the admin token is never written.
* ``--log-format text`` appends `` request_id=<id>`` to such lines.
* The JSON formatter keeps a message holding a newline on one line, and
  carries tracebacks; an unknown format is refused at startup.
"""

from __future__ import annotations

import io
import json
import logging
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.http_helpers import request
from tests.support.server_process import ServerProcess
from tiered.core.logs import REQUEST_ID, configure_logging

pytestmark = pytest.mark.timeout(120)

TOKEN = "adm1n-t0ken-never-logged-7f3a9c"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
GENERATED = re.compile(r"[0-9a-f]{12}-[0-9]+")
TIMESTAMP = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z")


def gc_with_id(srv: ServerProcess, request_id: str | None) -> str:
    """``POST /v1/admin/gc`` (which logs two lines) sending ``request_id``; the id the response names."""
    headers = dict(AUTH)
    if request_id is not None:
        headers["X-Request-Id"] = request_id
    status, response_headers, body = request("POST", srv.url + "/v1/admin/gc", headers)
    assert status == 200, body
    echoed = response_headers["X-Request-Id"]
    assert echoed is not None
    return echoed


def json_lines(text: str) -> list[dict[str, object]]:
    entries = []
    for line in text.splitlines():
        entry = json.loads(line)  # every line: one JSON object, nothing else
        assert isinstance(entry, dict), line
        assert {"timestamp", "level", "logger", "message"} <= set(entry), line
        assert TIMESTAMP.fullmatch(str(entry["timestamp"])), line
        entries.append(entry)
    return entries


@pytest.mark.parametrize("adapter", ["granian", "aiohttp"])
def test_json_lines_carry_the_id_of_the_request_that_caused_them(tmp_path: Path, adapter: str) -> None:
    srv = ServerProcess(
        tmp_path / "data",
        "--log-format",
        "json",
        "--http-server",
        adapter,
        env={"TIERED_ADMIN_TOKEN": TOKEN},
    ).start()
    try:
        assert gc_with_id(srv, "client-id_1.a:b=c+d/e") == "client-id_1.a:b=c+d/e"
        kept_long = "k" * 128
        assert gc_with_id(srv, kept_long) == kept_long
        replaced = [
            gc_with_id(srv, bad)
            for bad in ("has space", "k" * 129, "semi;colon", 'quote"d', "")  # not plain tokens
        ]
        none_sent = gc_with_id(srv, None)
        generated = [*replaced, none_sent]
        for request_id in generated:
            assert GENERATED.fullmatch(request_id), request_id
        assert len(set(generated)) == len(generated)  # one id per request

        # Refusals echo the id too (the id layer is outside the error mapper and the admin guard).
        status, headers, _ = request("GET", srv.url + "/v1/admin/gc", {"X-Request-Id": "refused-1"})
        assert status == 401 and headers["X-Request-Id"] == "refused-1"
        status, headers, _ = request("GET", srv.url + "/no/such/route", {"X-Request-Id": "refused-2"})
        assert status == 404 and headers["X-Request-Id"] == "refused-2"
    finally:
        assert srv.stop() == 0

    text = srv.log_path.read_text()
    assert TOKEN not in text
    entries = json_lines(text)
    by_id: dict[object, list[str]] = {}
    for entry in entries:
        by_id.setdefault(entry.get("request_id"), []).append(str(entry["message"]))
    gc_lines = [
        "admin: GC pass requested",
        "admin: GC pass done: 0 objects deleted, 0 errors, 0 integrity errors",
    ]
    for request_id in ["client-id_1.a:b=c+d/e", kept_long, *generated]:
        assert by_id.pop(request_id) == gc_lines, request_id
    outside = by_id.pop(None)  # startup and shutdown: no request
    assert any(m.startswith("tiered listening on http://127.0.0.1:") for m in outside)
    assert any(m.startswith("journal recovered") for m in outside)
    assert "shutting down" in outside
    assert not any(m.startswith("admin:") for m in outside)
    # Each refusal left its access-log line (``tiered.api.kit.middleware.access_log``), under the id the client sent.
    assert by_id.pop("refused-1") == ["request refused"]
    assert by_id.pop("refused-2") == ["request refused"]
    assert by_id == {}, by_id  # no line names any other id


def test_text_lines_end_with_the_request_id(tmp_path: Path) -> None:
    srv = ServerProcess(tmp_path / "data", env={"TIERED_ADMIN_TOKEN": TOKEN}).start()
    try:
        gc_with_id(srv, "text-id-7")
    finally:
        assert srv.stop() == 0
    lines = srv.log_path.read_text().splitlines()
    requested = [line for line in lines if " tiered.api.routes.admin: admin: GC pass requested" in line]
    assert len(requested) == 1 and requested[0].endswith(" request_id=text-id-7"), lines
    listening = [line for line in lines if "tiered listening on" in line]
    assert len(listening) == 1 and "request_id=" not in listening[0]
    assert TOKEN not in "\n".join(lines)


@pytest.fixture
def captured() -> Iterator[io.StringIO]:
    """JSON logging of the root logger into a buffer; the previous handlers and level put back after."""
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    out = io.StringIO()
    configure_logging("info", "json", out)
    try:
        yield out
    finally:
        for handler in list(root.handlers):
            root.removeHandler(handler)
        for handler in handlers:
            root.addHandler(handler)
        root.setLevel(level)


def test_json_formatter_keeps_one_line_per_record_and_carries_tracebacks(captured: io.StringIO) -> None:
    log = logging.getLogger("tiered.test_logs")
    token = REQUEST_ID.set("unit-1")
    try:
        log.info("two\nlines %s", "forged\n{}")
        try:
            raise ValueError("boom")
        except ValueError:
            log.exception("it failed")
    finally:
        REQUEST_ID.reset(token)
    log.debug("below the level")
    log.warning("outside any request")

    first, second, third = json_lines(captured.getvalue())  # three records, three lines
    assert first["message"] == "two\nlines forged\n{}"
    assert first["request_id"] == "unit-1" and first["level"] == "INFO"
    assert first["logger"] == "tiered.test_logs"
    assert second["message"] == "it failed" and second["level"] == "ERROR"
    assert "ValueError: boom" in str(second["exception"]) and second["request_id"] == "unit-1"
    assert third["message"] == "outside any request" and "request_id" not in third


def test_unknown_log_format_is_refused(tmp_path: Path) -> None:
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "tiered.cli",
            "serve",
            "--data-dir",
            str(tmp_path / "d"),
            "--log-format",
            "yaml",
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 2
    assert "log_format must be 'text' or 'json'" in result.stderr
    assert not (tmp_path / "d").exists()
