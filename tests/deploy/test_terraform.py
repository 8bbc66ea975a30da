"""Offline checks of the Terraform module in terraform/ (no terraform binary, no providers).

Every .tf file of the module and of its example is parsed with python-hcl2; the
checks below are about what the HCL says: references resolve, the bucket and the
IAM policy are what the README promises, and the tiered.toml template renders to
a file tiered's own config loader accepts.
"""

from __future__ import annotations

import dataclasses
import json
import re
import subprocess
from pathlib import Path
from typing import Any

import pytest

from tests.support.terraform_hcl import TERRAFORM, Module
from tests.support.terraform_hcl import as_list as _as_list
from tests.support.terraform_hcl import blocks as _blocks
from tests.support.terraform_hcl import one as _one
from tests.support.terraform_hcl import statements as _statements
from tests.support.terraform_hcl import strings as _strings
from tiered.core.config import Config, ConfigError, load_config

MODULE = TERRAFORM
EXAMPLE = TERRAFORM / "examples" / "single-node"
TEMPLATES = TERRAFORM / "templates"

# The S3 API operations tiered's code issues, and the only IAM actions they need.
S3_OPERATIONS = {
    "PutObject": "s3:PutObject",
    "CreateMultipartUpload": "s3:PutObject",
    "UploadPart": "s3:PutObject",
    "CompleteMultipartUpload": "s3:PutObject",
    "GetObject": "s3:GetObject",
    "HeadObject": "s3:GetObject",
    "DeleteObject": "s3:DeleteObject",
    "DeleteObjects": "s3:DeleteObject",
    "ListObjectsV2": "s3:ListBucket",
    "AbortMultipartUpload": "s3:AbortMultipartUpload",
}
S3_ACTIONS = set(S3_OPERATIONS.values())

REQUIRED_MODULE_FILES = [
    "versions.tf",
    "variables.tf",
    "s3.tf",
    "iam.tf",
    "network.tf",
    "compute.tf",
    "monitoring.tf",
    "outputs.tf",
]


def _placeholders(text: str) -> set[str]:
    return set(re.findall(r"(?<!\$)\$\{([A-Za-z_][A-Za-z0-9_]*)\}", text))


def _render(template: Path, values: dict[str, Any]) -> str:
    """Terraform's templatefile for templates that only use plain ${name} interpolation."""
    text = template.read_text()
    assert "%{" not in text, f"{template.name} uses template directives; keep it to ${{name}}"
    missing = _placeholders(text) - set(values)
    assert not missing, f"no example value for {sorted(missing)} in {template.name}"

    def value(m: re.Match[str]) -> str:
        v = values[m.group(1)]
        return ("true" if v else "false") if isinstance(v, bool) else str(v)

    rendered = re.sub(r"(?<!\$)\$\{([A-Za-z_][A-Za-z0-9_]*)\}", value, text)
    return rendered.replace("$${", "${")


@pytest.fixture(scope="module")
def module() -> Module:
    return Module(MODULE)


@pytest.fixture(scope="module")
def example() -> Module:
    return Module(EXAMPLE)


REFS = {
    "var": re.compile(r"(?<![\w.])var\.([A-Za-z_][\w-]*)"),
    "local": re.compile(r"(?<![\w.])local\.([A-Za-z_][\w-]*)"),
    "data": re.compile(r"(?<![\w.])data\.([A-Za-z_][\w-]*)\.([A-Za-z_][\w-]*)"),
    "module": re.compile(r"(?<![\w.])module\.([A-Za-z_][\w-]*)(?:\.([A-Za-z_][\w-]*))?"),
    "resource": re.compile(r"(?<![\w.])(aws_[a-z0-9_]+)\.([A-Za-z_][\w-]*)"),
    "ephemeral": re.compile(r"(?<![\w.])ephemeral\.(aws_[a-z0-9_]+)\.([A-Za-z_][\w-]*)"),
}


def _refs(module: Module, kind: str, **kwargs: bool) -> set[tuple[str, ...]]:
    found: set[tuple[str, ...]] = set()
    for text in module.strings(**kwargs):
        for m in REFS[kind].finditer(text):
            found.add(tuple(g for g in m.groups() if g is not None))
    return found


# ---------------------------------------------------------------- layout, pins, references


def test_module_layout_is_complete(module: Module, example: Module) -> None:
    names = {p.name for p in module.files}
    assert set(REQUIRED_MODULE_FILES) <= names
    assert (TERRAFORM / "README.md").is_file()
    assert (TERRAFORM / "checks.sh").stat().st_mode & 0o111, "checks.sh must be executable"
    assert "main.tf" in {p.name for p in example.files}
    assert (EXAMPLE / "terraform.tfvars.example").is_file()
    assert (EXAMPLE / "backend.tf.example").is_file()
    # No account-specific backend is committed: the only backend is the example file.
    for mod in (module, example):
        for block in mod.terraform:
            assert "backend" not in block, f"a backend block is committed in {mod.directory}"
    for mod in (module, example):
        assert mod.resources or mod.modules, f"nothing parsed in {mod.directory}"


@pytest.mark.parametrize("which", ["module", "example"])
def test_providers_and_terraform_are_pinned(which: str, module: Module, example: Module) -> None:
    mod = module if which == "module" else example
    settings = [b for b in mod.terraform if "required_providers" in b]
    assert len(settings) == 1
    # Write-only attributes (the admin token never in the state) need Terraform 1.11.
    assert re.search(r">=\s*1\.1[1-9]", settings[0]["required_version"])
    providers = settings[0]["required_providers"]
    providers = providers[0] if isinstance(providers, list) else providers
    # The AWS provider only, so `terraform validate` runs wherever that one is available.
    assert set(providers) == {"aws"}
    for name, spec in providers.items():
        assert spec["source"] == f"hashicorp/{name}"
        # Exact, or "~> MAJOR.MINOR" (no open-ended >=).
        assert re.fullmatch(r"(~>\s*)?\d+\.\d+(\.\d+)?", spec["version"]), (
            f"{name}: {spec['version']!r} is not pinned"
        )


@pytest.mark.parametrize("which", ["module", "example"])
def test_variables_are_typed_described_declared_and_used(which: str, module: Module, example: Module) -> None:
    mod = module if which == "module" else example
    assert mod.variables
    for name, body in mod.variables.items():
        assert body.get("type"), f"variable {name} has no type"
        assert str(body.get("description", "")).strip(), f"variable {name} has no description"
    declared = set(mod.variables)
    referenced = {r[0] for r in _refs(mod, "var")}
    used = {r[0] for r in _refs(mod, "var", skip_variable_blocks=True)}
    assert referenced <= declared, f"undeclared variables referenced: {sorted(referenced - declared)}"
    assert declared <= used, f"variables declared but never used: {sorted(declared - used)}"


@pytest.mark.parametrize("which", ["module", "example"])
def test_every_reference_resolves(which: str, module: Module, example: Module) -> None:
    mod = module if which == "module" else example
    locals_used = {r[0] for r in _refs(mod, "local")}
    assert locals_used <= set(mod.locals), f"undeclared locals: {sorted(locals_used - set(mod.locals))}"
    unused_locals = set(mod.locals) - locals_used
    assert not unused_locals, f"locals never used: {sorted(unused_locals)}"

    data_used = set(_refs(mod, "data"))
    assert data_used <= set(mod.data), f"undeclared data sources: {sorted(data_used - set(mod.data))}"

    resources_used = set(_refs(mod, "resource"))
    undeclared = {r for r in resources_used if r not in mod.resources}
    assert not undeclared, f"undeclared resources referenced: {sorted(undeclared)}"
    ephemeral_used = set(_refs(mod, "ephemeral"))
    assert ephemeral_used <= set(mod.ephemeral), f"undeclared ephemeral resources: {ephemeral_used}"

    for ref in _refs(mod, "module"):
        assert ref[0] in mod.modules, f"module.{ref[0]} is not declared"
        if len(ref) > 1:
            child = Module((mod.directory / mod.modules[ref[0]]["source"]).resolve())
            assert ref[1] in child.outputs, f"module.{ref[0]} has no output {ref[1]}"


def test_example_calls_the_module_with_its_variables(example: Module, module: Module) -> None:
    (call,) = example.modules.values()
    assert (EXAMPLE / call["source"]).resolve() == MODULE.resolve()
    arguments = set(call) - {"source", "providers", "depends_on", "count", "for_each"}
    assert arguments <= set(module.variables), (
        f"unknown module arguments: {sorted(arguments - set(module.variables))}"
    )
    required = {name for name, body in module.variables.items() if "default" not in body}
    assert required <= arguments, f"required module variables not passed: {sorted(required - arguments)}"


def test_templates_referenced_exist_and_none_is_orphaned(module: Module) -> None:
    referenced = set()
    # The cluster module (terraform/cluster) shares these templates as ${local.templates}/...
    for mod in (module, Module(TERRAFORM / "cluster")):
        for text in mod.strings():
            referenced |= set(re.findall(r"templates\}?/([\w.-]+)", text))
    present = {p.name for p in TEMPLATES.iterdir() if p.is_file()}
    assert referenced, "no template referenced"
    assert referenced <= present, f"missing templates: {sorted(referenced - present)}"
    assert present <= referenced, f"templates nothing uses: {sorted(present - referenced)}"


def test_shell_scripts_are_plain_bash_loaded_without_templating(module: Module) -> None:
    scripts = sorted(TEMPLATES.glob("*.sh"))
    assert {p.name for p in scripts} >= {"user-data.sh", "hot-volume.sh", "secrets.sh"}
    for text in module.strings():
        # templatefile() would interpret the scripts' own ${VAR}s: scripts go through file().
        assert not re.search(r"templatefile\([^)]*\.sh\"", text), text
    for script in [*scripts, TERRAFORM / "checks.sh"]:
        assert script.read_text().startswith("#!/usr/bin/env bash\n"), script.name
        result = subprocess.run(["bash", "-n", str(script)], capture_output=True, text=True)
        assert result.returncode == 0, f"bash -n {script.name}: {result.stderr}"


# ---------------------------------------------------------------- the bucket


def test_bucket_is_private_owner_enforced_and_not_force_destroyed(module: Module) -> None:
    bucket = module.resource("aws_s3_bucket", "cold")
    assert bucket["force_destroy"] is False
    pab = module.resource("aws_s3_bucket_public_access_block", "cold")
    for flag in ("block_public_acls", "block_public_policy", "ignore_public_acls", "restrict_public_buckets"):
        assert pab[flag] is True, flag
    assert pab["bucket"] == "${aws_s3_bucket.cold.id}"
    ownership = module.resource("aws_s3_bucket_ownership_controls", "cold")
    assert _one(ownership, "rule")["object_ownership"] == "BucketOwnerEnforced"


def test_bucket_is_encrypted_sse_s3_by_default_sse_kms_by_variable(module: Module) -> None:
    sse = module.resource("aws_s3_bucket_server_side_encryption_configuration", "cold")
    default = _one(_one(sse, "rule"), "apply_server_side_encryption_by_default")
    algorithm = default["sse_algorithm"]
    assert "AES256" in algorithm and "aws:kms" in algorithm and "var.s3_kms_key_arn" in algorithm
    assert "var.s3_kms_key_arn" in default["kms_master_key_id"]
    assert module.variables["s3_kms_key_arn"]["default"] == ""


def test_bucket_versioning_and_lifecycle(module: Module) -> None:
    versioning = module.resource("aws_s3_bucket_versioning", "cold")
    assert _one(versioning, "versioning_configuration")["status"] == "Enabled"
    rules = _blocks(module.resource("aws_s3_bucket_lifecycle_configuration", "cold"), "rule")
    enabled = [r for r in rules if r["status"] == "Enabled"]
    aborts = [r for r in enabled if r.get("abort_incomplete_multipart_upload")]
    assert aborts and _one(aborts[0], "abort_incomplete_multipart_upload")["days_after_initiation"] == (
        "${var.abort_incomplete_multipart_upload_days}"
    )
    expiries = [r for r in enabled if r.get("noncurrent_version_expiration")]
    assert expiries and _one(expiries[0], "noncurrent_version_expiration")["noncurrent_days"] == (
        "${var.noncurrent_version_expiration_days}"
    )
    # Nothing current expires: only tiered's GC deletes live data.
    for rule in enabled:
        for expiration in _blocks(rule, "expiration"):
            assert set(expiration) <= {"expired_object_delete_marker"}, expiration


def test_bucket_policy_denies_insecure_transport(module: Module) -> None:
    policy = module.resource("aws_s3_bucket_policy", "cold")
    m = re.fullmatch(r"\$\{data\.aws_iam_policy_document\.([\w-]+)\.json\}", policy["policy"])
    assert m, policy["policy"]
    doc = module.data[("aws_iam_policy_document", m.group(1))]
    denies = [s for s in _statements(doc) if s.get("effect") == "Deny"]
    assert denies
    deny = denies[0]
    assert set(deny["resources"]) == {"${aws_s3_bucket.cold.arn}", "${aws_s3_bucket.cold.arn}/*"}
    assert deny["actions"] == ["s3:*"]
    principal = _one(deny, "principals")
    assert principal["type"] == "*" and principal["identifiers"] == ["*"]
    condition = _one(deny, "condition")
    assert (condition["test"], condition["variable"], condition["values"]) == (
        "Bool",
        "aws:SecureTransport",
        ["false"],
    )


# ---------------------------------------------------------------- IAM


def test_s3_operation_map_matches_the_code(module: Module) -> None:
    assert module.locals["tiered_s3_operation_actions"] == S3_OPERATIONS
    granted = set(module.locals["tiered_s3_object_actions"]) | set(module.locals["tiered_s3_bucket_actions"])
    assert granted == set(module.locals["tiered_s3_operation_actions"].values()) == S3_ACTIONS


def _policy_docs(module: Module) -> dict[str, dict[str, Any]]:
    """The policy documents attached to the instance role."""
    docs = {}
    for body in module.resources_of("aws_iam_role_policy").values():
        assert body["role"] == "${aws_iam_role.instance.id}"
        m = re.fullmatch(r"\$\{data\.aws_iam_policy_document\.([\w-]+)\.json\}", body["policy"])
        assert m, body["policy"]
        docs[m.group(1)] = module.data[("aws_iam_policy_document", m.group(1))]
    assert not module.resources_of("aws_iam_role_policy_attachment"), (
        "no managed policies: every grant is in the HCL"
    )
    return docs


def test_instance_role_s3_grant_is_exactly_the_five_actions_under_the_prefix(module: Module) -> None:
    docs = _policy_docs(module)
    s3_statements = [
        s
        for doc in docs.values()
        for s in _statements(doc)
        if any(str(a).startswith("s3:") for a in _as_list(module, s["actions"]))
        # the release artifact: test_the_node_reads_only_its_wheelhouse
        and s.get("sid") not in ("ReadTheWheelhouse", "ListTheWheelhouse")
    ]
    actions = {a for s in s3_statements for a in _as_list(module, s["actions"])}
    assert actions == S3_ACTIONS
    by_sid = {s["sid"]: s for s in s3_statements}

    objects = by_sid["ObjectsUnderPrefix"]
    assert set(_as_list(module, objects["actions"])) == S3_ACTIONS - {"s3:ListBucket"}
    assert objects["resources"] == ["${aws_s3_bucket.cold.arn}/${var.s3_prefix}/*"]

    listing = by_sid["ListPrefix"]
    assert _as_list(module, listing["actions"]) == ["s3:ListBucket"]
    assert listing["resources"] == ["${aws_s3_bucket.cold.arn}"]
    condition = _one(listing, "condition")
    assert condition["test"] == "StringLike" and condition["variable"] == "s3:prefix"
    assert set(condition["values"]) == {"${var.s3_prefix}/", "${var.s3_prefix}/*"}

    for statement in s3_statements:
        assert statement.get("effect", "Allow") == "Allow"
        assert "not_actions" not in statement and "not_resources" not in statement


def test_no_wildcard_actions_and_no_version_deletes(module: Module) -> None:
    for name, doc in _policy_docs(module).items():
        for statement in _statements(doc):
            for action in _as_list(module, statement["actions"]):
                assert "*" not in action, f"{name}/{statement.get('sid')}: wildcard action {action}"
                assert action != "s3:DeleteObjectVersion"
    for text in module.strings():
        assert "DeleteObjectVersion" not in text


def test_star_resources_only_where_aws_offers_nothing_narrower(module: Module) -> None:
    # These actions have no resource-level permissions in IAM.
    resourceless = {
        "ec2:DescribeVolumes",
        "cloudwatch:PutMetricData",
        "ssmmessages:CreateControlChannel",
        "ssmmessages:CreateDataChannel",
        "ssmmessages:OpenControlChannel",
        "ssmmessages:OpenDataChannel",
    }
    for doc in _policy_docs(module).values():
        for statement in _statements(doc):
            actions = set(_as_list(module, statement["actions"]))
            resources = _as_list(module, statement["resources"])
            if "*" in resources:
                assert actions <= resourceless, f"{statement.get('sid')}: '*' resource for {sorted(actions)}"
            if "cloudwatch:PutMetricData" in actions:
                condition = _one(statement, "condition")
                assert condition["variable"] == "cloudwatch:namespace"
                assert condition["values"] == ["${var.metrics_namespace}"]


def test_node_grants_are_scoped(module: Module) -> None:
    statements = {
        s["sid"]: s for doc in _policy_docs(module).values() for s in _statements(doc) if "sid" in s
    }
    token = statements["ReadAdminToken"]
    assert token["actions"] == ["ssm:GetParameter"] and token["resources"] == [
        "${local.admin_token_parameter_arn}"
    ]
    assert statements["AttachTheHotVolume"]["resources"] == ["${aws_ebs_volume.hot.arn}"]
    to_instances = statements["AttachToThisNodesInstances"]
    assert to_instances["actions"] == ["ec2:AttachVolume"]
    tag = _one(to_instances, "condition")
    assert tag["variable"].startswith("aws:ResourceTag/") and tag["values"] == ["${var.name}"]
    # The KMS grants exist only with a customer key, and only through the service.
    kms = {s["sid"]: s for s in statements.values() if any(a.startswith("kms:") for a in s["actions"])}
    assert set(_as_list(module, kms["ColdTierKmsViaS3"]["actions"])) == {"kms:GenerateDataKey", "kms:Decrypt"}
    assert _as_list(module, kms["AdminTokenKmsViaSsm"]["actions"]) == ["kms:Decrypt"]
    for statement in kms.values():
        assert statement["resources"] == ["${statement.value}"]
        assert any(c["variable"] == "kms:ViaService" for c in _blocks(statement, "condition"))
    assert not module.resources_of("aws_iam_role_policy_attachment")


# ---------------------------------------------------------------- compute and network


def test_one_instance_in_one_subnet(module: Module) -> None:
    asg = module.resource("aws_autoscaling_group", "node")
    assert (asg["min_size"], asg["max_size"], asg["desired_capacity"]) == (1, 1, 1)
    assert asg["vpc_zone_identifier"] == ["${var.subnet_id}"]
    assert asg["health_check_type"] == "EC2"
    assert _one(asg, "launch_template")["id"] == "${aws_launch_template.node.id}"
    # A refresh terminates the old instance first: it has to release the hot volume.
    preferences = _one(_one(asg, "instance_refresh"), "preferences")
    assert preferences["min_healthy_percentage"] == 0 and preferences["max_healthy_percentage"] == 100


def test_launch_template_imdsv2_no_key_no_public_ip_encrypted_root(module: Module) -> None:
    lt = module.resource("aws_launch_template", "node")
    metadata = _one(lt, "metadata_options")
    assert metadata["http_tokens"] == "required"
    assert metadata["http_put_response_hop_limit"] == 1
    assert "key_name" not in lt
    nic = _one(lt, "network_interfaces")
    assert nic["associate_public_ip_address"] is False
    assert nic["security_groups"] == ["${aws_security_group.node.id}"]
    root = _one(_one(lt, "block_device_mappings"), "ebs")
    assert root["encrypted"] is True
    assert _one(lt, "iam_instance_profile")["arn"] == "${aws_iam_instance_profile.instance.arn}"


def test_hot_volume_is_gp3_encrypted_in_the_subnets_zone(module: Module) -> None:
    volume = module.resource("aws_ebs_volume", "hot")
    assert volume["type"] == "gp3" and volume["encrypted"] is True
    assert volume["availability_zone"] == "${data.aws_subnet.node.availability_zone}"
    assert module.data[("aws_subnet", "node")]["id"] == "${var.subnet_id}"
    assert volume["size"] == "${var.hot_volume_size_gib}"
    assert volume["iops"] == "${var.hot_volume_iops}"
    assert volume["throughput"] == "${var.hot_volume_throughput_mibps}"


def test_security_group_opens_only_the_service_port_to_given_sources(module: Module) -> None:
    rule_types = {t for t, _ in module.resources}
    assert "aws_security_group_rule" not in rule_types, "use the per-rule resources"
    group = module.resource("aws_security_group", "node")
    assert "ingress" not in group and "egress" not in group
    ingress = module.resources_of("aws_vpc_security_group_ingress_rule")
    assert ingress
    for name, rule in ingress.items():
        assert rule["from_port"] == rule["to_port"] == "${var.port}", name
        assert rule["ip_protocol"] == "tcp"
        assert rule["security_group_id"] == "${aws_security_group.node.id}"
        source = rule.get("cidr_ipv4") or rule.get("referenced_security_group_id")
        assert source == "${each.value}", name
        assert "cidr_ipv6" not in rule and "prefix_list_id" not in rule
    sources = {rule["for_each"] for rule in ingress.values()}
    assert sources == {"${toset(var.allowed_cidrs)}", "${toset(var.allowed_security_group_ids)}"}
    # The CIDR list refuses 0.0.0.0/0 and the port variable refuses 22.
    cidr_check = _one(module.variables["allowed_cidrs"], "validation")["condition"]
    assert "0.0.0.0/" in cidr_check
    assert module.variables["allowed_cidrs"]["default"] == []
    port_check = _one(module.variables["port"], "validation")["condition"]
    assert re.search(r"var\.port >= 1024", port_check)
    for egress in module.resources_of("aws_vpc_security_group_egress_rule").values():
        assert egress["from_port"] == egress["to_port"] == 443 and egress["ip_protocol"] == "tcp"
    for text in module.strings():
        assert not re.search(r"\b(from_port|to_port)\b\s*=\s*22\b", text)
    tfvars = (EXAMPLE / "terraform.tfvars.example").read_text()
    assert "0.0.0.0/0" not in tfvars


# ---------------------------------------------------------------- user data and the admin token


def test_user_data_carries_the_token_parameter_name_never_its_value(module: Module) -> None:
    # The generated token is used in exactly one place: the SSM parameter's write-only value.
    uses = [
        (key, text)
        for key, body in module.resources.items()
        for text in _strings(body)
        if "aws_secretsmanager_random_password" in text
    ]
    assert uses == [
        (
            ("aws_ssm_parameter", "admin_token"),
            "${ephemeral.aws_secretsmanager_random_password.admin_token[0].random_password}",
        )
    ]
    parameter = module.resource("aws_ssm_parameter", "admin_token")
    assert parameter["type"] == "SecureString"
    # Write-only: never in the plan or the state; a new version stores a new token.
    assert "value" not in parameter and parameter["value_wo_version"] == "${var.admin_token_version}"
    generator = module.ephemeral[("aws_secretsmanager_random_password", "admin_token")]
    assert generator["password_length"] >= 32 and generator["exclude_punctuation"] is True
    assert not module.resources_of("random_password"), "no random provider: the token stays out of the state"
    # Nothing that reaches the instance's user data refers to the value.
    user_data_inputs = [
        "cloud_config",
        "bootstrap_env_vars",
        "unit_vars",
        "cwagent_vars",
        "prometheus_vars",
        "tiered_toml_vars",
        "user_data",
    ]
    for name in user_data_inputs:
        for text in _strings(module.locals[name]):
            assert "random_password" not in text and "aws_ssm_parameter" not in text, (name, text)
    assert (
        module.locals["bootstrap_env_vars"]["admin_token_parameter"] == "${local.admin_token_parameter_name}"
    )
    env = (TEMPLATES / "bootstrap.env.tftpl").read_text()
    assert "ADMIN_TOKEN_PARAMETER='${admin_token_parameter}'" in env
    assert not re.search(r"^\s*(export\s+)?TIERED_", env, re.M), (
        "TIERED_* names would leak into tiered's settings"
    )
    fetch = (TEMPLATES / "secrets.sh").read_text()
    assert "aws ssm get-parameter" in fetch and "--with-decryption" in fetch
    assert "umask 077" in fetch and "chmod 0600" in fetch
    for script in TEMPLATES.glob("*"):
        assert not re.search(r"(?i)admin_token\s*=\s*['\"][A-Za-z0-9]{16,}", script.read_text()), script.name


def test_user_data_is_one_gzipped_cloud_config_that_runs_the_boot_script(module: Module) -> None:
    lt = module.resource("aws_launch_template", "node")
    assert lt["user_data"] == "${local.user_data}"
    assert module.locals["user_data"] == '${base64gzip("#cloud-config\\n${yamlencode(local.cloud_config)}")}'
    config = module.locals["cloud_config"]
    files = {f["path"]: f for f in config["write_files"]}
    boot = "${local.libexec}/user-data"
    assert files[boot]["content"] == '${file("${path.module}/templates/user-data.sh")}'
    assert files[boot]["permissions"] == "0755"
    assert config["runcmd"] == [[boot]]
    assert not [key for key in module.data if key[0] == "cloudinit_config"]


def _rendered_units(module: Module) -> dict[str, str]:
    values = {
        "venv": "/opt/tiered/venv",
        "config_file": "/etc/tiered/tiered.toml",
        "data_dir": "/d",
        "libexec": "/usr/local/libexec/tiered",
        "admin_token_host_file": "/run/tiered/admin-token",
        "port": 4437,
        "gc_timer_interval": "15min",
        "requires": module.locals["unit_vars"]["requires"],
        "cluster_service_lines": module.locals["unit_vars"]["cluster_service_lines"],
    }
    assert set(module.locals["unit_vars"]) == set(values)
    return {
        name: _render(TEMPLATES / f"{name}.tftpl", values)
        for name in ("tiered.service", "tiered-gc.service", "tiered-gc.timer", "tiered-secrets.service")
    }


def test_boot_attaches_checks_and_mounts_the_volume_before_tiered_starts(module: Module) -> None:
    volume = (TEMPLATES / "hot-volume.sh").read_text()
    for step in (
        "aws ec2 describe-volumes",
        "aws ec2 attach-volume",
        "blkid -p",
        "e2fsck -p",
        "mkfs.ext4",
        "mount ",
    ):
        assert step in volume, step
    # mkfs only on the branch where blkid found no signature at all (exit code 2).
    blank_branch = volume[volume.index("\n    2)") : volume.index("\n    *)")]
    assert "mkfs.ext4" in blank_branch and volume.count("mkfs.ext4") == 1
    service = _rendered_units(module)["tiered.service"]
    assert re.search(r"^Requires=.*tiered-hot-volume\.service", service, re.M)
    assert re.search(r"^Requires=.*tiered-secrets\.service", service, re.M)
    assert re.search(r"^After=.*tiered-hot-volume\.service", service, re.M)
    assert re.search(
        r"^ExecStart=/opt/tiered/venv/bin/tiered serve --config /etc/tiered/tiered.toml$", service, re.M
    )
    assert re.search(r"^LoadCredential=admin-token:/run/tiered/admin-token$", service, re.M)
    assert re.search(r"^User=tiered$", service, re.M)
    env = module.locals["bootstrap_env_vars"]
    assert set(env["enable_units"].split()) == {
        "tiered-hot-volume.service",
        "tiered-secrets.service",
        "tiered.service",
        "tiered-gc.timer",
    }
    assert env["hot_volume_id"] == "${aws_ebs_volume.hot.id}"


def test_gc_timer_runs_tiered_gc_against_the_local_server(module: Module) -> None:
    assert module.locals["unit_vars"]["port"] == "${var.port}"
    assert module.locals["unit_vars"]["gc_timer_interval"] == "${var.gc_timer_interval}"
    units = _rendered_units(module)
    service = units["tiered-gc.service"]
    (exec_start,) = re.findall(r"^ExecStart=(.*)$", service, re.M)
    assert exec_start.split() == [
        "/opt/tiered/venv/bin/tiered",
        "gc",
        "--url",
        "http://127.0.0.1:4437",
        "--admin-token-file",
        "%d/admin-token",
    ]
    assert "LoadCredential=admin-token:/run/tiered/admin-token" in service
    timer = units["tiered-gc.timer"]
    assert "OnUnitActiveSec=15min" in timer and "WantedBy=timers.target" in timer


# ---------------------------------------------------------------- the release artifact


def test_the_wheelhouse_is_uploaded_to_the_bucket_and_pinned_by_its_digest(module: Module) -> None:
    objects = module.resource("aws_s3_object", "wheelhouse")
    assert objects["for_each"] == "${local.wheelhouse_files}"
    assert objects["bucket"] == "${aws_s3_bucket.cold.id}"
    assert objects["key"] == "${local.artifact_key_prefix}/${each.value}"
    assert objects["source"] == "${var.wheelhouse_dir}/${each.value}"
    assert "filemd5" in objects["source_hash"]
    # The prefix names the digest: another artifact is other keys, never an overwrite.
    assert "local.wheelhouse_sums_sha256" in module.locals["artifact_key_prefix"]
    assert "var.artifact_prefix" in module.locals["artifact_key_prefix"]
    assert module.locals["wheelhouse_sums_sha256"] == '${filesha256("${var.wheelhouse_dir}/SHA256SUMS")}'
    env = module.locals["bootstrap_env_vars"]
    assert env["artifact_sha256sums"] == "${local.wheelhouse_sums_sha256}"
    assert env["artifact_prefix"] == "${local.artifact_key_prefix}"
    assert env["artifact_bucket"] == "${aws_s3_bucket.cold.bucket}"
    # The nodes boot only once the artifact is there.
    assert "${aws_s3_object.wheelhouse}" in module.resource("aws_autoscaling_group", "node")["depends_on"]
    assert "default" not in module.variables["wheelhouse_dir"]


def test_the_node_reads_only_its_wheelhouse(module: Module) -> None:
    statements = {
        s["sid"]: s for doc in _policy_docs(module).values() for s in _statements(doc) if "sid" in s
    }
    read = statements["ReadTheWheelhouse"]
    assert read["actions"] == ["s3:GetObject"]
    assert read["resources"] == ["${aws_s3_bucket.cold.arn}/${local.artifact_key_prefix}/*"]
    listing = statements["ListTheWheelhouse"]
    assert listing["actions"] == ["s3:ListBucket"] and listing["resources"] == ["${aws_s3_bucket.cold.arn}"]
    condition = _one(listing, "condition")
    assert (condition["test"], condition["variable"]) == ("StringLike", "s3:prefix")
    assert condition["values"] == ["${local.artifact_key_prefix}/", "${local.artifact_key_prefix}/*"]


def test_the_boot_script_installs_offline_with_hashes_checked() -> None:
    script = (TEMPLATES / "user-data.sh").read_text()
    assert 'sha256sum "$WHEELHOUSE/SHA256SUMS"' in script and '"$ARTIFACT_SHA256SUMS"' in script
    assert "sha256sum --check --strict" in script
    (pip,) = [line for line in script.split("\n\n") if '"$VENV/bin/pip" install' in line]
    for flag in ("--no-index", "--require-hashes", '--find-links "$WHEELHOUSE"'):
        assert flag in pip, flag
    assert "pypi" not in script.lower() and "index-url" not in script


def test_no_default_or_document_names_a_package_on_a_public_index() -> None:
    """tiered is not published on a package index: nothing may tell a node or a user to fetch it from one."""
    root = TERRAFORM.parent
    texts = [p for p in TERRAFORM.rglob("*") if p.is_file() and ".terraform" not in p.parts]
    texts += [root / "README.md", *sorted((root / "docs").glob("*.md"))]
    for path in texts:
        text = path.read_text(errors="replace")
        for bad in (
            "pip install tiered",
            "tiered_package",
            "var.tiered_version",
            "`tiered_version`",
            "pip install 'tiered",
        ):
            assert bad not in text, f"{path.relative_to(root)} says {bad!r}"
        assert not re.search(r"(?i)pypi\.org|index-url", text), (
            f"{path.relative_to(root)} names a package index"
        )


# ---------------------------------------------------------------- tiered.toml


def _example_toml_values(module: Module) -> dict[str, Any]:
    return {
        "port": 4437,
        "data_dir": f"{module.locals['mount_point']}/data",
        "fsync": "always",
        "max_hot_bytes": 53687091200,
        "log_level": "info",
        "s3_bucket": "tiered-cold-20240101abcdef",
        "s3_prefix": "prod/node-a",
        "s3_region": "eu-west-1",
        "admin_token_file": module.locals["admin_token_credential_file"],
        "auth": "tokens",
        "public_url": "",
    }


def test_tiered_toml_renders_to_a_config_tiered_accepts(module: Module, tmp_path: Path) -> None:
    template = TEMPLATES / "tiered.toml.tftpl"
    values = _example_toml_values(module)
    # The template uses exactly the variables compute.tf passes to templatefile().
    assert _placeholders(template.read_text()) == set(module.locals["tiered_toml_vars"]) == set(values)
    assert re.fullmatch(
        r'\$\{templatefile\(\\?"\$\{path\.module\}/templates/tiered\.toml\.tftpl\\?",\s*local\.tiered_toml_vars\)\}',
        module.locals["tiered_toml"],
    ), module.locals["tiered_toml"]
    path = tmp_path / "tiered.toml"
    path.write_text(_render(template, values))
    config = load_config(str(path), env={})
    assert config.cold_store == "s3"
    assert config.host == "0.0.0.0"
    assert config.port == 4437
    assert config.s3_bucket == "tiered-cold-20240101abcdef"
    assert config.s3_prefix == "prod/node-a"
    assert config.s3_region == "eu-west-1"
    mount_point = module.locals["mount_point"]
    assert config.data_dir.startswith(mount_point + "/")
    assert module.locals["data_dir"] == "${local.mount_point}/data"
    assert config.admin_token_file == "/run/credentials/tiered.service/admin-token"
    assert config.max_hot_bytes == 53687091200
    assert config.auth == "tokens" and config.exposure_problem() is None  # it would start on 0.0.0.0


def test_tiered_toml_uses_only_config_keys_and_the_loader_would_catch_others(
    module: Module, tmp_path: Path
) -> None:
    rendered = _render(TEMPLATES / "tiered.toml.tftpl", _example_toml_values(module))
    keys = set(re.findall(r"^([a-z_]+)\s*=", rendered, re.M))
    fields = {f.name for f in dataclasses.fields(Config)}
    assert keys <= fields, f"not tiered settings: {sorted(keys - fields)}"
    path = tmp_path / "bad.toml"
    path.write_text(rendered.replace("[tiered]\n", "[tiered]\nnot_a_setting = 1\n"))
    with pytest.raises(ConfigError, match="unknown setting"):
        load_config(str(path), env={})


def test_tiered_toml_is_an_output(module: Module) -> None:
    for name in (
        "bucket_name",
        "bucket_arn",
        "instance_role_arn",
        "security_group_id",
        "hot_volume_id",
        "admin_token_parameter_name",
        "service_url_hints",
        "tiered_toml",
    ):
        assert name in module.outputs, name
    assert module.outputs["tiered_toml"]["value"] == "${local.tiered_toml}"
    assert "${local.tiered_toml}" in [c["content"] for c in module.locals["cloud_config"]["write_files"]]


# ---------------------------------------------------------------- monitoring


def _alarm_metrics(alarm: dict[str, Any]) -> list[dict[str, Any]]:
    if "metric_name" in alarm:
        return [alarm]
    return [_one(q, "metric") for q in _blocks(alarm, "metric_query") if q.get("metric")]


def test_alarms_cover_the_node_the_disk_and_tiereds_metrics(module: Module) -> None:
    alarms = module.resources_of("aws_cloudwatch_metric_alarm")
    metrics = {m["metric_name"] for alarm in alarms.values() for m in _alarm_metrics(alarm)}
    assert {
        "StatusCheckFailed",
        "disk_used_percent",
        "tiered_hot_bytes",
        "tiered_cold_flush_failures_total",
        "tiered_http_requests_total",
        "tiered_append_seconds_sum",
        "tiered_append_seconds_count",
        "tiered_gc_errors_total",
        "tiered_integrity_errors_total",
        "tiered_gc_integrity_errors",
    } <= metrics
    for name, alarm in alarms.items():
        assert alarm["alarm_actions"] == "${local.alarm_actions}", name
        for metric in _alarm_metrics(alarm):
            if metric["metric_name"] != "StatusCheckFailed":
                assert metric["namespace"] == "${var.metrics_namespace}", name
    status = next(a for a in alarms.values() if a.get("metric_name") == "StatusCheckFailed")
    assert status["dimensions"] == {"AutoScalingGroupName": "${aws_autoscaling_group.node.name}"}
    five_xx = next(
        a
        for a in alarms.values()
        if any(m["dimensions"].get("status_class") == "5xx" for m in _alarm_metrics(a))
    )
    (expression,) = [q["expression"] for q in _blocks(five_xx, "metric_query") if "expression" in q]
    assert "errors" in expression and "appends" in expression


def _render_agent_config(module: Module) -> dict[str, Any]:
    values = {
        "namespace": "Tiered",
        "node": "n1",
        "mount_point": module.locals["mount_point"],
        "log_group": "/tiered/n1/prometheus",
        "prometheus_config_file": "/etc/p.yaml",
        "append_route": "append",
    }
    assert set(module.locals["cwagent_vars"]) == set(values)
    return json.loads(_render(TEMPLATES / "cloudwatch-agent.json.tftpl", values))


def test_agent_ships_every_metric_an_alarm_uses(module: Module) -> None:
    agent = _render_agent_config(module)
    declarations = agent["logs"]["metrics_collected"]["prometheus"]["emf_processor"]["metric_declaration"]
    alarms = module.resources_of("aws_cloudwatch_metric_alarm")
    for alarm in alarms.values():
        for metric in _alarm_metrics(alarm):
            name = metric["metric_name"]
            if not name.startswith("tiered_"):
                continue
            assert metric["dimensions"]["node"] == "${var.name}", name
            dims = set(metric["dimensions"])
            matching = [d for d in declarations if any(re.search(s, name) for s in d["metric_selectors"])]
            assert matching, f"the agent does not ship {name}"
            assert any(sorted(dims) in [sorted(ds) for ds in d["dimensions"]] for d in matching), (name, dims)
    disk = agent["metrics"]["metrics_collected"]["disk"]
    assert disk["resources"] == [module.locals["mount_point"]]
    disk_alarm = next(a for a in alarms.values() if a.get("metric_name") == "disk_used_percent")
    assert disk_alarm["dimensions"] == {
        "node": "${var.name}",
        "path": "${local.mount_point}",
        "fstype": "ext4",
    }
    assert disk["append_dimensions"] == {"node": "n1"} and agent["agent"]["omit_hostname"] is True


def test_prometheus_scrape_is_loopback_with_the_token_file(module: Module) -> None:
    import yaml

    values = {"port": 4437, "node": "n1", "admin_token_host_file": "/run/tiered/admin-token"}
    assert set(module.locals["prometheus_vars"]) == set(values)
    assert module.locals["prometheus_vars"]["admin_token_host_file"] == "${local.admin_token_host_file}"
    scrape = yaml.safe_load(_render(TEMPLATES / "prometheus.yaml.tftpl", values))["scrape_configs"][0]
    assert scrape["metrics_path"] == "/metrics"
    assert scrape["authorization"] == {"type": "Bearer", "credentials_file": "/run/tiered/admin-token"}
    assert scrape["static_configs"][0]["targets"] == ["127.0.0.1:4437"]
    relabel = scrape["metric_relabel_configs"][0]
    assert relabel["target_label"] == "status_class" and relabel["replacement"] == "${1}xx"
    assert re.fullmatch(relabel["regex"], "503") and not re.fullmatch(relabel["regex"], "5031")
