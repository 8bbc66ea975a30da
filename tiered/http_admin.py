"""Admin HTTP API: bucket erasure, retention, GC triggers, metrics.

These are extensions of the Durable Streams protocol, for operators:

* ``DELETE /v1/buckets/{bucket}`` - erase a bucket: every stream goes, the
  bucket's ownership of every cold object is released, and the name is fenced
  forever (creating it again is a 409).
* ``PUT /v1/admin/retention/{bucket}[/{stream path}]`` with
  ``{"retention_ms": int|null, "retention_bytes": int|null}`` - age and size
  retention for a bucket, or one stream (which then ignores the bucket's).
* ``POST /v1/admin/retain/{bucket}/{stream path}`` with ``{"offset": "<offset>"}``
  - advance a stream's earliest retained offset (never backwards). Reads below
  it get 410 Gone with the earliest offset in ``Stream-Next-Offset``; ``HEAD``
  shows it as ``Stream-Retained-Offset``.
* ``POST /v1/admin/gc[?dry_run=true]`` - run one GC pass now; returns its report.
* ``GET /v1/admin/gc`` - the last pass's report and lifetime counters.
* ``GET /metrics`` - Prometheus text; an admin route like the others (scrape it
  with the admin token as a bearer token).

Admin calls need ``Authorization: Bearer <token>`` when a token is configured
(``--admin-token-file`` or ``TIERED_ADMIN_TOKEN``). With no token configured
they are allowed only if the server listens on loopback. Refusals are 401/403
and change nothing.
"""

from __future__ import annotations

import hmac
from collections.abc import Awaitable, Callable
from typing import Any

import msgspec
from aiohttp import web

from .http_api import error_response
from .ids import InvalidName, format_offset, parse_offset, validate_bucket, validate_stream_path
from .service import StreamService
from .state import StreamError

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


class RetentionBody(msgspec.Struct, forbid_unknown_fields=True):
    retention_ms: int | None = None
    retention_bytes: int | None = None


class RetainBody(msgspec.Struct, forbid_unknown_fields=True):
    offset: str


class AdminApi:
    def __init__(self, service: StreamService) -> None:
        self.service = service
        self.token = service.config.admin_token()
        self.loopback_only = service.config.loopback_only

    def routes(self) -> list[web.RouteDef]:
        guard = self._guarded
        return [
            web.delete("/v1/buckets/{bucket}", guard(self.erase_bucket)),
            web.put("/v1/admin/retention/{bucket}", guard(self.set_bucket_retention)),
            web.put("/v1/admin/retention/{bucket}/{path:[\\s\\S]+}", guard(self.set_stream_retention)),
            web.post("/v1/admin/retain/{bucket}/{path:[\\s\\S]+}", guard(self.retain)),
            web.post("/v1/admin/gc", guard(self.run_gc)),
            web.get("/v1/admin/gc", guard(self.gc_status)),
            web.get("/metrics", guard(self.metrics)),
        ]

    # ------------------------------------------------------------------ auth

    def _refusal(self, request: web.Request) -> web.Response | None:
        if self.token is None:
            if self.loopback_only:
                return None
            return error_response(
                403, "admin operations are disabled: configure an admin token (--admin-token-file or TIERED_ADMIN_TOKEN)"
            )
        header = request.headers.get("Authorization", "")
        scheme, _, presented = header.partition(" ")
        if scheme.lower() != "bearer" or not presented:
            return error_response(401, "admin operations need Authorization: Bearer <token>", {"WWW-Authenticate": "Bearer"})
        # Header bytes that are not UTF-8 arrive as lone surrogates: compare the bytes as sent.
        given = presented.strip().encode("utf-8", "surrogateescape")
        if not hmac.compare_digest(given, self.token.encode()):
            return error_response(401, "the admin token is not valid", {"WWW-Authenticate": "Bearer"})
        return None

    def _guarded(self, handler: Handler) -> Handler:
        async def guarded(request: web.Request) -> web.StreamResponse:
            refusal = self._refusal(request)
            if refusal is not None:
                return refusal
            try:
                return await handler(request)
            except StreamError as exc:
                return error_response(exc.status, exc.message, exc.headers)
            except (InvalidName, ValueError) as exc:
                return error_response(400, str(exc))

        return guarded

    @staticmethod
    async def _body(request: web.Request, kind: type[Any]) -> Any:
        try:
            return msgspec.json.decode(await request.read(), type=kind)
        except (msgspec.DecodeError, msgspec.ValidationError) as exc:
            raise ValueError(f"invalid JSON body: {exc}") from None

    # -------------------------------------------------------------- handlers

    async def erase_bucket(self, request: web.Request) -> web.StreamResponse:
        name = validate_bucket(request.match_info["bucket"])
        await self.service.erase_bucket(name)
        return web.Response(status=204)

    async def set_bucket_retention(self, request: web.Request) -> web.StreamResponse:
        return await self._set_retention(request, None)

    async def set_stream_retention(self, request: web.Request) -> web.StreamResponse:
        return await self._set_retention(request, validate_stream_path(request.match_info["path"]))

    async def _set_retention(self, request: web.Request, path: str | None) -> web.StreamResponse:
        bucket = validate_bucket(request.match_info["bucket"])
        body = await self._body(request, RetentionBody)
        for name in ("retention_ms", "retention_bytes"):
            value = getattr(body, name)
            if value is not None and value < 0:
                raise ValueError(f"{name} must not be negative")
        await self.service.set_retention(bucket, path, body.retention_ms, body.retention_bytes)
        return web.json_response({"retention_ms": body.retention_ms, "retention_bytes": body.retention_bytes})

    async def retain(self, request: web.Request) -> web.StreamResponse:
        bucket = validate_bucket(request.match_info["bucket"])
        path = validate_stream_path(request.match_info["path"])
        body = await self._body(request, RetainBody)
        offset = parse_offset(body.offset)
        if offset is None:
            raise ValueError(f"malformed offset {body.offset!r}")
        s = await self.service.retain_from(bucket, path, offset)
        return web.Response(status=204, headers={"Stream-Retained-Offset": format_offset(s.retained_from)})

    async def run_gc(self, request: web.Request) -> web.StreamResponse:
        dry_run = request.query.get("dry_run", "").lower() in ("1", "true", "yes")
        if self.service.gc is None:
            return error_response(503, "GC is not running")
        report = await self.service.gc.run_pass(dry_run=dry_run)
        return web.json_response(report.to_json())

    async def gc_status(self, request: web.Request) -> web.StreamResponse:
        gc = self.service.gc
        if gc is None:
            return error_response(503, "GC is not running")
        return web.json_response(
            {
                "pending_deletions": gc.pending_deletions(),
                "totals": msgspec.to_builtins(gc.totals),
                "last_pass": gc.last_report.to_json() if gc.last_report else None,
            }
        )

    async def metrics(self, request: web.Request) -> web.StreamResponse:
        service = self.service
        state = service.state
        lines = [
            "# TYPE tiered_streams gauge",
            f"tiered_streams {sum(1 for s in state.streams.values() if not s.soft_deleted)}",
            "# TYPE tiered_hot_bytes gauge",
            f"tiered_hot_bytes {state.hot_bytes}",
            "# TYPE tiered_cold_objects gauge",
            f"tiered_cold_objects {len(state.cold_objects)}",
            "# TYPE tiered_cold_bytes gauge",
            f"tiered_cold_bytes {sum(o.size for o in state.cold_objects.values())}",
            "# HELP tiered_integrity_errors_total Reads and copies refused because stored bytes failed their checksum",
            "# TYPE tiered_integrity_errors_total counter",
            *(f'tiered_integrity_errors_total{{tier="{tier}"}} {n}' for tier, n in service.integrity_errors.items()),
            "# HELP tiered_store_stalls_total Object-store calls abandoned at their deadline",
            "# TYPE tiered_store_stalls_total counter",
            f"tiered_store_stalls_total {service.store_health.stalls}",
            "# HELP tiered_store_reachable Whether the object store answered its last probe or call",
            "# TYPE tiered_store_reachable gauge",
            f"tiered_store_reachable {1 if service.store_health.reachable else 0}",
            "# HELP tiered_live_readers Long-poll and SSE readers waiting for data",
            "# TYPE tiered_live_readers gauge",
            f"tiered_live_readers {service.waiters.count}",
            "# TYPE tiered_hot_damaged_frames gauge",
            f"tiered_hot_damaged_frames {sum(len(d) for d in service.journal.log.damage().values())}",
        ]
        flusher = service.flusher
        if flusher is not None:
            lines += [
                "# TYPE tiered_cold_puts_total counter",
                f"tiered_cold_puts_total {flusher.puts}",
                "# TYPE tiered_cold_bytes_uploaded_total counter",
                f"tiered_cold_bytes_uploaded_total {flusher.bytes_uploaded}",
                "# TYPE tiered_cold_flush_failures_total counter",
                f"tiered_cold_flush_failures_total {flusher.failures}",
                "# HELP tiered_cold_flush_damaged_streams Streams the flusher stopped copying at a damaged hot record",
                "# TYPE tiered_cold_flush_damaged_streams gauge",
                f"tiered_cold_flush_damaged_streams {len(flusher.damaged)}",
            ]
        gc = service.gc
        if gc is not None:
            t = gc.totals
            lines += [
                "# TYPE tiered_gc_pending_deletions gauge",
                f"tiered_gc_pending_deletions {gc.pending_deletions()}",
                "# TYPE tiered_gc_bytes_reclaimed_total counter",
                f"tiered_gc_bytes_reclaimed_total {t.bytes_reclaimed}",
                "# TYPE tiered_gc_objects_deleted_total counter",
                f"tiered_gc_objects_deleted_total {t.objects_deleted}",
                "# TYPE tiered_gc_orphans_found_total counter",
                f"tiered_gc_orphans_found_total {t.orphans_found}",
                "# TYPE tiered_gc_integrity_errors gauge",
                f"tiered_gc_integrity_errors {t.integrity_errors}",
                "# TYPE tiered_gc_last_pass_timestamp_seconds gauge",
                f"tiered_gc_last_pass_timestamp_seconds {t.last_pass_ms / 1000:.3f}",
            ]
        return web.Response(text="\n".join(lines) + "\n", content_type="text/plain")
