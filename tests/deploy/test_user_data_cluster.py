"""The cluster module's user data, booted against moto: nodes install the artifact, read both secrets, form a cluster.

One instance boots for real (``tests/support/boot_support.py``: what runs and what is stubbed): the
boot script, with a local stand-in for the instance metadata service (IMDSv2: a token,
then ``instance-id`` and ``local-ipv4``), writes the node's environment file; the AWS
CLI fetches the wheelhouse and both SecureStrings from moto; tiered's config check
runs with the node's environment. Then two ``tiered serve`` processes run the rendered
``tiered.service`` command from that instance's venv and configuration - the second
with its own node id, port and data dir, as a second instance from the same launch
template would (its files would be byte-identical but for what the metadata service
answers). They serve one cluster: a token issued through one node is installed on every
shard (signed node-to-node calls, with the cluster secret from the file), appends made
through one node are read through the other, and no secret object was created in the
store (the file's secret was used).
"""

from __future__ import annotations

import json
import signal
import subprocess
import threading
import time
import uuid
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import boto3
import pytest

from tests.deploy.test_user_data import http
from tests.support.boot_support import (
    TEMPLATES,
    Instance,
    artifact_key_prefix,
    awscli,
    copy_credential,
    exec_start,
    render,
    sha256,
    ssm_client,
    upload_wheelhouse,
    wheelhouse,
)
from tests.support.s3_server import S3Endpoint
from tests.support.server_process import free_port
from tests.support.terraform_hcl import TERRAFORM, Module

pytestmark = [pytest.mark.timeout(900), pytest.mark.network]

INSTANCE_ID = "i-0a1b2c3d4e5f60718"


@pytest.fixture(scope="module")
def house(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return wheelhouse(tmp_path_factory)


@pytest.fixture(scope="module")
def aws_bin(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return awscli(tmp_path_factory)


class _Metadata(BaseHTTPRequestHandler):
    """IMDSv2 as the boot script uses it: PUT a token, then GET with it."""

    token = uuid.uuid4().hex
    answers = {"/latest/meta-data/instance-id": INSTANCE_ID, "/latest/meta-data/local-ipv4": "127.0.0.1"}

    def do_PUT(self) -> None:
        ok = self.path == "/latest/api/token" and self.headers.get("X-aws-ec2-metadata-token-ttl-seconds")
        self._answer(200 if ok else 400, self.token if ok else "")

    def do_GET(self) -> None:
        if self.headers.get("X-aws-ec2-metadata-token") != self.token:
            self._answer(401, "")
        elif self.path in self.answers:
            self._answer(200, self.answers[self.path])
        else:
            self._answer(404, "")

    def _answer(self, status: int, body: str) -> None:
        data = body.encode()
        self.send_response(status)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def metadata() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Metadata)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()


def _wait_ready(url: str, proc: subprocess.Popen[bytes], log: Path, timeout: float = 180) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert proc.poll() is None, log.read_text()
        try:
            if http("GET", url + "/readyz")[0] == 200:
                return
        except OSError:
            pass
        time.sleep(0.3)
    raise AssertionError(f"{url} did not become ready:\n{log.read_text()[-4000:]}")


def retried(
    method: str, url: str, body: bytes = b"", headers: dict[str, str] | None = None
) -> tuple[int, bytes]:
    """A client's retry of 503 + Retry-After (a node's view of a shard that just moved may name no owner
    for a moment), bounded."""
    deadline = time.monotonic() + 60
    while True:
        status, answer = http(method, url, body, headers)
        if status != 503 or time.monotonic() > deadline:
            return status, answer
        retry_after = json.loads(answer).get("error", {}).get("retry_after_s", 1) if answer else 1
        time.sleep(min(float(retry_after), 2.0))


def test_cluster_nodes_boot_from_the_artifact_read_both_secrets_and_serve_one_cluster(
    tmp_path: Path, moto_s3: S3Endpoint, house: Path, aws_bin: Path, metadata: str
) -> None:
    cluster = Module(TERRAFORM / "cluster")
    locals_ = cluster.locals
    instance = Instance(tmp_path / "instance", aws_bin, moto_s3.url, moto_s3.region)
    instance.root.mkdir()
    path = instance.path
    prefix = f"cluster-boot-{uuid.uuid4().hex[:12]}"
    port = free_port()
    artifact = artifact_key_prefix(house)
    names = {"admin": f"/{prefix}/admin-token", "cluster": f"/{prefix}/cluster-secret"}
    env_values = {
        "region": moto_s3.region,
        "artifact_bucket": moto_s3.bucket,
        "artifact_prefix": artifact,
        "artifact_sha256sums": sha256(house / "SHA256SUMS"),
        "wheelhouse": str(path(locals_["wheelhouse"])),
        "venv": str(path(locals_["venv"])),
        "config_file": str(path(locals_["config_file"])),
        "enable_units": locals_["bootstrap_env_vars"]["enable_units"],
        "start_units": locals_["bootstrap_env_vars"]["start_units"],
        "cwagent_ctl": str(instance.stubs() / "amazon-cloudwatch-agent-ctl"),
        "cwagent_config": str(path("/opt/aws/amazon-cloudwatch-agent/etc/tiered-cloudwatch-agent.json")),
        "admin_token_parameter": names["admin"],
        "admin_token_file": str(path(locals_["admin_token_host_file"])),
        "cluster_secret_parameter": names["cluster"],
        "cluster_secret_file": str(path(locals_["cluster_secret_host_file"])),
        "node_env_file": str(path(locals_["node_env_file"])),
        "imds_endpoint": metadata,
        "port": port,
        "mount_point": str(path(locals_["data_dir"])),
        "data_dir": str(path(locals_["data_dir"])),
        "hot_volume_id": "",
        "volume_attach_timeout_s": 0,
    }
    assert set(env_values) == set(locals_["bootstrap_env_vars"]), "cluster/compute.tf's bootstrap env changed"
    toml_values = {
        "port": port,
        "data_dir": env_values["data_dir"],
        "fsync": "interval",
        "max_hot_bytes": 1 << 30,
        "log_level": "info",
        "s3_bucket": moto_s3.bucket,
        "s3_prefix": prefix,
        "s3_region": moto_s3.region,
        "admin_token_file": str(path(locals_["admin_token_credential_file"])),
        "auth": "tokens",
        "public_url": "",
    }
    cluster_values = {
        "shards": 4,
        "lease_ttl_s": 4,
        "cluster_secret_file": str(path(locals_["cluster_secret_credential_file"])),
    }
    assert set(toml_values) == set(locals_["tiered_toml_vars"])
    assert set(cluster_values) == set(locals_["cluster_toml_vars"])
    libexec = str(path(locals_["libexec"]))
    unit_values = {
        "venv": env_values["venv"],
        "config_file": env_values["config_file"],
        "data_dir": env_values["data_dir"],
        "libexec": libexec,
        "admin_token_host_file": env_values["admin_token_file"],
        "port": port,
        "gc_timer_interval": "15min",
        "requires": locals_["unit_vars"]["requires"],
        "cluster_service_lines": "\n".join(
            [
                f"LoadCredential=cluster-secret:{env_values['cluster_secret_file']}",
                f"EnvironmentFile={env_values['node_env_file']}",
                "StateDirectory=tiered",
                "StateDirectoryMode=0750",
            ]
        ),
    }
    assert set(unit_values) == set(locals_["unit_vars"])

    # cloud-init's write_files (cluster/compute.tf's cloud_config).
    instance.write("/etc/tiered/bootstrap.env", render(TEMPLATES / "bootstrap.env.tftpl", env_values))
    instance.write(
        locals_["config_file"],
        render(TEMPLATES / "tiered.toml.tftpl", toml_values)
        + render(TEMPLATES / "tiered-cluster.toml.tftpl", cluster_values),
    )
    instance.write(f"{locals_['libexec']}/user-data", (TEMPLATES / "user-data.sh").read_text(), 0o755)
    instance.write(f"{locals_['libexec']}/secrets", (TEMPLATES / "secrets.sh").read_text(), 0o755)
    for unit in ("tiered-secrets.service", "tiered.service"):
        instance.write(f"/etc/systemd/system/{unit}", render(TEMPLATES / f"{unit}.tftpl", unit_values))
    s3 = boto3.client("s3", endpoint_url=moto_s3.url, region_name=moto_s3.region)
    upload_wheelhouse(s3, moto_s3.bucket, house, artifact)
    admin_token, secret = uuid.uuid4().hex, uuid.uuid4().hex + uuid.uuid4().hex
    ssm = ssm_client(moto_s3.url, moto_s3.region)
    ssm.put_parameter(Name=names["admin"], Type="SecureString", Value=admin_token)
    ssm.put_parameter(Name=names["cluster"], Type="SecureString", Value=secret)

    # runcmd: the boot script, once.
    bootstrap = str(path("/etc/tiered/bootstrap.env"))
    boot = instance.run(f"{locals_['libexec']}/user-data", bootstrap)
    assert boot.returncode == 0, boot.stdout + boot.stderr
    node_env = Path(env_values["node_env_file"]).read_text()
    assert node_env == (
        f"TIERED_CLUSTER_NODE_ID={INSTANCE_ID}\nTIERED_CLUSTER_ADVERTISE_URL=http://127.0.0.1:{port}\n"
    )
    systemctl = [c for c in instance.stub_calls() if c.startswith("systemctl ")]
    assert systemctl == [
        "systemctl daemon-reload",
        "systemctl enable tiered-secrets.service tiered.service",
        "systemctl start tiered.service",
    ]

    # tiered-secrets.service, for real against moto's SSM: both secrets, root-only.
    secrets = instance.run(f"{locals_['libexec']}/secrets", bootstrap, timeout=120)
    assert secrets.returncode == 0, secrets.stderr
    assert Path(env_values["cluster_secret_file"]).read_text().strip() == secret
    assert Path(env_values["cluster_secret_file"]).stat().st_mode & 0o777 == 0o600
    # tiered.service: LoadCredential= (both), EnvironmentFile=, StateDirectory=, ExecStart.
    unit = path("/etc/systemd/system/tiered.service").read_text()
    copy_credential(instance, locals_["admin_token_host_file"], "tiered.service", "admin-token")
    copy_credential(instance, locals_["cluster_secret_host_file"], "tiered.service", "cluster-secret")
    command = exec_start(unit)
    base_env = instance.environment()
    base_env.update(
        TIERED_S3_ENDPOINT=moto_s3.url, TIERED_S3_ADDRESSING_STYLE="path", TIERED_HOST="127.0.0.1"
    )
    nodes: list[tuple[str, subprocess.Popen[bytes], Path]] = []
    try:
        for index, node_id in enumerate((INSTANCE_ID, "i-0ffffffffffffffff")):
            env = dict(base_env)
            if index == 0:
                env.update(dict(line.split("=", 1) for line in node_env.splitlines()))
                node_port, data = port, Path(env_values["data_dir"])
            else:  # a second instance: what its metadata service would have answered
                node_port, data = free_port(), path("/var/lib/tiered-second")
                env.update(
                    TIERED_CLUSTER_NODE_ID=node_id,
                    TIERED_CLUSTER_ADVERTISE_URL=f"http://127.0.0.1:{node_port}",
                    TIERED_PORT=str(node_port),
                    TIERED_DATA_DIR=str(data),
                )
            data.mkdir(mode=0o750, parents=True)  # StateDirectory=tiered
            log = instance.root / f"tiered-{index}.log"
            proc = subprocess.Popen(
                command, cwd=instance.root, env=env, stdout=open(log, "ab"), stderr=subprocess.STDOUT
            )
            nodes.append((f"http://127.0.0.1:{node_port}", proc, log))
        for url, proc, log in nodes:
            _wait_ready(url, proc, log)
        (a, _, _), (b, _, _) = nodes
        readyz = json.loads(http("GET", a + "/readyz")[1])
        assert readyz["checks"]["durability"] == "object-store", readyz

        admin = {"Authorization": f"Bearer {admin_token}", "Content-Type": "application/json"}
        status, body = retried(
            "POST",
            a + "/v1/admin/tokens",
            json.dumps({"bucket": "default", "scope": "write"}).encode(),
            admin,
        )
        assert status == 201, body  # installed on every shard, across both nodes (signed calls)
        writer = {"Authorization": f"Bearer {json.loads(body)['token']}", "Content-Type": "text/plain"}
        streams = {f"s{i}": f"line {i} through one node".encode() for i in range(6)}  # on both nodes' shards
        for name, data_bytes in streams.items():
            assert retried("PUT", f"{a}/v1/stream/{name}", b"", writer)[0] == 201
            assert retried("POST", f"{a}/v1/stream/{name}", data_bytes, writer)[0] in (200, 204)
        for name, data_bytes in streams.items():
            assert retried("GET", f"{b}/v1/stream/{name}?offset=-1", headers=writer) == (200, data_bytes), (
                name
            )
        listed = s3.list_objects_v2(Bucket=moto_s3.bucket, Prefix=f"{prefix}/_tiered/cluster/")
        keys = {o["Key"] for o in listed.get("Contents", [])}
        assert f"{prefix}/_tiered/cluster/cluster.json" in keys
        assert f"{prefix}/_tiered/cluster/secret.json" not in keys  # the file's secret, not the store's
    finally:
        for _, proc, _ in nodes:
            proc.send_signal(signal.SIGTERM)
        codes = []
        for _, proc, _ in nodes:
            try:
                codes.append(proc.wait(timeout=90))
            except subprocess.TimeoutExpired:
                proc.kill()
                codes.append(None)
    assert codes == [0, 0], [log.read_text()[-2000:] for _, _, log in nodes]
