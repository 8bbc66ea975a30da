"""The S3 stores the cold-tier tests run against, as one parametrized fixture.

* ``moto``: moto's standalone server in the pytest process (``s3_server.py``);
* ``moto-iam``: moto with IAM enforced (``moto_iam_server.py``): each test runs
  as an IAM user whose only policy is the one ``terraform/iam.tf`` grants the
  instance role, rendered from the HCL for the test's bucket and prefix, so an
  operation the policy does not grant fails the test;
* ``ceph-http``, ``ceph-https``: Ceph RADOS Gateway (``ceph_rgw.py``); HTTPS is
  verified against the harness's own CA, passed with ``--s3-ca-bundle``.

A test takes ``s3_backend`` and parametrizes it indirectly::

    @pytest.mark.parametrize("s3_backend", ALL, indirect=True)
    def test_x(s3_backend: S3Backend) -> None:
        srv = ServerProcess(data, *s3_backend.serve_args(), env=s3_backend.env)

Each test gets its own key prefix (deleted afterwards) and this process's AWS
chain pointed at the backend's credentials, so in-process stores (``Node``,
``S3Store``) use them exactly as a subprocess given ``env`` does. Ceph is not
skipped under CI (``ceph_rgw.py``).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import boto3
import pytest
from botocore.config import Config as BotoConfig

from tests.support import ceph_rgw as rgw
from tests.support import s3_server
from tests.support.terraform_hcl import TERRAFORM, Module, policy_json, render_policy

ALL = ("moto", "moto-iam", "ceph-http", "ceph-https")
# The conformance suite and the prefix-claim tests: the IAM-enforced pass covers the cold
# tier, GC, reconciliation, verify and the fault tests (tests/deploy/test_iam_policy.py), not every test.
WITHOUT_IAM = ("moto", "ceph-http", "ceph-https")

MOTO_IAM_SCRIPT = Path(__file__).resolve().parent / "moto_iam_server.py"
POLICY_DOCUMENT = "tiered_s3"  # data.aws_iam_policy_document.tiered_s3: the instance role's S3 grant

_CLEARED_ENV = (
    "AWS_PROFILE",
    "AWS_SESSION_TOKEN",
    "AWS_SECURITY_TOKEN",
    "AWS_ENDPOINT_URL",
    "AWS_ENDPOINT_URL_S3",
    "AWS_CA_BUNDLE",
)


@dataclass(frozen=True)
class S3Backend:
    """One S3 store, one key prefix, and the credentials tiered uses there."""

    name: str
    url: str
    bucket: str
    region: str
    prefix: str
    env: dict[str, str]  # the AWS environment chain tiered runs with (an IAM user's keys on moto-iam)
    admin_env: dict[str, str]  # credentials for the test's own look behind tiered's back
    ca_bundle: str | None = None
    policy: dict[str, Any] | None = field(default=None, compare=False)  # moto-iam: the rendered policy

    def serve_args(self) -> list[str]:
        """``tiered`` flags for this store (credentials travel only in ``env``)."""
        args = [
            "--cold-store", "s3",
            "--s3-bucket", self.bucket,
            "--s3-prefix", self.prefix,
            "--s3-endpoint", self.url,
            "--s3-region", self.region,
            "--s3-addressing-style", "path",
        ]  # fmt: skip
        if self.ca_bundle:
            args += ["--s3-ca-bundle", self.ca_bundle]
        return args

    def config(self) -> dict[str, Any]:
        """The same settings as ``Config`` fields, for in-process nodes."""
        return {
            "cold_store": "s3",
            "s3_bucket": self.bucket,
            "s3_prefix": self.prefix,
            "s3_endpoint": self.url,
            "s3_region": self.region,
            "s3_addressing_style": "path",
            "s3_ca_bundle": self.ca_bundle or "",
        }

    def client(self) -> Any:
        """A plain boto3 client with the admin credentials (not tiered's: it may do anything)."""
        return boto3.session.Session().client(
            "s3",
            endpoint_url=self.url,
            region_name=self.region,
            aws_access_key_id=self.admin_env["AWS_ACCESS_KEY_ID"],
            aws_secret_access_key=self.admin_env["AWS_SECRET_ACCESS_KEY"],
            verify=self.ca_bundle,
            config=BotoConfig(
                s3={"addressing_style": "path"},
                request_checksum_calculation="when_required",
                response_checksum_validation="when_required",
            ),
        )

    def keys(self, under: str = "") -> list[str]:
        """Keys below ``<prefix>/<under>``, relative to the prefix."""
        client = self.client()
        found = []
        for page in client.get_paginator("list_objects_v2").paginate(
            Bucket=self.bucket, Prefix=f"{self.prefix}/{under}"
        ):
            found += [item["Key"][len(self.prefix) + 1 :] for item in page.get("Contents", [])]
        return found

    def read(self, key: str) -> bytes:
        body: bytes = self.client().get_object(Bucket=self.bucket, Key=f"{self.prefix}/{key}")["Body"].read()
        return body

    def write(self, key: str, data: bytes) -> None:
        """Overwrite an object behind tiered's back (to damage it)."""
        self.client().put_object(Bucket=self.bucket, Key=f"{self.prefix}/{key}", Body=data)

    def remove(self, key: str) -> None:
        self.client().delete_object(Bucket=self.bucket, Key=f"{self.prefix}/{key}")

    def clean(self) -> None:
        client = self.client()
        keys = [{"Key": f"{self.prefix}/{k}"} for k in self.keys()]
        for i in range(0, len(keys), 1000):
            client.delete_objects(Bucket=self.bucket, Delete={"Objects": keys[i : i + 1000], "Quiet": True})


# ---------------------------------------------------------------- moto with IAM enforced


@dataclass(frozen=True)
class MotoIam:
    url: str
    bucket: str
    region: str
    admin_env: dict[str, str]

    def user_for(self, prefix: str) -> tuple[dict[str, str], dict[str, Any]]:
        """A new IAM user whose only policy is iam.tf's, for this bucket and prefix: (its env, the policy)."""
        policy = render_policy(
            Module(TERRAFORM),
            POLICY_DOCUMENT,
            {"var.s3_prefix": prefix, "aws_s3_bucket.cold.arn": f"arn:aws:s3:::{self.bucket}"},
        )
        iam = boto3.session.Session().client(
            "iam",
            endpoint_url=self.url,
            region_name=self.region,
            aws_access_key_id=self.admin_env["AWS_ACCESS_KEY_ID"],
            aws_secret_access_key=self.admin_env["AWS_SECRET_ACCESS_KEY"],
        )
        user = f"tiered-{uuid.uuid4().hex[:12]}"
        iam.create_user(UserName=user)
        iam.put_user_policy(UserName=user, PolicyName="tiered-cold-tier", PolicyDocument=policy_json(policy))
        key = iam.create_access_key(UserName=user)["AccessKey"]
        env = {
            **self.admin_env,
            "AWS_ACCESS_KEY_ID": key["AccessKeyId"],
            "AWS_SECRET_ACCESS_KEY": key["SecretAccessKey"],
        }
        return env, policy


def _aws_env(access_key: str, secret_key: str, region: str) -> dict[str, str]:
    return {
        "AWS_ACCESS_KEY_ID": access_key,
        "AWS_SECRET_ACCESS_KEY": secret_key,
        "AWS_DEFAULT_REGION": region,
        "AWS_CONFIG_FILE": os.devnull,
        "AWS_SHARED_CREDENTIALS_FILE": os.devnull,
        "AWS_EC2_METADATA_DISABLED": "true",
    }


@pytest.fixture(scope="session")
def moto_iam(aws_test_env: None) -> Iterator[MotoIam]:
    """moto with IAM enforced, in its own process (moto's auth switch is process-wide)."""
    proc = subprocess.Popen(
        [sys.executable, str(MOTO_IAM_SCRIPT)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        if not line:
            pytest.fail(f"{MOTO_IAM_SCRIPT.name} exited with {proc.wait(10)} before it was ready")
        info = json.loads(line)
        yield MotoIam(
            url=info["url"],
            bucket=info["bucket"],
            region=info["region"],
            admin_env=_aws_env(info["admin_access_key"], info["admin_secret_key"], info["region"]),
        )
    finally:
        if proc.stdin is not None:
            proc.stdin.close()  # the server stops when its stdin closes
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)


# ---------------------------------------------------------------- the fixture


@contextmanager
def backend_for(
    name: str, request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch
) -> Iterator[S3Backend]:
    """The store ``name`` under a fresh prefix (cleaned afterwards), this process's AWS chain pointed at it."""
    if name not in ALL:
        raise pytest.UsageError(f"no S3 backend {name!r}: one of {ALL}")
    request.getfixturevalue("aws_test_env")  # isolated AWS config and the shared botocore loader
    prefix = f"t-{uuid.uuid4().hex[:16]}"
    backend: S3Backend
    if name == "moto":
        moto: s3_server.S3Endpoint = request.getfixturevalue("moto_s3")
        env = _aws_env("testing", "testing", moto.region)
        backend = S3Backend(name, moto.url, moto.bucket, moto.region, prefix, env, env)
    elif name == "moto-iam":
        iam: MotoIam = request.getfixturevalue("moto_iam")
        env, policy = iam.user_for(prefix)
        backend = S3Backend(name, iam.url, iam.bucket, iam.region, prefix, env, iam.admin_env, policy=policy)
    else:
        gateway: rgw.RGWEndpoint = request.getfixturevalue("ceph_rgw")
        tls = name == "ceph-https"
        env = _aws_env(gateway.access_key, gateway.secret_key, gateway.region)
        backend = S3Backend(
            name,
            gateway.endpoint(tls),
            gateway.bucket,
            gateway.region,
            prefix,
            env,
            env,
            ca_bundle=gateway.ca_bundle if tls else None,
        )
    for variable in _CLEARED_ENV:
        monkeypatch.delenv(variable, raising=False)
    for variable, value in backend.env.items():
        monkeypatch.setenv(variable, value)
    try:
        yield backend
    finally:
        backend.clean()


@pytest.fixture
def s3_backend(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Iterator[S3Backend]:
    """The store named by the test's indirect parameter (see the module docstring)."""
    with backend_for(getattr(request, "param", ""), request, monkeypatch) as backend:
        yield backend
