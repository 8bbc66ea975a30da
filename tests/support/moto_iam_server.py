"""moto's S3 and IAM with IAM enforcement on, evaluating policies the way AWS does (run as a script).

    python tests/support/moto_iam_server.py

starts moto on 127.0.0.1 (a free port), creates an administrator user and one
bucket, turns request authentication and authorization on (moto's
``INITIAL_NO_AUTH_ACTION_COUNT`` setting, flipped to 0 once set up), prints one
JSON line ``{"url", "bucket", "region", "admin_access_key", "admin_secret_key"}``
and serves until stdin closes or SIGTERM. Tests then create IAM users with the
policy rendered from ``terraform/iam.tf`` and run the cold tier with their keys.

It runs in its own process because moto's auth switch is process-wide: the
other tests share an unauthenticated moto in the pytest process.

moto 5 departs from AWS in three ways that would make the pass meaningless or
impossible; this script corrects them, and ``tests/deploy/test_iam_policy.py`` pins each
correction with a request that must be refused:

* conditions: moto ignores ``StringLike`` and never supplies ``s3:prefix``, so
  ``s3:ListBucket`` conditioned on the prefix would allow listing the whole
  bucket. Here statements are evaluated with AWS's rules (explicit deny wins;
  a condition on a key the request lacks does not hold; an unknown condition
  operator refuses the request) and ``s3:prefix`` is taken from the listing.
* DeleteObjects: moto authorizes ``s3:DeleteObject`` on the *bucket* ARN and
  then refuses every key; AWS authorizes each key's ARN. Here each key is
  authorized (a batch with any key outside the policy is refused whole, which
  is stricter than AWS, never looser).
* a failed condition makes moto *deny* the request outright (even for an
  Allow statement); AWS just does not apply the statement.

And one bug in its signature check: moto re-signs the request from a URL whose
query string werkzeug has partly decoded ('/' in ``prefix=a%2Fb``), so every
listing under a prefix fails with SignatureDoesNotMatch. Here the query is
re-encoded the way SigV4 canonicalizes it before the signature is computed.
"""

from __future__ import annotations

import fnmatch
import json
import logging
import signal
import sys
import threading
from typing import Any
from urllib.parse import parse_qs, quote, unquote, urlsplit, urlunsplit

import boto3
import xmltodict
from moto import settings
from moto.iam.access_control import IAMPolicy, S3IAMRequest
from moto.s3.exceptions import BucketAccessDeniedError, S3AccessDeniedError
from moto.s3.responses import S3Response
from moto.server import ThreadedMotoServer

BUCKET = "tiered-iam"
REGION = "us-east-1"
ADMIN = "tiered-test-admin"


def _wildcard(pattern: str, value: str, *, ignore_case: bool = False) -> bool:
    """IAM wildcards: '*' any run of characters, '?' one character."""
    if ignore_case:
        pattern, value = pattern.lower(), value.lower()
    return fnmatch.fnmatchcase(value, pattern.replace("[", "[[]"))


# Operators this evaluator implements; any other one refuses the request (fail closed).
_STRING_OPERATORS = {
    "StringEquals": lambda expected, actual: actual == expected,
    "StringLike": lambda expected, actual: _wildcard(expected, actual),
}


def _as_list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else [value]


def _condition_holds(conditions: dict[str, dict[str, Any]], context: dict[str, str]) -> bool:
    for operator, keys in conditions.items():
        compare = _STRING_OPERATORS.get(operator)
        if compare is None:
            raise PermissionError(f"condition operator {operator} is not evaluated here: refusing")
        for key, expected in keys.items():
            if key not in context:
                return False  # AWS: a key the request does not carry does not match
            if not any(compare(str(e), context[key]) for e in _as_list(expected)):
                return False
    return True


def is_allowed(policies: list[dict[str, Any]], action: str, resource: str, context: dict[str, str]) -> bool:
    """AWS's evaluation for identity policies: an explicit Deny wins, else any Allow, else deny."""
    allowed = False
    for policy in policies:
        for statement in _as_list(policy["Statement"]):
            if "NotAction" in statement or "NotResource" in statement or "Principal" in statement:
                raise PermissionError("NotAction, NotResource and Principal are not evaluated here: refusing")
            if not any(_wildcard(a, action, ignore_case=True) for a in _as_list(statement["Action"])):
                continue
            if not any(_wildcard(r, resource) for r in _as_list(statement["Resource"])):
                continue
            if not _condition_holds(statement.get("Condition", {}), context):
                continue
            if statement["Effect"] == "Deny":
                return False
            allowed = True
    return allowed


def _check_action_permitted(self: S3IAMRequest, resource: str) -> None:
    context: dict[str, str] = {}
    if self._action == "s3:ListBucket":
        query = parse_qs(urlsplit(self._path).query, keep_blank_values=True)
        if "prefix" in query:
            context["s3:prefix"] = query["prefix"][0]
    policies = [IAMPolicy(p)._policy_json for p in self._access_key.collect_policies()]
    try:
        allowed = is_allowed(policies, self._action, resource, context)
    except PermissionError:
        allowed = False
    if not allowed:
        self._raise_access_denied()


_create_aws_request = S3IAMRequest._create_aws_request


def _create_aws_request_sigv4_query(self: S3IAMRequest) -> Any:
    request = _create_aws_request(self)
    parts = urlsplit(request.url)
    if parts.query:
        pairs = [pair.partition("=") for pair in parts.query.split("&")]
        query = "&".join(f"{_sigv4_quote(k)}={_sigv4_quote(v)}" for k, _, v in pairs)
        request.url = urlunsplit(parts._replace(query=query))
    return request


def _sigv4_quote(text: str) -> str:
    return quote(unquote(text), safe="-_.~")


_authorize_s3 = S3Response._authenticate_and_authorize_s3_action


def _authorize_s3_per_key(
    self: S3Response, bucket_name: str | None = None, key_name: str | None = None
) -> None:
    if (
        key_name is None
        and bucket_name
        and self.data.get("Action") == "DeleteObject"
        and self.is_delete_keys()
    ):
        objects = xmltodict.parse(self.body)["Delete"].get("Object", [])
        for obj in _as_list(objects):
            try:
                _authorize_s3(self, bucket_name=bucket_name, key_name=obj["Key"])
            except (S3AccessDeniedError, BucketAccessDeniedError):
                raise BucketAccessDeniedError(bucket=bucket_name) from None
        return
    _authorize_s3(self, bucket_name=bucket_name, key_name=key_name)


def main() -> None:
    logging.getLogger("werkzeug").setLevel(logging.ERROR)
    S3IAMRequest.check_action_permitted = _check_action_permitted  # type: ignore[method-assign]
    S3IAMRequest._create_aws_request = _create_aws_request_sigv4_query  # type: ignore[method-assign]
    S3Response._authenticate_and_authorize_s3_action = _authorize_s3_per_key  # type: ignore[method-assign]
    settings.INITIAL_NO_AUTH_ACTION_COUNT = float("inf")
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    url = f"http://{host}:{port}"
    anonymous = {"aws_access_key_id": "bootstrap", "aws_secret_access_key": "bootstrap"}
    iam = boto3.client("iam", endpoint_url=url, region_name=REGION, **anonymous)
    iam.create_user(UserName=ADMIN)
    iam.put_user_policy(
        UserName=ADMIN,
        PolicyName="everything",
        PolicyDocument=json.dumps(
            {"Version": "2012-10-17", "Statement": [{"Effect": "Allow", "Action": "*", "Resource": "*"}]}
        ),
    )
    key = iam.create_access_key(UserName=ADMIN)["AccessKey"]
    boto3.client("s3", endpoint_url=url, region_name=REGION, **anonymous).create_bucket(Bucket=BUCKET)
    settings.INITIAL_NO_AUTH_ACTION_COUNT = 0  # from now on every request is signed and authorized
    print(
        json.dumps(
            {
                "url": url,
                "bucket": BUCKET,
                "region": REGION,
                "admin_access_key": key["AccessKeyId"],
                "admin_secret_key": key["SecretAccessKey"],
            }
        ),
        flush=True,
    )
    done = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: done.set())
    threading.Thread(target=lambda: (sys.stdin.read(), done.set()), daemon=True).start()
    done.wait()
    server.stop()


if __name__ == "__main__":
    main()
