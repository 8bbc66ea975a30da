"""Admin and operations routes (extensions of the protocol, for operators).

Guarded by the admin token (``tiered.api.kit.middleware.admin_auth``; the route table,
``tiered.api.table``, puts the guard before every operator route):

* ``PUT /v1/admin/retention/{bucket}[/{stream path}]`` with
  ``{"retention_ms": int|null, "retention_bytes": int|null}``: age and size
  retention for a bucket, or one stream (which then ignores the bucket's);
  each from 0 to 2^53 - 1, null clears it; ``"retain": "snapshot"`` too: retention
  follows the streams' newest snapshots (docs/snapshots.md), absent or null turns it off;
* ``POST /v1/admin/retain/{bucket}/{stream path}`` with ``{"offset": "<offset>"}``:
  advance a stream's earliest retained offset (never backwards); ``"snapshot"``: to its
  newest snapshot's offset (404 without one);
* ``POST /v1/admin/gc[?dry_run=true|false]``: run one GC pass now, return its report;
* ``GET /v1/admin/gc``: the last report, pending deletions, lifetime counters;
* ``GET /v1/admin/erasure``: per erased bucket, the cold objects still holding its bytes, why, until
  when, and whether the erasure deadline passed (``tiered.engine.jobs.rewrite_plan.erasure_report``);
* ``GET /v1/admin/integrity/{bucket}``: the bucket's integrity digests (the sum of its
  streams') and each stream's (``tiered.engine.streams.integrity``; docs/integrity.md);
* ``GET /metrics``: Prometheus text.

Open: ``GET /healthz`` (liveness) and ``GET /readyz`` (readiness).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Literal

import msgspec

from tiered.api.kit.target import decode_path
from tiered.api.kit.types import Request, Response, json_response
from tiered.core.errors import ErrorCode, TieredError, bad_request
from tiered.core.ids import format_offset, parse_offset, validate_bucket, validate_stream_path
from tiered.core.parsing import UInt, decode_body, query_flag
from tiered.engine.jobs.rewrite_plan import erasure_report
from tiered.engine.streams import integrity
from tiered.engine.streams.service import StreamService
from tiered.engine.streams.snapshot_service import SnapshotService
from tiered.gc.runner import GcRunner

log = logging.getLogger(__name__)

Readiness = Callable[[], tuple[bool, dict[str, object]]]
METRICS_CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"  # Prometheus' classic text format


class RetentionBody(msgspec.Struct, forbid_unknown_fields=True):
    retention_ms: UInt | None = None
    retention_bytes: UInt | None = None
    retain: Literal["snapshot"] | None = None  # retention follows the newest snapshot


class RetainBody(msgspec.Struct, forbid_unknown_fields=True):
    offset: str


class AdminRoutes:
    def __init__(
        self,
        streams: StreamService,
        gc: GcRunner | None,
        readiness: Readiness,
        metrics: Callable[[], bytes],
        journal_ok: Callable[[], bool],
        snapshots: SnapshotService | None = None,
    ) -> None:
        self.streams = streams
        self.snapshots = snapshots
        self.gc = gc
        self.readiness = readiness
        self.render_metrics = metrics
        self.journal_ok = journal_ok

    # -------------------------------------------------------------- retention

    async def set_bucket_retention(self, request: Request) -> Response:
        return await self._set_retention(request, None)

    async def set_stream_retention(self, request: Request) -> Response:
        return await self._set_retention(request, validate_stream_path(decode_path(request.params["path"])))

    async def _set_retention(self, request: Request, path: str | None) -> Response:
        bucket = validate_bucket(request.params["bucket"])
        body = decode_body(await request.body(), RetentionBody)
        await self.streams.set_retention(bucket, path, body.retention_ms, body.retention_bytes)
        if self.snapshots is not None:
            await self.snapshots.set_retention(bucket, path, body.retain == "snapshot")
        log.info(
            "admin: retention of %s set to %s ms, %s bytes",
            f"{bucket}/{path}" if path is not None else f"bucket {bucket}",
            body.retention_ms,
            body.retention_bytes,
        )
        answer: dict[str, object] = {
            "retention_ms": body.retention_ms,
            "retention_bytes": body.retention_bytes,
        }
        if body.retain is not None:
            answer["retain"] = body.retain
        return json_response(answer)

    async def retain(self, request: Request) -> Response:
        bucket = validate_bucket(request.params["bucket"])
        path = validate_stream_path(decode_path(request.params["path"]))
        body = decode_body(await request.body(), RetainBody)
        if body.offset == "snapshot" and self.snapshots is not None:
            s = await self.snapshots.retain_to_snapshot(bucket, path)
            log.info(
                "admin: %s/%s retained from its snapshot, %s", bucket, path, format_offset(s.retained_from)
            )
            return Response(204, {"Stream-Retained-Offset": format_offset(s.retained_from)})
        offset = parse_offset(body.offset)
        if offset is None:
            raise bad_request(f"malformed offset {body.offset!r}")
        s = await self.streams.retain_from(bucket, path, offset)
        log.info("admin: %s/%s retained from offset %s", bucket, path, format_offset(s.retained_from))
        return Response(204, {"Stream-Retained-Offset": format_offset(s.retained_from)})

    # -------------------------------------------------------------- GC

    def _gc(self) -> GcRunner:
        if self.gc is None:
            raise TieredError(ErrorCode.UNAVAILABLE, "GC is not running")
        return self.gc

    async def run_gc(self, request: Request) -> Response:
        dry_run = query_flag(request.query, "dry_run")
        gc = self._gc()
        log.info("admin: GC pass%s requested", " (dry run)" if dry_run else "")
        report = await gc.run_pass(dry_run=dry_run)
        log.info(
            "admin: GC pass%s done: %d objects deleted, %d errors, %d integrity errors",
            " (dry run)" if dry_run else "",
            report.objects_deleted,
            len(report.errors),
            len(report.integrity_errors),
        )
        return json_response(report.to_json())

    async def gc_status(self, request: Request) -> Response:
        gc = self._gc()
        return json_response(
            {
                "pending_deletions": gc.pending_deletions(),
                "totals": msgspec.to_builtins(gc.totals),
                "last_pass": gc.last_report.to_json() if gc.last_report else None,
            }
        )

    async def erasure(self, request: Request) -> Response:
        """What still holds an erased bucket's bytes (the proof an erasure reached every byte, or not yet)."""
        ctx = self._gc().ctx
        report = erasure_report(ctx.state, ctx.clock.now_ms(), ctx.erasure_deadline_ms, ctx.grace_ms)
        return json_response(report.to_json())

    # -------------------------------------------------------------- integrity

    async def integrity(self, request: Request) -> Response:
        bucket = validate_bucket(request.params["bucket"])
        state = self.streams.state
        if bucket not in state.buckets:
            raise TieredError(ErrorCode.BUCKET_NOT_FOUND, f"bucket {bucket!r} does not exist")
        return json_response(integrity.bucket_json(integrity.bucket_view(state, bucket)))

    # -------------------------------------------------------------- operations

    async def metrics(self, request: Request) -> Response:
        return Response(200, {"Content-Type": METRICS_CONTENT_TYPE}, self.render_metrics())

    async def health(self, request: Request) -> Response:
        """Liveness: the process runs and its journal writes (an object-store outage is not fatal)."""
        ok = self.journal_ok()
        _, checks = self.readiness()
        return json_response({"ok": ok, "store": checks["store"]}, status=200 if ok else 503)

    async def ready(self, request: Request) -> Response:
        """Readiness: recovery finished, the journal writes, the store answered, the prefix is ours."""
        ready, checks = self.readiness()
        return json_response({"ready": ready, **checks}, status=200 if ready else 503)
