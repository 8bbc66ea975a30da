"""Admin API of quotas and usage (operator routes: the admin token is required).

| request | does |
| --- | --- |
| ``GET /v1/admin/quotas/{bucket}`` | the bucket's overrides and the quotas in force |
| ``PUT /v1/admin/quotas/{bucket}`` ``{"max_streams": N or null, ...}`` | replace the overrides: a quota left out follows the config's default, ``null`` is unlimited |
| ``GET /v1/admin/usage[?bucket=B]`` | usage counters and gauges per bucket (erased buckets included) |
"""

from __future__ import annotations

from typing import Any

from tiered.api.kit.types import Request, Response, json_response
from tiered.core.errors import ErrorCode, TieredError, bad_request
from tiered.core.ids import validate_bucket
from tiered.core.parsing import decode_json
from tiered.engine.tenants.quotas import QUOTA_NAMES
from tiered.engine.tenants.service import TenantService


def _overrides(raw: bytes) -> dict[str, int | None]:
    body: Any = decode_json(raw) if raw.strip() else {}
    if not isinstance(body, dict):
        raise bad_request("the body must be a JSON object of quotas")
    for name, value in body.items():
        if name not in QUOTA_NAMES:
            raise bad_request(f"unknown quota {name!r}; known: {', '.join(QUOTA_NAMES)}")
        if value is not None and type(value) is not int:
            raise bad_request(f"{name} must be an integer, or null for unlimited")
    return body


class TenantRoutes:
    def __init__(self, service: TenantService) -> None:
        self.service = service

    async def get_quotas(self, request: Request) -> Response:
        bucket = validate_bucket(request.params["bucket"])
        if bucket not in self.service.streams.buckets:
            raise TieredError(ErrorCode.BUCKET_NOT_FOUND, f"bucket {bucket!r} does not exist")
        return json_response(self.service.quotas_view(bucket))

    async def set_quotas(self, request: Request) -> Response:
        bucket = validate_bucket(request.params["bucket"])
        return json_response(await self.service.set_quotas(bucket, _overrides(await request.body())))

    async def usage(self, request: Request) -> Response:
        bucket = request.query.get("bucket")
        rows = self.service.usage(bucket)
        if bucket is not None and not rows:
            raise TieredError(ErrorCode.BUCKET_NOT_FOUND, f"bucket {bucket!r} has no usage: it never existed")
        return json_response({"buckets": rows}, headers={"Cache-Control": "no-store"})
