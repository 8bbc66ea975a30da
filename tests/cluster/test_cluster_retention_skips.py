"""``tests/engine/groups/test_retention_skips_http.py`` against a single-node cluster of 4 shards.

Groups live in the shard of ``__groups/<name>`` and subscriptions in the one
of ``__ds``; the streams are in whichever shard their names hash to. A
stream's retention in another shard reaches a group through the directory's
listing (its retained offset, at the group's next sweep) and the
subscriptions through the feed (a ``retained`` change): the cursor moves and
the range is reported all the same.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.engine.groups.test_retention_skips_http import *  # noqa: F403  (the same tests, with the fixture below)
from tests.support.cluster_support import cluster_module_server
from tests.support.s3_server import S3Endpoint
from tests.support.server_process import ServerProcess

pytestmark = pytest.mark.timeout(180)


@pytest.fixture(scope="module")
def srv(moto_s3: S3Endpoint, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    yield from cluster_module_server(
        moto_s3, tmp_path_factory, "skips", "--webhook-allow-loopback", "true", shards=4
    )
