"""A real S3 endpoint for tests: moto's standalone server on 127.0.0.1.

Using the HTTP server (rather than moto's in-process mocks) exercises the
actual aiobotocore transport: signing, timeouts, streaming bodies, and the
conditional-write headers. Bind the fixtures in a test module to use them:

    aws_test_env = s3_server.aws_test_env
    moto_s3 = s3_server.moto_s3
"""

from __future__ import annotations

import functools
import logging
import os
from collections.abc import Iterator
from dataclasses import dataclass

import boto3
import botocore.session
import pytest
from moto.server import ThreadedMotoServer

BUCKET = "tiered-test"
REGION = "us-east-1"

# Fake credentials and an isolated config, so tests never touch a real account.
_TEST_ENV = {
    "AWS_ACCESS_KEY_ID": "testing",
    "AWS_SECRET_ACCESS_KEY": "testing",
    "AWS_DEFAULT_REGION": REGION,
    "AWS_CONFIG_FILE": os.devnull,
    "AWS_SHARED_CREDENTIALS_FILE": os.devnull,
    "AWS_EC2_METADATA_DISABLED": "true",
}
_CLEARED_ENV = (
    "AWS_PROFILE",
    "AWS_SESSION_TOKEN",
    "AWS_SECURITY_TOKEN",
    "AWS_ENDPOINT_URL",
    "AWS_ENDPOINT_URL_S3",
)


@dataclass(frozen=True)
class S3Endpoint:
    url: str
    bucket: str
    region: str


@pytest.fixture(scope="session")
def aws_test_env() -> Iterator[None]:
    """Point the standard AWS credential chain at fake test credentials.

    Also parses botocore's bundled service models once per session: every
    S3Store.open() builds a fresh botocore session, which re-parses the S3
    model JSON (~0.1 s). Production opens one store per process, tests open
    one per test, so they share the read-only loader to keep the suite fast.
    """
    saved = {name: os.environ.get(name) for name in (*_TEST_ENV, *_CLEARED_ENV)}
    os.environ.update(_TEST_ENV)
    for name in _CLEARED_ENV:
        os.environ.pop(name, None)
    create_loader = botocore.session.create_loader
    botocore.session.create_loader = functools.cache(create_loader)
    try:
        yield
    finally:
        botocore.session.create_loader = create_loader
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


@pytest.fixture(scope="session")
def moto_s3(aws_test_env: None) -> Iterator[S3Endpoint]:
    """Start moto on a free port with one bucket; tests isolate by key prefix."""
    logging.getLogger("werkzeug").setLevel(logging.ERROR)  # one access-log line per request otherwise
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    try:
        host, port = server.get_host_and_port()
        url = f"http://{host}:{port}"
        boto3.client("s3", endpoint_url=url, region_name=REGION).create_bucket(Bucket=BUCKET)
        yield S3Endpoint(url=url, bucket=BUCKET, region=REGION)
    finally:
        server.stop()
