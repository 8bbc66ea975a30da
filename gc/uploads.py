"""Reconciliation of uploads that never completed: multipart uploads no journal intent owns.

A process killed while it streamed a large body (or a big flushed object) to
S3 leaves an incomplete multipart upload: no object, invisible to listings,
but its parts are stored (and billed). On a reconciliation pass, uploads
under the data prefix whose key no copy in flight owns (``ColdCopyStarted``
not yet committed or aborted: the upload may still be under way) and that
began more than the grace delay ago are orphans: counted with the orphans
(``orphans_found``, ``orphans_deleted``) and aborted, only under a prefix this
data dir has claimed. A dry run lists them. Stores without multipart uploads
(the local directory: an interrupted upload is a staged file, swept when the
store is next opened) have nothing here. A bucket lifecycle rule
(``AbortIncompleteMultipartUpload``, terraform/) remains the backstop.
"""

from __future__ import annotations

import logging
from typing import Any

from tiered.cold.objects.keys import DATA_PREFIX, key_time_ms
from tiered.cold.objects.store import ObjectStoreError
from tiered.gc.context import GcContext, GcPass, prefix_held

log = logging.getLogger(__name__)


class AbortStaleUploads:
    name = "uploads"

    async def run(self, ctx: GcContext, gc_pass: GcPass) -> None:
        if not gc_pass.reconcile:
            return
        lister: Any = getattr(ctx.store, "incomplete_uploads", None)
        aborter: Any = getattr(ctx.store, "abort_upload", None)
        if lister is None or aborter is None:
            return
        report = gc_pass.report
        try:
            uploads = await lister(DATA_PREFIX, ctx.max_objects)
        except ObjectStoreError as exc:
            report.errors.append(f"listing incomplete uploads failed: {exc}")
            return
        stale: list[tuple[str, str]] = []
        for key, upload_id, initiated in uploads:
            if key in ctx.state.copies_in_flight:
                continue  # its intent is journaled: the upload may still be under way
            born = key_time_ms(key)
            if born is None:
                born = int(initiated.timestamp() * 1000)
            if gc_pass.now - born >= ctx.grace_ms:
                stale.append((key, upload_id))
        report.orphans_found += len(stale)
        if gc_pass.dry_run:
            for key, _ in stale:
                report.would_delete.append(
                    {"key": key, "bytes": 0, "reason": "orphan: an upload that never completed"}
                )
            return
        if not stale or not await prefix_held(ctx, report, force=True):
            return
        for key, upload_id in stale:
            try:
                await aborter(key, upload_id)
            except ObjectStoreError as exc:
                report.errors.append(f"aborting the incomplete upload of {key} failed: {exc}")
                continue
            report.orphans_deleted += 1
            log.info("aborted the incomplete upload %s of %s (no journal intent owns it)", upload_id, key)
