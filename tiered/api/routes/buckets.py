"""Bucket routes, all in one place.

| request | does |
| --- | --- |
| ``GET /v1/buckets`` | list buckets |
| ``PUT /v1/buckets/{bucket}`` | create (201; 200 if it exists; 409 if it was erased) |
| ``GET /v1/buckets/{bucket}`` | describe (creation time, live streams) |
| ``DELETE /v1/buckets/{bucket}`` | erase: every stream goes, the name is fenced forever (admin) |
| ``GET /v1/buckets/{bucket}/streams``, ``GET /v1/stream`` | list the bucket's (the default bucket's) streams, a page at a time (``tiered.engine.streams.listing``) |
"""

from __future__ import annotations

from tiered.api.kit.types import Request, Response, json_response
from tiered.core.ids import validate_bucket
from tiered.core.parsing import decode_json
from tiered.engine.streams.listing import parse_list_query
from tiered.engine.streams.service import StreamService


class BucketRoutes:
    def __init__(self, service: StreamService) -> None:
        self.service = service

    async def list(self, request: Request) -> Response:
        buckets = self.service.list_buckets()
        caller = request.auth
        if caller is not None:  # only the buckets the caller may see
            buckets = [b for b in buckets if caller.visible(b["name"])]
        return json_response({"buckets": buckets})

    async def create(self, request: Request) -> Response:
        name = validate_bucket(request.params["bucket"])
        body = await request.body()
        if body.strip():
            decode_json(body)  # no settings yet, but a body that is not JSON is refused, not ignored
        created = await self.service.create_bucket(name)
        return json_response({"name": name}, status=201 if created else 200)

    async def describe(self, request: Request) -> Response:
        return json_response(self.service.describe_bucket(request.params["bucket"]))

    async def erase(self, request: Request) -> Response:
        await self.service.erase_bucket(validate_bucket(request.params["bucket"]))
        return Response(204)

    async def list_streams(self, request: Request) -> Response:
        """A page of the target bucket's streams, only those the caller's grants cover."""
        bucket = request.target.bucket
        assert bucket is not None  # the target parsed it (validated), and the access check judged it
        query = parse_list_query(request.query)
        caller = request.auth
        prefixes = caller.stream_prefixes(bucket) if caller is not None else None
        page = self.service.list_streams(bucket, query, prefixes)
        return json_response(page, headers={"Cache-Control": "no-store"})
