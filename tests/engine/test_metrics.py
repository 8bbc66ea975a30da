"""Metrics: what ``/metrics`` exposes, parsed by prometheus_client's own parser, and who relies on it.

* A live ``tiered serve`` (both HTTP adapters): the scrape parses; the latency
  histograms move by exactly the work done (appends, journal syncs, flush
  passes, object-store requests by operation, GC passes); every histogram is
  well formed (cumulative buckets, ``+Inf`` = count).
* ``tiered_http_requests_total{route,status}``: many distinct stream paths,
  buckets and junk URLs give a handful of route labels, never a path.
* ``tiered_gc_errors_total`` counts failed passes, the admin API's included.
* Every metric name ``terraform/monitoring.tf``, the CloudWatch agent's
  template and the docs use exists (names checked against a scrape), and the
  ``route`` value the append alarms filter on is the one appends get.
"""

from __future__ import annotations

import asyncio
import json
import re
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import hcl2
import pytest

from tests.support.auth_support import OPERATOR, AuthServer, bearer
from tests.support.deadlines import scaled
from tests.support.gc_support import ControlledStore, HttpHarness, VirtualClock, make_config
from tests.support.http_helpers import request
from tests.support.metrics_helpers import families, samples, scrape, scrape_text
from tests.support.server_process import ServerProcess
from tiered.gc.context import GcContext, GcPass

pytestmark = pytest.mark.timeout(120)

ROOT = Path(__file__).resolve().parent.parent.parent
OCTET = {"Content-Type": "application/octet-stream"}
HISTOGRAMS = (
    "tiered_append_seconds",
    "tiered_fsync_seconds",
    "tiered_store_request_seconds",
    "tiered_cold_flush_seconds",
    "tiered_gc_pass_seconds",
)
METRIC_NAME = re.compile(r"\btiered_[a-z0-9_]+")


def wait_for(cond: Callable[[], bool], what: str, timeout: float = 15.0) -> None:
    deadline = time.monotonic() + scaled(timeout)
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.05)


def delta(after: dict[str, float], before: dict[str, float], key: str) -> float:
    return after.get(key, 0.0) - before.get(key, 0.0)


def check_histograms(text: str) -> None:
    """Every histogram child: buckets cumulative, ``+Inf`` equal to ``_count``, a sum that is not negative."""
    for name in HISTOGRAMS:
        family = families(text)[name]
        assert family.type == "histogram", name
        children: dict[tuple[tuple[str, str], ...], dict[str, Any]] = {}
        for s in family.samples:
            labels = tuple(sorted((k, v) for k, v in s.labels.items() if k != "le"))
            child = children.setdefault(labels, {"buckets": []})
            if s.name.endswith("_bucket"):
                child["buckets"].append((float(s.labels["le"]), s.value))
            else:
                child[s.name[len(name) :]] = s.value
        assert children, name
        for labels, child in children.items():
            buckets = sorted(child["buckets"])
            counts = [c for _, c in buckets]
            assert counts == sorted(counts), (name, labels)
            assert buckets[-1] == (float("inf"), child["_count"]), (name, labels)
            assert child["_sum"] >= 0, (name, labels)


# --------------------------------------------------------------------------- a live server


@pytest.mark.parametrize("adapter", ["granian", "aiohttp"])
def test_histograms_move_with_appends_syncs_flushes_store_calls_and_gc(tmp_path: Path, adapter: str) -> None:
    srv = ServerProcess(
        tmp_path / "data",
        "--http-server",
        adapter,
        "--flush-interval-s",
        "0.1",
        "--hot-retention-s",
        "0",
        "--gc-interval-s",
        "3600",
        "--gc-grace-s",
        "0",
    ).start()
    try:
        before = scrape(srv)
        check_histograms(scrape_text(srv))
        assert request("PUT", srv.url + "/v1/stream/m", OCTET)[0] == 201
        for i in range(5):
            assert request("POST", srv.url + "/v1/stream/m", OCTET, f"record {i};".encode())[0] == 204
        appended = scrape(srv)
        assert delta(appended, before, "tiered_append_seconds_count") == 5
        assert delta(appended, before, "tiered_append_seconds_sum") > 0
        # Each acknowledged append waited for a journal batch's write + fdatasync.
        assert delta(appended, before, "tiered_fsync_seconds_count") >= 1
        assert delta(appended, before, 'tiered_http_requests_total{route="append",status="204"}') == 5
        assert delta(appended, before, 'tiered_http_requests_total{route="create",status="201"}') == 1

        wait_for(lambda: scrape(srv)["tiered_hot_bytes"] == 0, "the stream to move cold")
        # The pass is timed when it ends, a moment after its commit moved the bytes cold.
        wait_for(
            lambda: delta(scrape(srv), before, "tiered_cold_flush_seconds_count") >= 1,
            "the flush pass's timing",
        )
        flushed = scrape(srv)
        objects = flushed["tiered_cold_puts_total"]  # one, unless a pass ran between two appends
        assert objects >= 1 and flushed["tiered_cold_objects"] == objects
        assert delta(flushed, before, "tiered_cold_flush_seconds_count") == objects  # idle passes: not timed
        assert delta(flushed, before, 'tiered_store_request_seconds_count{operation="put"}') == objects
        assert flushed['tiered_store_request_seconds_count{operation="head"}'] >= 1  # the store probe

        status, _, body = request("GET", srv.url + "/v1/stream/m?offset=-1")
        assert status == 200 and body == b"".join(f"record {i};".encode() for i in range(5))
        read = scrape(srv)
        assert delta(read, flushed, 'tiered_store_request_seconds_count{operation="get"}') >= 1

        status, _, body = request("POST", srv.url + "/v1/admin/gc?dry_run=true")
        assert status == 200
        dry = scrape(srv)
        assert delta(dry, read, "tiered_gc_pass_seconds_count") == 0  # dry runs are not timed
        assert request("DELETE", srv.url + "/v1/stream/m")[0] == 204
        status, _, body = request("POST", srv.url + "/v1/admin/gc")
        assert status == 200 and json.loads(body)["objects_deleted"] == objects
        collected = scrape(srv)
        assert delta(collected, dry, "tiered_gc_pass_seconds_count") == 1
        # The pass reconciled: one listing of the bucket.
        assert delta(collected, dry, 'tiered_store_request_seconds_count{operation="list"}') == 1
        assert delta(collected, dry, 'tiered_store_request_seconds_count{operation="delete_many"}') == 1
        assert collected["tiered_gc_objects_deleted_total"] == objects
        assert collected["tiered_gc_errors_total"] == 0
        check_histograms(scrape_text(srv))
    finally:
        srv.stop()


def test_route_labels_stay_few_whatever_paths_clients_send(tmp_path: Path) -> None:
    srv = ServerProcess(tmp_path / "data").start()
    try:
        names = [f"tenant-{i}/device-{i * 7919}" for i in range(40)]
        assert request("PUT", srv.url + "/v1/buckets/fleet")[0] == 201
        for i, name in enumerate(names):
            base = srv.url + ("/v1/stream/" if i % 2 else "/v1/buckets/fleet/stream/") + name
            assert request("PUT", base, OCTET)[0] == 201
            assert request("POST", base, OCTET, b"x")[0] == 204
            assert request("GET", base + "?offset=-1")[0] == 200
            assert request("HEAD", base)[0] == 200
            assert request("GET", base + f"-missing-{i}?offset=-1")[0] == 404
            assert request("PATCH", base)[0] == 405
            assert request("GET", srv.url + f"/no/such/route/{name}")[0] == 404
            assert request("OPTIONS", base)[0] == 204
        m = scrape(srv)
        routes = {s.labels["route"] for s in families(scrape_text(srv))["tiered_http_requests"].samples}
        assert routes == {
            "create",
            "append",
            "read",
            "head",
            "/v1/stream/{path...}",  # the PATCHes: a method no stream operation has
            "/v1/buckets/{bucket}/stream/{path...}",
            "/v1/buckets/{bucket}",
            "unmatched",
            "preflight",
            "/metrics",
            "/healthz",  # ServerProcess waits for it
        }
        assert m['tiered_http_requests_total{route="append",status="204"}'] == 40
        assert m['tiered_http_requests_total{route="read",status="404"}'] == 40
        assert m['tiered_http_requests_total{route="unmatched",status="404"}'] == 40
        assert not any(name.split("/")[0] in scrape_text(srv) for name in names)
    finally:
        srv.stop()


def test_requests_refused_by_auth_count_under_the_route_they_were_meant_for(tmp_path: Path) -> None:
    """Auth answers before the router; the count still names the route, never ``unmatched``."""
    srv = AuthServer(tmp_path / "data", mode="tokens").start()
    try:
        srv.bucket("acme")
        writer = bearer(srv.token("acme", "write")["token"])
        stream = srv.url + "/v1/buckets/acme/stream/s"
        assert request("PUT", stream, {**writer, **OCTET})[0] == 201
        assert request("POST", stream, {**OCTET}, b"x")[0] == 401  # no credential
        assert request("POST", stream, {**bearer("not-a-token"), **OCTET}, b"x")[0] == 401
        reader_elsewhere = bearer(srv.token("default", "read")["token"])
        assert request("GET", stream + "?offset=-1", reader_elsewhere)[0] == 404  # no grant: hidden
        assert request("GET", srv.url + "/v1/admin/gc")[0] == 401  # the admin guard, behind the router
        assert request("POST", stream, {**writer, **OCTET}, b"x")[0] == 204
        m = samples(scrape_text(srv, OPERATOR))
        assert m['tiered_http_requests_total{route="append",status="401"}'] == 2
        assert m['tiered_http_requests_total{route="append",status="204"}'] == 1
        assert m['tiered_http_requests_total{route="read",status="404"}'] == 1
        assert m['tiered_http_requests_total{route="/v1/admin/gc",status="401"}'] == 1
        assert not any('route="unmatched"' in key for key in m), m
    finally:
        srv.stop()


# --------------------------------------------------------------------------- GC errors


class Boom:
    name = "boom"

    async def run(self, ctx: GcContext, gc_pass: GcPass) -> None:
        raise RuntimeError("a GC task crashed (injected)")


def test_gc_errors_total_counts_failed_passes_and_deletions(tmp_path: Path) -> None:
    config = make_config(tmp_path / "data")

    async def main() -> None:
        h = HttpHarness(config, ControlledStore, clock=VirtualClock())
        await h.start()
        try:
            store = h.s.store
            assert isinstance(store, ControlledStore)

            async def gc_errors() -> float:
                return samples((await h.http("GET", "/metrics"))[2].decode())["tiered_gc_errors_total"]

            assert await gc_errors() == 0
            store.fail_list = "error"  # reconciliation cannot list: reported, the pass goes on
            status, _, body = await h.http("POST", "/v1/admin/gc")
            assert status == 200 and len(json.loads(body)["errors"]) == 1
            assert await gc_errors() == 1
            store.fail_list = "ok"
            h.s.gc.tasks.append(Boom())  # a pass that crashes, asked for over the admin API
            status, _, body = await h.http("POST", "/v1/admin/gc")
            assert status == 500
            assert await gc_errors() == 2
            status, _, body = await h.http("POST", "/v1/admin/gc?dry_run=true")
            assert status == 500
            assert await gc_errors() == 2  # a dry run changes no counter
            m = samples((await h.http("GET", "/metrics"))[2].decode())
            assert m["tiered_gc_pass_seconds_count"] == 2  # both real passes, failed or not
        finally:
            await h.stop()

    asyncio.run(main())


# --------------------------------------------------------------------------- names others rely on


def _strings(tree: Any) -> list[str]:
    if isinstance(tree, str):
        return [tree]
    if isinstance(tree, dict):
        return [s for v in tree.values() for s in _strings(v)]
    if isinstance(tree, list):
        return [s for v in tree for s in _strings(v)]
    return []


def _unquote(value: str) -> str:
    return value[1:-1] if len(value) >= 2 and value[0] == value[-1] == '"' else value


def exposed_names(text: str) -> set[str]:
    """Names a dashboard or alarm may use: every sample's, and every family's (a counter's with ``_total``).

    Families count even without a series yet (``tiered_bucket_quota_refusals_total``
    before any refusal).
    """
    found = families(text).values()
    names = {s.name for family in found for s in family.samples}
    return names | {f.name + "_total" if f.type == "counter" else f.name for f in found}


def full_scrape(tmp_path: Path) -> str:
    """A scrape of an in-process node after one append (so every labelled family has a series)."""
    config = make_config(tmp_path / "data")

    async def main() -> str:
        h = HttpHarness(config, clock=VirtualClock())
        await h.start()
        try:
            assert (await h.http("PUT", "/v1/stream/x", headers=OCTET))[0] == 201
            assert (await h.http("POST", "/v1/stream/x", body=b"1", headers=OCTET))[0] == 204
            return (await h.http("GET", "/metrics"))[2].decode()
        finally:
            await h.stop()

    return asyncio.run(main())


def test_every_metric_terraform_and_the_docs_name_exists(tmp_path: Path) -> None:
    text = full_scrape(tmp_path)
    names = exposed_names(text)
    m = samples(text)

    monitoring = hcl2.load((ROOT / "terraform" / "monitoring.tf").open())
    used = {n for s in _strings(monitoring) for n in METRIC_NAME.findall(s)}
    alarmed = {
        _unquote(s)
        for alarm in monitoring["resource"]
        for s in _strings(alarm)
        if _unquote(s).startswith("tiered_") and " " not in s
    }
    assert {"tiered_append_seconds_sum", "tiered_http_requests_total", "tiered_gc_errors_total"} <= alarmed
    assert used - names == set(), "monitoring.tf names metrics tiered does not expose"

    # The append alarms filter tiered_http_requests_total on route = local.append_route.
    [local_values] = monitoring["locals"]
    append_route = _unquote(local_values["append_route"])
    assert m[f'tiered_http_requests_total{{route="{append_route}",status="204"}}'] == 1

    agent = (ROOT / "terraform" / "templates" / "cloudwatch-agent.json.tftpl").read_text()
    selectors = re.findall(r'"(\^tiered_[^"]*\$)"', agent)
    assert len(selectors) >= 10
    for selector in selectors:
        assert any(re.fullmatch(selector, n) for n in names), f"the agent ships {selector}: nothing matches"
    units = json.loads(re.sub(r"\$\{[a-z_]+\}", "x", agent))["logs"]["metrics_collected"]["prometheus"]
    assert set(units["emf_processor"]["metric_unit"]) <= names

    # Docs also name the module's variables (e.g. tiered_s3_...) and the Python client's package
    # (tiered_client, README's consumer groups): not metrics.
    variables = {
        _unquote(name)
        for block in hcl2.load((ROOT / "terraform" / "variables.tf").open())["variable"]
        for name in block
    } | {"tiered_client"}
    terraform_readme = (ROOT / "terraform" / "README.md").read_text()
    monitoring_section = terraform_readme.split("## Monitoring", 1)[1].split("\n## ", 1)[0]
    for doc, body in [
        ("docs/operations.md", (ROOT / "docs" / "operations.md").read_text()),
        ("README.md", (ROOT / "README.md").read_text()),
        ("terraform/README.md#monitoring", monitoring_section),
    ]:
        mentioned = set(METRIC_NAME.findall(body))
        assert mentioned, doc
        assert mentioned - names - variables == set(), f"{doc} names metrics tiered does not expose"


def test_operations_doc_lists_every_metric(tmp_path: Path) -> None:
    """Each family exposed is documented in docs/operations.md (under its exposed name)."""
    text = full_scrape(tmp_path)
    doc = (ROOT / "docs" / "operations.md").read_text()
    for family in families(text).values():
        shown = family.name + "_total" if family.type == "counter" else family.name
        assert f"`{shown}" in doc, f"{shown} is not in docs/operations.md"
