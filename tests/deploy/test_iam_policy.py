"""The instance role's S3 policy (terraform/iam.tf) grants exactly what tiered's code does, and no more.

* What the code does: every S3 operation S3Store's clients make during the whole
  test session is recorded (``tests/support/s3_ops.py``: a botocore ``before-call`` hook,
  in-process and in the ``tiered`` subprocesses, over the moto- and Ceph-backed
  tests), plus a workload here that takes each of S3Store's paths once (so the
  check means the same when this module runs alone). Each operation maps to the
  IAM action AWS documents for it.
* What the policy grants: ``data.aws_iam_policy_document.tiered_s3``, parsed
  from the HCL with python-hcl2 and rendered as Terraform would.
* The check (run last, ``after_s3_tests``: under xdist, once every other worker
  has run all its tests, ``s3_operations_complete``) fails if the policy lacks an action
  the code needs, or grants one the code never uses; and if iam.tf's own table
  of operations (``local.tiered_s3_operation_actions``) has drifted from either.

The enforced pass (``s3_backend`` = ``moto-iam``: the cold round trip, shared-object
GC, verify and reconciliation, the fault tests) runs as an IAM user holding
only that policy; ``test_enforcement_refuses_what_the_policy_does_not_grant``
shows that moto really refuses what the policy does not grant there.
"""

from __future__ import annotations

import asyncio
import os
import uuid
from pathlib import Path
from typing import Any

import boto3
import pytest
from botocore.config import Config as BotoConfig
from botocore.exceptions import ClientError

from tests.support import s3_ops
from tests.support.moto_iam_server import is_allowed
from tests.support.s3_backends import POLICY_DOCUMENT, S3Backend
from tests.support.s3_server import S3Endpoint
from tests.support.server_process import ServerProcess
from tests.support.terraform_hcl import TERRAFORM, Module, render_policy
from tiered.cold.objects.retry import RetryPolicy
from tiered.cold.objects.s3 import MIN_PART_SIZE, S3Store
from tiered.cold.objects.store import ObjectStoreError

pytestmark = pytest.mark.timeout(300)

# The IAM action that authorizes each S3 API operation, as AWS documents it
# ("Required permissions for Amazon S3 API operations"). Operations tiered does
# not use are listed too, so that starting to use one maps to the right action.
S3_OPERATION_ACTIONS = {
    "AbortMultipartUpload": "s3:AbortMultipartUpload",
    "CompleteMultipartUpload": "s3:PutObject",
    "CopyObject": "s3:PutObject",
    "CreateMultipartUpload": "s3:PutObject",
    "DeleteObject": "s3:DeleteObject",
    "DeleteObject(VersionId)": "s3:DeleteObjectVersion",
    "DeleteObjects": "s3:DeleteObject",
    "DeleteObjects(VersionId)": "s3:DeleteObjectVersion",
    "GetBucketLocation": "s3:GetBucketLocation",
    "GetBucketVersioning": "s3:GetBucketVersioning",
    "GetObject": "s3:GetObject",
    "GetObject(VersionId)": "s3:GetObjectVersion",
    "GetObjectAttributes": "s3:GetObjectAttributes",
    "GetObjectTagging": "s3:GetObjectTagging",
    "HeadBucket": "s3:ListBucket",
    "HeadObject": "s3:GetObject",
    "HeadObject(VersionId)": "s3:GetObjectVersion",
    "ListBuckets": "s3:ListAllMyBuckets",
    "ListMultipartUploads": "s3:ListBucketMultipartUploads",
    "ListObjectVersions": "s3:ListBucketVersions",
    "ListObjects": "s3:ListBucket",
    "ListObjectsV2": "s3:ListBucket",
    "ListParts": "s3:ListMultipartUploadParts",
    "PutObject": "s3:PutObject",
    "PutObjectTagging": "s3:PutObjectTagging",
    "UploadPart": "s3:PutObject",
    "UploadPartCopy": "s3:PutObject",
}


# Both modules grant the nodes the same cold-tier policy: the single node (terraform/) and
# the cluster's nodes (terraform/cluster/), which make the same S3 calls under their prefix.
MODULES = (TERRAFORM, TERRAFORM / "cluster")


def granted_actions() -> set[str]:
    refs = {"var.s3_prefix": "p", "aws_s3_bucket.cold.arn": "arn:aws:s3:::b"}
    single, *others = (render_policy(Module(directory), POLICY_DOCUMENT, refs) for directory in MODULES)
    for directory, policy in zip(MODULES[1:], others, strict=True):
        assert policy == single, f"{directory}: the cold-tier policy differs from terraform/iam.tf's"
    return {action for statement in single["Statement"] for action in statement["Action"]}


# --------------------------------------------------------------------------- every path of S3Store, once


def _fail_second_part() -> Any:
    calls: list[int] = []

    def hook(**_: Any) -> None:
        calls.append(1)
        if len(calls) == 2:
            raise ClientError(
                {
                    "Error": {"Code": "InvalidPart", "Message": "injected"},
                    "ResponseMetadata": {"HTTPStatusCode": 400},
                },
                "UploadPart",
            )

    return hook


async def _every_store_path(store: S3Store) -> None:
    await store.probe_conditional_writes()
    first = await store.put("paths/a", b"first")
    await store.put("paths/a", b"second", if_match=first.etag)
    await store.put("paths/a", b"third", if_none_match=False)
    assert await store.get("paths/a", start=1, end=3) == b"hi"
    assert (await store.get_with_info("paths/a")).data == b"third"
    assert await store.head("paths/a") is not None
    body = os.urandom(MIN_PART_SIZE + 1024)
    await store.put("paths/big", body)  # multipart
    store._s3.meta.events.register("before-call.s3.UploadPart", _fail_second_part())
    with pytest.raises(ObjectStoreError):
        await store.put("paths/aborted", body)  # a failed multipart upload is aborted
    assert [info.key async for info in store.list("paths/")] == ["paths/a", "paths/big"]
    await store.delete("paths/a")
    assert await store.delete_many(["paths/big", "paths/never"]) == []


@pytest.fixture
def store_paths_taken(moto_s3: S3Endpoint) -> None:
    async def main() -> None:
        store = S3Store(
            moto_s3.bucket,
            f"iam-paths-{uuid.uuid4().hex}",
            endpoint_url=moto_s3.url,
            region=moto_s3.region,
            addressing_style="path",
            multipart_threshold=64 * 1024,
            part_size=MIN_PART_SIZE,
            retry=RetryPolicy(attempts=2, base=0.01, cap=0.02),
        )
        async with store:
            await _every_store_path(store)

    asyncio.run(main())


# --------------------------------------------------------------------------- the check


def policy_gaps(operations: set[str], granted: set[str]) -> tuple[set[str], set[str]]:
    """(actions the operations need that are not granted, granted actions no operation needs)."""
    used = {S3_OPERATION_ACTIONS[op] for op in operations}
    return used - granted, granted - used


@pytest.mark.after_s3_tests
@pytest.mark.timeout(1800)  # it may wait for another worker's longest module (conftest.py)
def test_policy_grants_exactly_what_the_code_uses(
    store_paths_taken: None, s3_operations_complete: Path
) -> None:
    recorded = s3_ops.recorded(s3_operations_complete)
    print(f"S3 operations tiered's code made this session: {sorted(recorded)}")
    unknown = recorded - set(S3_OPERATION_ACTIONS)
    assert not unknown, (
        f"map these S3 operations to their IAM action in S3_OPERATION_ACTIONS: {sorted(unknown)}"
    )
    missing, unused = policy_gaps(recorded, granted_actions())
    assert not missing, f"terraform/iam.tf does not grant what the code does: {sorted(missing)}"
    assert not unused, f"terraform/iam.tf grants what the code never does: {sorted(unused)}"
    # iam.tf documents the operations it was written for: that table must be the code's, too.
    for directory in MODULES:
        table = Module(directory).locals["tiered_s3_operation_actions"]
        assert set(table) == recorded, (
            f"local.tiered_s3_operation_actions in {directory}/iam.tf lists {sorted(set(table) - recorded)} that "
            f"the code does not make and lacks {sorted(recorded - set(table))} that it does"
        )
        assert {op: S3_OPERATION_ACTIONS[op] for op in table} == table


def test_the_comparison_names_a_missing_and_an_unused_grant() -> None:
    """The comparison above, on purpose-made gaps: a test that cannot fail is a defect."""
    operations = {"PutObject", "GetObject", "ListObjectsV2", "DeleteObject(VersionId)"}
    missing, unused = policy_gaps(operations, granted_actions())
    assert missing == {"s3:DeleteObjectVersion"}
    assert unused == {"s3:DeleteObject", "s3:AbortMultipartUpload"}


# --------------------------------------------------------------------------- enforcement on moto


def _client(backend: S3Backend, env: dict[str, str]) -> Any:
    return boto3.session.Session().client(
        "s3",
        endpoint_url=backend.url,
        region_name=backend.region,
        aws_access_key_id=env["AWS_ACCESS_KEY_ID"],
        aws_secret_access_key=env["AWS_SECRET_ACCESS_KEY"],
        config=BotoConfig(s3={"addressing_style": "path"}, retries={"total_max_attempts": 1}),
    )


def _denied(call: Any) -> bool:
    try:
        call()
    except ClientError as exc:
        assert exc.response["Error"]["Code"] == "AccessDenied", exc.response
        return True
    return False


@pytest.mark.parametrize("s3_backend", ["moto-iam"], indirect=True)
def test_enforcement_refuses_what_the_policy_does_not_grant(s3_backend: S3Backend, tmp_path: Path) -> None:
    user, admin = _client(s3_backend, s3_backend.env), _client(s3_backend, s3_backend.admin_env)
    bucket, mine = s3_backend.bucket, f"{s3_backend.prefix}/data/x"
    other = f"elsewhere-{uuid.uuid4().hex}/x"
    admin.put_object(Bucket=bucket, Key=other, Body=b"not tiered's")
    try:
        # Granted: objects and listings under the prefix.
        user.put_object(Bucket=bucket, Key=mine, Body=b"ok")
        assert user.get_object(Bucket=bucket, Key=mine)["Body"].read() == b"ok"
        assert user.list_objects_v2(Bucket=bucket, Prefix=f"{s3_backend.prefix}/")["KeyCount"] == 1
        refused = {
            "list the whole bucket": lambda: user.list_objects_v2(Bucket=bucket),
            "list another prefix": lambda: user.list_objects_v2(Bucket=bucket, Prefix="elsewhere-"),
            "list a prefix that merely starts like ours": lambda: user.list_objects_v2(
                Bucket=bucket, Prefix=s3_backend.prefix + "x/"
            ),
            "read outside the prefix": lambda: user.get_object(Bucket=bucket, Key=other),
            "write outside the prefix": lambda: user.put_object(Bucket=bucket, Key=other, Body=b"x"),
            "delete outside the prefix": lambda: user.delete_object(Bucket=bucket, Key=other),
            "delete an object version": lambda: user.delete_object(Bucket=bucket, Key=mine, VersionId="null"),
            "read the bucket policy": lambda: user.get_bucket_policy(Bucket=bucket),
            "list multipart uploads": lambda: user.list_multipart_uploads(
                Bucket=bucket, Prefix=f"{s3_backend.prefix}/"
            ),
            "list buckets": lambda: user.list_buckets(),
        }
        allowed = [what for what, call in refused.items() if not _denied(call)]
        assert allowed == [], f"granted although iam.tf does not: {allowed}"
        # A batch delete reaching outside the prefix deletes nothing there.
        result = user.delete_objects(Bucket=bucket, Delete={"Objects": [{"Key": mine}, {"Key": other}]})
        assert {e["Key"] for e in result.get("Errors", [])} >= {other}
        assert admin.get_object(Bucket=bucket, Key=other)["Body"].read() == b"not tiered's"
        # The denials are the policy's, not a broken signature: the administrator may do all of it.
        assert admin.list_objects_v2(Bucket=bucket)["KeyCount"] >= 1
        admin.get_bucket_versioning(Bucket=bucket)
    finally:
        admin.delete_object(Bucket=bucket, Key=other)

    # tiered pointed at a prefix its role does not cover refuses to start, loudly.
    args = s3_backend.serve_args()
    args[args.index("--s3-prefix") + 1] = "not-my-prefix"
    srv = ServerProcess(tmp_path / "data", *args, env=s3_backend.env)
    with pytest.raises(RuntimeError, match="exited with 1"):
        srv.start()
    assert "cannot start" in srv.log() and "AccessDenied" in srv.log(), srv.log()


# --------------------------------------------------------------------------- the evaluator moto runs


POLICY = {
    "Statement": [
        {"Effect": "Allow", "Action": ["s3:GetObject"], "Resource": ["arn:aws:s3:::b/p/*"]},
        {
            "Effect": "Allow",
            "Action": "s3:ListBucket",
            "Resource": "arn:aws:s3:::b",
            "Condition": {"StringLike": {"s3:prefix": ["p/", "p/*"]}},
        },
        {"Effect": "Deny", "Action": "s3:GetObject", "Resource": "arn:aws:s3:::b/p/secret"},
    ]
}


@pytest.mark.parametrize(
    ("action", "resource", "context", "allowed"),
    [
        ("s3:GetObject", "arn:aws:s3:::b/p/x", {}, True),
        ("S3:getobject", "arn:aws:s3:::b/p/x", {}, True),  # actions are case-insensitive
        ("s3:GetObject", "arn:aws:s3:::b/q/x", {}, False),
        ("s3:GetObject", "arn:aws:s3:::b/p/secret", {}, False),  # an explicit deny wins
        ("s3:PutObject", "arn:aws:s3:::b/p/x", {}, False),
        ("s3:ListBucket", "arn:aws:s3:::b", {"s3:prefix": "p/data/"}, True),
        ("s3:ListBucket", "arn:aws:s3:::b", {"s3:prefix": "p/"}, True),
        ("s3:ListBucket", "arn:aws:s3:::b", {"s3:prefix": "pq/"}, False),
        ("s3:ListBucket", "arn:aws:s3:::b", {}, False),  # no prefix: the condition does not hold
    ],
)
def test_policy_evaluator(action: str, resource: str, context: dict[str, str], allowed: bool) -> None:
    assert is_allowed([POLICY], action, resource, context) is allowed


def test_policy_evaluator_refuses_what_it_does_not_evaluate() -> None:
    with pytest.raises(PermissionError):
        is_allowed(
            [
                {
                    "Statement": [
                        {"Effect": "Allow", "Action": "*", "Resource": "*", "Condition": {"IpAddress": {}}}
                    ]
                }
            ],
            "s3:GetObject",
            "arn:aws:s3:::b/k",
            {},
        )
