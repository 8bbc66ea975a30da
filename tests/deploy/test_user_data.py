"""The single-node module's user data, booted for real against moto: the node installs the artifact and serves.

See ``tests/support/boot_support.py`` for what runs for real and what is stubbed (systemctl, dnf,
user creation, the CloudWatch agent, the EBS attach) and why. The wheelhouse is the
one .ci/run built (``TIERED_WHEELHOUSE``) or one built here with
deploy/build-artifact.sh; the AWS CLI is installed from PyPI into a venv of its own.
"""

from __future__ import annotations

import json
import re
import signal
import subprocess
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import boto3
import pytest

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
from tests.support.lockfiles import LOCKS, read_lock
from tests.support.s3_server import S3Endpoint
from tests.support.server_process import free_port
from tests.support.terraform_hcl import TERRAFORM, Module

pytestmark = [pytest.mark.timeout(900), pytest.mark.network]


@pytest.fixture(scope="module")
def house(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return wheelhouse(tmp_path_factory)


@pytest.fixture(scope="module")
def aws_bin(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return awscli(tmp_path_factory)


@pytest.fixture(scope="module")
def module() -> Module:
    return Module(TERRAFORM)


def http(
    method: str, url: str, body: bytes = b"", headers: dict[str, str] | None = None
) -> tuple[int, bytes]:
    request = urllib.request.Request(url, data=body if method in ("POST", "PUT") else None, method=method)
    for name, value in (headers or {}).items():
        request.add_header(name, value)
    try:
        with urllib.request.urlopen(request, timeout=10) as answer:
            return answer.status, answer.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


class Node:
    """One instance of the single-node module, laid out under a temporary root."""

    def __init__(self, module: Module, instance: Instance, moto: S3Endpoint, house: Path) -> None:
        self.module, self.instance, self.moto, self.house = module, instance, moto, house
        self.prefix = f"user-data-{uuid.uuid4().hex[:12]}"
        self.parameter = f"/{self.prefix}/admin-token"
        self.port = free_port()
        self.artifact_prefix = artifact_key_prefix(house)
        locals_ = module.locals
        path = instance.path
        # compute.tf's locals, with the paths moved under the temporary root.
        self.bootstrap_env = str(path("/etc/tiered/bootstrap.env"))
        self.env_values = {
            "region": moto.region,
            "artifact_bucket": moto.bucket,
            "artifact_prefix": self.artifact_prefix,
            "artifact_sha256sums": sha256(house / "SHA256SUMS"),
            "wheelhouse": str(path(locals_["wheelhouse"])),
            "venv": str(path(locals_["venv"])),
            "config_file": str(path(locals_["config_file"])),
            "enable_units": locals_["bootstrap_env_vars"]["enable_units"],
            "start_units": locals_["bootstrap_env_vars"]["start_units"],
            "cwagent_ctl": str(instance.stubs() / "amazon-cloudwatch-agent-ctl"),
            "cwagent_config": str(path("/opt/aws/amazon-cloudwatch-agent/etc/tiered-cloudwatch-agent.json")),
            "admin_token_parameter": self.parameter,
            "admin_token_file": str(path(locals_["admin_token_host_file"])),
            "cluster_secret_parameter": "",
            "cluster_secret_file": "",
            "node_env_file": "",
            "imds_endpoint": "http://169.254.169.254",
            "port": self.port,
            "mount_point": str(path(locals_["mount_point"])),
            "data_dir": str(path(f"{locals_['mount_point']}/data")),
            "hot_volume_id": "vol-0123456789abcdef0",
            "volume_attach_timeout_s": 900,
        }
        assert set(self.env_values) == set(locals_["bootstrap_env_vars"]), (
            "compute.tf's bootstrap env changed"
        )
        self.unit_values = {
            "venv": self.env_values["venv"],
            "config_file": self.env_values["config_file"],
            "data_dir": self.env_values["data_dir"],
            "libexec": str(path(locals_["libexec"])),
            "admin_token_host_file": self.env_values["admin_token_file"],
            "port": self.port,
            "gc_timer_interval": "15min",
            "requires": locals_["unit_vars"]["requires"],
            "cluster_service_lines": locals_["unit_vars"]["cluster_service_lines"],
        }
        assert set(self.unit_values) == set(locals_["unit_vars"])
        self.credential = str(path(locals_["admin_token_credential_file"]))
        self.toml_values = {
            "port": self.port,
            "data_dir": self.env_values["data_dir"],
            "fsync": "always",
            "max_hot_bytes": 1 << 30,
            "log_level": "info",
            "s3_bucket": moto.bucket,
            "s3_prefix": self.prefix,
            "s3_region": moto.region,
            "admin_token_file": self.credential,
            "auth": "tokens",
            "public_url": "",
        }
        assert set(self.toml_values) == set(locals_["tiered_toml_vars"])
        self.server: subprocess.Popen[bytes] | None = None

    def lay_out(self) -> None:
        """What cloud-init's write_files does (compute.tf's cloud_config)."""
        i, libexec = self.instance, self.unit_values["libexec"]
        i.write("/etc/tiered/bootstrap.env", render(TEMPLATES / "bootstrap.env.tftpl", self.env_values))
        i.write(self.module.locals["config_file"], render(TEMPLATES / "tiered.toml.tftpl", self.toml_values))
        for script, name in (
            ("user-data.sh", "user-data"),
            ("hot-volume.sh", "hot-volume"),
            ("secrets.sh", "secrets"),
        ):
            i.write(f"{libexec}/{name}", (TEMPLATES / script).read_text(), 0o755)
        for unit in (
            "tiered-hot-volume.service",
            "tiered-secrets.service",
            "tiered.service",
            "tiered-gc.service",
        ):
            i.write(f"/etc/systemd/system/{unit}", render(TEMPLATES / f"{unit}.tftpl", self.unit_values))

    def boot(self) -> subprocess.CompletedProcess[str]:
        """cloud-init's runcmd: the boot script, once."""
        return self.instance.run(f"{self.unit_values['libexec']}/user-data", self.bootstrap_env)

    def start_units(self, admin_token: str) -> str:
        """What systemd does for `systemctl start tiered.service`; returns the URL tiered serves."""
        i = self.instance
        ssm_client(self.moto.url, self.moto.region).put_parameter(
            Name=self.parameter, Type="SecureString", Value=admin_token
        )
        # tiered-secrets.service: the script itself, against moto's SSM.
        secrets = i.run(f"{self.unit_values['libexec']}/secrets", self.bootstrap_env, timeout=120)
        assert secrets.returncode == 0, secrets.stderr
        token_file = Path(self.env_values["admin_token_file"])
        assert token_file.read_text().strip() == admin_token
        assert token_file.stat().st_mode & 0o777 == 0o600
        # tiered-hot-volume.service: attaching an EBS volume cannot happen here; the data dir is made.
        Path(self.env_values["data_dir"]).mkdir(parents=True)
        # tiered.service: LoadCredential=, then ExecStart.
        unit = i.path("/etc/systemd/system/tiered.service").read_text()
        assert f"LoadCredential=admin-token:{self.env_values['admin_token_file']}" in unit
        copy_credential(i, self.module.locals["admin_token_host_file"], "tiered.service", "admin-token")
        command = exec_start(unit)
        assert command[0] == f"{self.env_values['venv']}/bin/tiered"
        env = i.environment()
        env.update(
            TIERED_S3_ENDPOINT=self.moto.url,
            TIERED_S3_ADDRESSING_STYLE="path",
            TIERED_HOST="127.0.0.1",  # the template listens on 0.0.0.0; tests talk to loopback only
        )
        log = open(i.root / "tiered.log", "ab")
        self.server = subprocess.Popen(command, cwd=i.root, env=env, stdout=log, stderr=subprocess.STDOUT)
        url = f"http://127.0.0.1:{self.port}"
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            assert self.server.poll() is None, (i.root / "tiered.log").read_text()
            try:
                if http("GET", url + "/readyz")[0] == 200:
                    return url
            except OSError:
                pass
            time.sleep(0.2)
        raise AssertionError(f"tiered did not become ready:\n{(i.root / 'tiered.log').read_text()}")

    def stop(self) -> int | None:
        if self.server is None:
            return None
        self.server.send_signal(signal.SIGTERM)
        try:
            return self.server.wait(timeout=90)
        finally:
            if self.server.poll() is None:
                self.server.kill()


@pytest.fixture
def node(tmp_path: Path, module: Module, moto_s3: S3Endpoint, house: Path, aws_bin: Path) -> Iterator[Node]:
    instance = Instance(tmp_path / "instance", aws_bin, moto_s3.url, moto_s3.region)
    instance.root.mkdir()
    node = Node(module, instance, moto_s3, house)
    node.lay_out()
    try:
        yield node
    finally:
        node.stop()


def _s3(moto: S3Endpoint) -> Any:
    return boto3.client("s3", endpoint_url=moto.url, region_name=moto.region)


def test_the_node_boots_from_the_artifact_in_the_bucket_and_serves(
    node: Node, moto_s3: S3Endpoint, house: Path
) -> None:
    upload_wheelhouse(_s3(moto_s3), moto_s3.bucket, house, node.artifact_prefix)
    boot = node.boot()
    assert boot.returncode == 0, boot.stdout + boot.stderr
    # What the stubs were asked to do, in order: packages, the user, the agent, the units.
    calls = node.instance.stub_calls()
    assert calls[0].startswith("dnf install -y python3.11")
    assert any(c.startswith("useradd --system") for c in calls)
    assert any(c.startswith("amazon-cloudwatch-agent-ctl -a fetch-config") for c in calls)
    systemctl = [c for c in calls if c.startswith("systemctl ")]
    assert systemctl == [
        "systemctl daemon-reload",
        "systemctl enable " + node.env_values["enable_units"],
        "systemctl start " + node.env_values["start_units"],
    ]
    # Every instance of this deployment runs exactly the locked libraries and this wheel.
    venv = Path(node.env_values["venv"])
    frozen = subprocess.run(
        [str(venv / "bin" / "pip"), "list", "--format=json", "--disable-pip-version-check"],
        capture_output=True,
        text=True,
        check=True,
    )
    installed = {p["name"].lower().replace("_", "-"): p["version"] for p in json.loads(frozen.stdout)}
    manifest = json.loads((house / "wheelhouse.json").read_text())
    assert installed.pop("tiered") == manifest["tiered_version"]
    for tool in ("pip", "setuptools"):
        installed.pop(tool, None)
    locked = {name: pin.version for name, pin in read_lock(LOCKS / "runtime.txt").items()}
    assert installed == locked

    token = uuid.uuid4().hex
    url = node.start_units(token)
    admin = {"Authorization": f"Bearer {token}", "Content-Type": "application/json"}
    status, body = http(
        "POST", url + "/v1/admin/tokens", json.dumps({"bucket": "default", "scope": "write"}).encode(), admin
    )
    assert status == 201, body
    writer = {"Authorization": f"Bearer {json.loads(body)['token']}", "Content-Type": "text/plain"}
    assert http("PUT", url + "/v1/stream/booted", b"", writer)[0] == 201
    assert http("POST", url + "/v1/stream/booted", b"first line from the artifact", writer)[0] in (200, 204)
    status, body = http("GET", url + "/v1/stream/booted?offset=-1", headers=writer)
    assert (status, body) == (200, b"first line from the artifact")
    # Unauthenticated requests are refused: the node is not open because it booted.
    assert http("GET", url + "/v1/stream/booted?offset=-1")[0] == 401
    # tiered claimed its prefix in the bucket: it runs on S3, as configured.
    keys = [
        o["Key"]
        for o in _s3(moto_s3).list_objects_v2(Bucket=moto_s3.bucket, Prefix=node.prefix + "/")["Contents"]
    ]
    assert f"{node.prefix}/_tiered/claim.json" in keys
    assert node.stop() == 0


@pytest.mark.parametrize("tamper", ["a file differs", "a file too many", "SHA256SUMS differs"])
def test_a_tampered_artifact_is_refused_before_anything_is_installed(
    tamper: str, node: Node, moto_s3: S3Endpoint, tmp_path: Path
) -> None:
    # A small wheelhouse of its own: the checks come before pip, whatever the files hold.
    good = tmp_path / "good"
    good.mkdir()
    (good / "a-1.0-py3-none-any.whl").write_bytes(b"wheel bytes")
    (good / "requirements.txt").write_text("a==1.0\n")
    (good / "SHA256SUMS").write_text(
        "".join(f"{sha256(good / n)}  {n}\n" for n in ("a-1.0-py3-none-any.whl", "requirements.txt"))
    )
    node.env_values["artifact_sha256sums"] = sha256(good / "SHA256SUMS")
    # A prefix of its own: under the real wheelhouse's, its files would stay in the session's bucket and
    # make every later boot from that wheelhouse fail ("does not match SHA256SUMS": a file too many).
    node.artifact_prefix = node.env_values["artifact_prefix"] = f"artifacts/tampered-{uuid.uuid4().hex[:12]}"
    node.lay_out()
    s3 = _s3(moto_s3)
    for f in good.iterdir():
        s3.upload_file(str(f), moto_s3.bucket, f"{node.artifact_prefix}/{f.name}")
    if tamper == "a file differs":
        s3.put_object(
            Bucket=moto_s3.bucket, Key=f"{node.artifact_prefix}/a-1.0-py3-none-any.whl", Body=b"evil"
        )
        expected = "does not match SHA256SUMS"
    elif tamper == "a file too many":
        s3.put_object(Bucket=moto_s3.bucket, Key=f"{node.artifact_prefix}/b-1.0-py3-none-any.whl", Body=b"x")
        expected = "does not match SHA256SUMS"
    else:
        s3.put_object(Bucket=moto_s3.bucket, Key=f"{node.artifact_prefix}/SHA256SUMS", Body=b"")
        expected = f"not the {node.env_values['artifact_sha256sums']} this deployment recorded"
    boot = node.boot()
    assert boot.returncode != 0
    assert expected in boot.stderr, boot.stderr
    assert not Path(node.env_values["venv"]).exists()
    assert not [c for c in node.instance.stub_calls() if c.startswith("systemctl")]


def test_the_boot_script_takes_its_inputs_only_from_the_env_file() -> None:
    script = (TEMPLATES / "user-data.sh").read_text()
    used = set(re.findall(r"\$\{?([A-Z][A-Z0-9_]+)", script))
    declared = set(re.findall(r"^([A-Z][A-Z0-9_]+)=", (TEMPLATES / "bootstrap.env.tftpl").read_text(), re.M))
    assert used <= declared, f"user-data.sh reads {sorted(used - declared)}, which bootstrap.env does not set"
