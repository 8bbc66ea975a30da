"""The real things the docs show examples of, and how an example is compared with them.

``<!-- docs-test: shape NAME -->`` before a ``json`` or ``text`` block names
one of ``SHAPES``. A scenario (``run_scenario``) drives a real ``tiered serve``
through what the examples show (a usage log line, consumer-group member
views, log and access-log lines, a retention skip) and keeps what it
produced. Then:

* a JSON example must validate against the schema inferred from the real
  samples: the same JSON types, every key the samples always have, no key
  they never have (``infer``, ``validate``);
* a text example of log lines: each line, with its variable parts (times,
  ``key=value`` values, quoted names, offsets, numbers) made wildcards, must
  match a real line whole (``line_pattern``).
"""

from __future__ import annotations

import json
import re
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tests.support.http_helpers import request
from tests.support.server_process import ServerProcess

# --------------------------------------------------------------------------- JSON: schema from samples


def _json_type(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int):
        return "integer"
    if isinstance(value, float):
        return "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, list):
        return "array"
    if isinstance(value, dict):
        return "object"
    raise TypeError(type(value))


@dataclass
class Schema:
    types: set[str] = field(default_factory=set)
    properties: dict[str, Schema] = field(default_factory=dict)
    required: set[str] | None = None  # keys every object sample has
    items: Schema | None = None  # None: no sample had an element here

    def add(self, value: Any) -> None:
        self.types.add(_json_type(value))
        if isinstance(value, dict):
            keys = set(value)
            self.required = keys if self.required is None else self.required & keys
            for key, item in value.items():
                self.properties.setdefault(key, Schema()).add(item)
        elif isinstance(value, list):
            for item in value:
                if self.items is None:
                    self.items = Schema()
                self.items.add(item)


def infer(samples: list[Any]) -> Schema:
    schema = Schema()
    for sample in samples:
        schema.add(sample)
    return schema


def validate(value: Any, schema: Schema, path: str = "$") -> list[str]:
    """Where the example differs from what the real samples are: missing or unknown keys, other types."""
    kind = _json_type(value)
    if kind not in schema.types and not (kind == "integer" and "number" in schema.types):
        return [f"{path}: {kind} here, the real thing has {' or '.join(sorted(schema.types))}"]
    problems: list[str] = []
    if isinstance(value, dict):
        missing = sorted((schema.required or set()) - set(value))
        problems += [f"{path}: the real thing always has {key!r}, the example does not" for key in missing]
        for key, item in value.items():
            if key not in schema.properties:
                problems.append(f"{path}: the real thing never has {key!r}")
            else:
                problems += validate(item, schema.properties[key], f"{path}.{key}")
    elif isinstance(value, list):
        for i, item in enumerate(value):
            if schema.items is None:
                problems.append(f"{path}[{i}]: no real sample had an element here to compare with")
            else:
                problems += validate(item, schema.items, f"{path}[{i}]")
    return problems


# --------------------------------------------------------------------------- log lines as templates

_VARIABLE = re.compile(
    r"(?P<time>\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3})"
    r"|(?P<key>\b[a-z_]+=)\S+"
    r"|'[^']*'"
    r"|\b\d{16}_\d{16}\b"
    r"|\b\d+(?:\.\d+)?\b"
)


def line_pattern(example: str) -> re.Pattern[str]:
    """A regex for a log line shown in the docs: its fixed text literal, its variable parts wildcards."""
    parts: list[str] = []
    pos = 0
    for m in _VARIABLE.finditer(example):
        parts.append(re.escape(example[pos : m.start()]))
        text = m[0]
        if m["time"]:
            parts.append(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}")
        elif m["key"]:
            parts.append(re.escape(m["key"]) + r"\S+")
        elif text.startswith("'"):
            parts.append(r"'[^']*'")
        elif "_" in text:
            parts.append(r"\d{16}_\d{16}")
        else:
            parts.append(r"\d+(?:\.\d+)?")
        pos = m.end()
    parts.append(re.escape(example[pos:]))
    return re.compile("".join(parts))


# --------------------------------------------------------------------------- the scenario


@dataclass
class ScenarioRun:
    log_lines: list[str]
    usage_lines: list[dict[str, Any]]
    member_views: list[dict[str, Any]]

    def json_log_lines(self) -> list[dict[str, Any]]:
        found = []
        for line in self.log_lines:
            try:
                value = json.loads(line)
            except ValueError:
                continue
            if isinstance(value, dict):
                found.append(value)
        return found


TEXT = {"Content-Type": "text/plain"}
JSON = {"Content-Type": "application/json"}
# What the scenario must have logged before it stops (each is what a doc example shows).
EXPECTED_LOG = (
    "retention passed its cursor",
    "retention passed its acked offset",
    "client disconnected",
    "request refused",
    "request failed",
    "GC pass requested",
)


def run_scenario(directory: Path, log_format: str) -> ScenarioRun:
    """Drive a real server through what the docs' examples show; return its log, usage log and member views."""
    token = "docs-scenario-admin-token"
    (directory / "admin-token").write_text(token)
    usage_log = directory / "usage.jsonl"
    srv = ServerProcess(
        directory / "data",
        *("--auth", "tokens", "--admin-token-file", str(directory / "admin-token")),
        *("--log-format", log_format, "--access-log", "errors"),
        *("--usage-log", str(usage_log), "--usage-interval-s", "0.5"),
        *("--flush-interval-s", "3600", "--max-hot-bytes", "65536"),
    )
    srv.start(timeout=90)
    admin = {"Authorization": f"Bearer {token}"}
    base = srv.url
    views: list[dict[str, Any]] = []

    def call(
        method: str, path: str, headers: dict[str, str], body: bytes = b"", ok: tuple[int, ...] = ()
    ) -> Any:
        status, hdrs, raw = request(method, base + path, {**admin, **headers}, body)
        assert status in ok, f"{method} {path}: {status} {raw[:300]!r}"
        return hdrs, (
            json.loads(raw) if raw and hdrs.get("Content-Type", "").startswith("application/json") else raw
        )

    def member(action: str, body: dict[str, Any]) -> dict[str, Any]:
        _, view = call("POST", f"/v1/groups/billing/{action}", JSON, json.dumps(body).encode(), (200,))
        views.append(view)
        return dict(view)

    try:
        # A tenant's usage, and the access log's refusals.
        call("PUT", "/v1/buckets/acme", {}, ok=(201,))
        call("PUT", "/v1/buckets/acme/stream/s", TEXT, ok=(201,))
        call("POST", "/v1/buckets/acme/stream/s", TEXT, b"hello", (204,))
        call("GET", "/v1/buckets/acme/stream/s?offset=-1", {}, ok=(200,))
        assert request("GET", f"{base}/v1/buckets/acme/stream/s?offset=-1")[0] == 401
        with socket.create_connection(("127.0.0.1", srv.port), timeout=10) as conn:
            conn.sendall(
                b"POST /v1/buckets/acme/stream/s HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: text/plain\r\n"
                + f"Authorization: Bearer {token}\r\nContent-Length: 10\r\n\r\nx".encode()
            )  # and gone, 9 bytes short: the access log's "client disconnected"
        call("PUT", "/v1/stream/big", TEXT, ok=(201,))
        call("POST", "/v1/stream/big", {**TEXT, "X-Request-Id": "myreq-3"}, b"x" * 70_000, (503,))
        call("POST", "/v1/admin/gc", {"X-Request-Id": "abc-1"}, ok=(200,))

        # A consumer group whose cursor retention passes, and a second member taking a stream over.
        for name, first in (("a", b""), ("b", b"old\n"), ("c", b"")):
            call("PUT", f"/v1/stream/events/{name}", TEXT, first, (201,))
        hdrs, _ = call("GET", "/v1/stream/events/b?offset=-1", {}, ok=(200,))
        old_end = hdrs["Stream-Next-Offset"]
        call("PUT", "/v1/groups/billing", JSON, b'{"pattern": "events/*"}', (201,))
        one = member("join", {"member": "worker-1", "join_id": "j1"})
        call("POST", "/v1/stream/events/b", TEXT, b"kept\n", (204,))
        call(
            "POST",
            "/v1/admin/retain/default/events/b",
            JSON,
            json.dumps({"offset": old_end}).encode(),
            (200, 204),
        )
        beat = {"member": "worker-1", "incarnation": one["incarnation"], "generation": one["generation"]}
        member("heartbeat", beat)
        member("join", {"member": "worker-2", "join_id": "j2"})
        member("heartbeat", beat)

        # A subscription link whose acked offset retention passes.
        call("PUT", "/v1/stream/wakes", TEXT, ok=(201,))
        call("PUT", "/v1/stream/subs/abc", TEXT, ok=(201,))
        subscription = {"type": "pull-wake", "streams": ["subs/abc"], "wake_stream": "wakes"}
        call("PUT", "/v1/stream/__ds/subscriptions/sub-1", JSON, json.dumps(subscription).encode(), (201,))
        hdrs, _ = call("POST", "/v1/stream/subs/abc", TEXT, b"y" * 42, (204,))
        call("POST", "/v1/stream/subs/abc", TEXT, b"z" * 42, (204,))
        body = json.dumps({"offset": hdrs["Stream-Next-Offset"]}).encode()
        call("POST", "/v1/admin/retain/default/subs/abc", JSON, body, (200, 204))

        deadline = time.monotonic() + 60
        while True:
            log = srv.log_path.read_text(errors="replace")
            usage = [json.loads(line) for line in _lines(usage_log)]
            missing = [text for text in EXPECTED_LOG if text not in log]
            if not missing and any(u["bucket"] == "acme" and u["appended_bytes"] for u in usage):
                break
            assert time.monotonic() < deadline, (
                f"the scenario did not log {missing} within 60 s:\n{log[-4000:]}"
            )
            time.sleep(0.1)
    finally:
        assert srv.stop() == 0, srv.log()
    return ScenarioRun(
        srv.log_path.read_text(errors="replace").splitlines(),
        [json.loads(line) for line in _lines(usage_log)],
        views,
    )


def _lines(path: Path) -> list[str]:
    try:
        return [line for line in path.read_text().splitlines() if line.strip()]
    except FileNotFoundError:
        return []


class RealThings:
    """The scenario, run at most once per log format per session."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.runs: dict[str, ScenarioRun] = {}

    def run(self, log_format: str) -> ScenarioRun:
        if log_format not in self.runs:
            where = self.directory / log_format
            where.mkdir(parents=True, exist_ok=True)
            self.runs[log_format] = run_scenario(where, log_format)
        return self.runs[log_format]


# --------------------------------------------------------------------------- the shapes


def _json_samples(real: RealThings, example: Any) -> list[Any]:
    return [
        line
        for line in real.run("json").json_log_lines()
        if line.get("logger") == example.get("logger") and line.get("message") == example.get("message")
    ]


@dataclass(frozen=True)
class ShapeOf:
    what: str
    kind: str  # "json": one JSON value; "lines": log lines
    samples: Callable[[RealThings, Any], list[Any]]


SHAPES: dict[str, ShapeOf] = {
    "usage-log-line": ShapeOf("a line of --usage-log", "json", lambda real, _: real.run("text").usage_lines),
    "group-member-view": ShapeOf(
        "a consumer group's member view (join and heartbeat answers)",
        "json",
        lambda real, _: real.run("text").member_views,
    ),
    "json-log-line": ShapeOf(
        "a log line of --log-format json, compared with real lines of the same logger and message",
        "json",
        _json_samples,
    ),
    "text-log-lines": ShapeOf(
        "log lines of --log-format text", "lines", lambda real, _: real.run("text").log_lines
    ),
}


def example_problems(name: str, text: str, real: RealThings) -> list[str]:
    """How the example differs from the real thing it names."""
    if name not in SHAPES:
        return [f"unknown shape {name!r}; known: {', '.join(sorted(SHAPES))}"]
    shape = SHAPES[name]
    if shape.kind == "json":
        example = json.loads(text)
        samples = shape.samples(real, example)
        if not samples:
            return [f"the scenario produced no {shape.what} to compare with"]
        return validate(example, infer(samples))
    lines = shape.samples(real, None)
    problems = []
    for shown in (line for line in text.splitlines() if line.strip()):
        pattern = line_pattern(shown)
        if not any(pattern.fullmatch(line) for line in lines):
            problems.append(
                f"no real log line has this form:\n    {shown}\n  (as a pattern: {pattern.pattern})"
            )
    return problems
