"""Offline checks of the cluster module (terraform/cluster) and its example, parsed with python-hcl2.

The cluster shares the single-node module's templates and its cold-tier IAM grant;
these checks hold it to what terraform/README.md promises: nodes across zones behind a
load balancer that checks /readyz, object-store durability, both secrets from SSM
(written write-only), least privilege, alarms on tiered's own takeover and stall metrics.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

from tests.deploy.test_terraform import _refs
from tests.support.boot_support import render
from tests.support.terraform_hcl import TERRAFORM, Module, render_policy
from tests.support.terraform_hcl import as_list as _as_list
from tests.support.terraform_hcl import blocks as _blocks
from tests.support.terraform_hcl import one as _one
from tests.support.terraform_hcl import statements as _statements
from tiered.core.config import load_config

CLUSTER = TERRAFORM / "cluster"
EXAMPLE = TERRAFORM / "examples" / "cluster"
TEMPLATES = TERRAFORM / "templates"
ROOT = TERRAFORM.parent


@pytest.fixture(scope="module")
def cluster() -> Module:
    return Module(CLUSTER)


@pytest.fixture(scope="module")
def example() -> Module:
    return Module(EXAMPLE)


@pytest.fixture(scope="module")
def single() -> Module:
    return Module(TERRAFORM)


@pytest.mark.parametrize("which", ["cluster", "example"])
def test_references_resolve_and_variables_are_described_and_used(
    which: str, cluster: Module, example: Module
) -> None:
    mod = cluster if which == "cluster" else example
    for name, body in mod.variables.items():
        assert body.get("type") and str(body.get("description", "")).strip(), name
    declared = set(mod.variables)
    assert {r[0] for r in _refs(mod, "var")} <= declared
    used = {r[0] for r in _refs(mod, "var", skip_variable_blocks=True)}
    assert declared <= used, f"variables never used: {sorted(declared - used)}"
    locals_used = {r[0] for r in _refs(mod, "local")}
    assert locals_used <= set(mod.locals), sorted(locals_used - set(mod.locals))
    assert set(mod.locals) <= locals_used, f"locals never used: {sorted(set(mod.locals) - locals_used)}"
    assert set(_refs(mod, "data")) <= set(mod.data)
    assert {r for r in _refs(mod, "resource") if r not in mod.resources} == set()
    assert set(_refs(mod, "ephemeral")) <= set(mod.ephemeral)
    settings = [b for b in mod.terraform if "required_providers" in b]
    providers = settings[0]["required_providers"]
    providers = providers[0] if isinstance(providers, list) else providers
    assert set(providers) == {"aws"}
    for block in mod.terraform:
        assert "backend" not in block


def test_the_example_calls_the_module_with_what_it_needs(example: Module, cluster: Module) -> None:
    (call,) = example.modules.values()
    assert (EXAMPLE / call["source"]).resolve() == CLUSTER.resolve()
    arguments = set(call) - {"source"}
    assert arguments <= set(cluster.variables)
    required = {n for n, b in cluster.variables.items() if "default" not in b}
    assert required <= arguments, sorted(required - arguments)
    assert "0.0.0.0/0" not in (EXAMPLE / "terraform.tfvars.example").read_text()


def test_templates_the_cluster_uses_exist(cluster: Module) -> None:
    used = {m for text in cluster.strings() for m in re.findall(r"templates\}/([\w.-]+)", text)}
    assert used and all((TEMPLATES / name).is_file() for name in used), used
    assert "hot-volume.sh" not in used  # no volume to attach: the data dir is a cache


# ---------------------------------------------------------------- nodes, zones, load balancer


def test_nodes_span_zones_in_one_group_of_node_count(cluster: Module) -> None:
    asg = cluster.resource("aws_autoscaling_group", "nodes")
    assert asg["min_size"] == asg["max_size"] == asg["desired_capacity"] == "${var.node_count}"
    assert cluster.variables["node_count"]["default"] == 3
    assert asg["vpc_zone_identifier"] == "${var.subnet_ids}"
    assert "length(var.subnet_ids) >= 2" in _one(cluster.variables["subnet_ids"], "validation")["condition"]
    assert asg["target_group_arns"] == ["${aws_lb_target_group.nodes.arn}"]
    assert asg["health_check_type"] == "EC2"  # see the checkov skip: an S3 outage must not recycle every node
    preferences = _one(_one(asg, "instance_refresh"), "preferences")
    assert preferences["min_healthy_percentage"] == 100  # a new node first, then the old one hands off
    lt = cluster.resource("aws_launch_template", "node")
    assert _one(lt, "metadata_options")["http_tokens"] == "required"
    assert _one(lt, "network_interfaces")["associate_public_ip_address"] is False
    assert "key_name" not in lt
    assert _one(_one(lt, "block_device_mappings"), "ebs")["encrypted"] is True
    assert not cluster.resources_of("aws_ebs_volume")


def test_the_load_balancer_checks_readyz_on_every_node(cluster: Module) -> None:
    group = cluster.resource("aws_lb_target_group", "nodes")
    check = _one(group, "health_check")
    assert (check["protocol"], check["path"], check["matcher"]) == ("HTTP", "/readyz", "200")
    lb = cluster.resource("aws_lb", "cluster")
    assert lb["subnets"] == "${var.subnet_ids}" and lb["enable_cross_zone_load_balancing"] is True
    assert lb["internal"] == "${var.load_balancer_internal}"
    assert cluster.variables["load_balancer_internal"]["default"] is True
    listener = cluster.resource("aws_lb_listener", "cluster")
    assert _one(listener, "default_action")["target_group_arn"] == "${aws_lb_target_group.nodes.arn}"
    assert "TLS13" in listener["ssl_policy"]


def test_nodes_take_traffic_from_the_balancer_and_each_other_only(cluster: Module) -> None:
    ingress = cluster.resources_of("aws_vpc_security_group_ingress_rule")
    to_nodes = {n: r for n, r in ingress.items() if r["security_group_id"] == "${aws_security_group.node.id}"}
    assert {r["referenced_security_group_id"] for r in to_nodes.values()} == {
        "${aws_security_group.lb.id}",
        "${aws_security_group.node.id}",
    }
    for rule in to_nodes.values():
        assert rule["from_port"] == rule["to_port"] == "${var.port}"
    to_lb = {n: r for n, r in ingress.items() if r["security_group_id"] == "${aws_security_group.lb.id}"}
    assert {r.get("cidr_ipv4") or r.get("referenced_security_group_id") for r in to_lb.values()} == {
        "${each.value}"
    }
    assert "0.0.0.0/" in _one(cluster.variables["allowed_cidrs"], "validation")["condition"]


# ---------------------------------------------------------------- configuration


def _rendered_toml(cluster: Module, tmp: Path) -> Path:
    base = {
        "port": 4437,
        "data_dir": "/var/lib/tiered",
        "fsync": "interval",
        "max_hot_bytes": 8589934592,
        "log_level": "info",
        "s3_bucket": "tiered-prod-cold-2024",
        "s3_prefix": "prod",
        "s3_region": "eu-west-1",
        "admin_token_file": cluster.locals["admin_token_credential_file"],
        "auth": "tokens",
        "public_url": "",
    }
    extra = {
        "shards": 64,
        "lease_ttl_s": 10,
        "cluster_secret_file": cluster.locals["cluster_secret_credential_file"],
    }
    assert set(cluster.locals["tiered_toml_vars"]) == set(base)
    assert set(cluster.locals["cluster_toml_vars"]) == set(extra)
    path = tmp / "tiered.toml"
    path.write_text(
        render(TEMPLATES / "tiered.toml.tftpl", base) + render(TEMPLATES / "tiered-cluster.toml.tftpl", extra)
    )
    return path


def test_the_toml_is_a_cluster_node_with_object_store_durability(cluster: Module, tmp_path: Path) -> None:
    path = _rendered_toml(cluster, tmp_path)
    env = {
        "TIERED_CLUSTER_NODE_ID": "i-0123456789abcdef0",
        "TIERED_CLUSTER_ADVERTISE_URL": "http://10.0.1.5:4437",
    }
    config = load_config(str(path), env=env)
    assert config.cluster_node_id == "i-0123456789abcdef0"
    assert config.durability == "object-store" and config.cold_store == "s3"
    assert (
        config.cluster_shards == 64
        and config.cluster_secret_file == "/run/credentials/tiered.service/cluster-secret"
    )
    assert config.auth == "tokens" and config.exposure_problem() is None
    # The unit hands tiered the secret and the node's environment, and makes the data dir.
    lines = cluster.locals["unit_vars"]["cluster_service_lines"]
    for line in (
        "LoadCredential=cluster-secret:${local.cluster_secret_host_file}",
        "EnvironmentFile=${local.node_env_file}",
        "StateDirectory=tiered",
    ):
        assert line in lines
    assert cluster.locals["data_dir"] == "/var/lib/tiered"
    env_vars = cluster.locals["bootstrap_env_vars"]
    assert env_vars["node_env_file"] == "${local.node_env_file}"
    assert env_vars["cluster_secret_parameter"] == "${local.cluster_secret_parameter_name}"
    assert env_vars["hot_volume_id"] == ""


def test_both_secrets_are_generated_write_only_and_only_their_names_reach_the_nodes(cluster: Module) -> None:
    for name in ("admin_token", "cluster_secret"):
        parameter = cluster.resource("aws_ssm_parameter", name)
        assert parameter["type"] == "SecureString" and "value" not in parameter
        assert parameter["value_wo"].startswith(f"${{ephemeral.aws_secretsmanager_random_password.{name}")
        assert parameter["value_wo_version"] == f"${{var.{name}_version}}"
    for local in (
        "cloud_config",
        "bootstrap_env_vars",
        "unit_vars",
        "tiered_toml_vars",
        "cluster_toml_vars",
        "user_data",
    ):
        text = json.dumps(cluster.locals[local])
        assert "random_password" not in text and "aws_ssm_parameter" not in text, local


# ---------------------------------------------------------------- IAM


def _policy_docs(module: Module) -> dict[str, dict[str, Any]]:
    docs = {}
    for body in module.resources_of("aws_iam_role_policy").values():
        m = re.fullmatch(r"\$\{data\.aws_iam_policy_document\.([\w-]+)\.json\}", body["policy"])
        assert m
        docs[m.group(1)] = module.data[("aws_iam_policy_document", m.group(1))]
    assert not module.resources_of("aws_iam_role_policy_attachment")
    return docs


def test_the_cold_tier_grant_is_the_single_node_modules(cluster: Module, single: Module) -> None:
    refs = {"var.s3_prefix": "p", "aws_s3_bucket.cold.arn": "arn:aws:s3:::b"}
    assert render_policy(cluster, "tiered_s3", refs) == render_policy(single, "tiered_s3", refs)
    for name in ("tiered_s3_operation_actions", "tiered_s3_object_actions", "tiered_s3_bucket_actions"):
        assert cluster.locals[name] == single.locals[name], name


def test_the_nodes_read_their_two_secrets_and_their_artifact_and_nothing_else(cluster: Module) -> None:
    statements = {
        s["sid"]: s for doc in _policy_docs(cluster).values() for s in _statements(doc) if "sid" in s
    }
    secrets = statements["ReadTheSecrets"]
    assert secrets["actions"] == ["ssm:GetParameter"]
    assert secrets["resources"] == [
        "${local.admin_token_parameter_arn}",
        "${local.cluster_secret_parameter_arn}",
    ]
    assert statements["ReadTheWheelhouse"]["resources"] == [
        "${aws_s3_bucket.cold.arn}/${local.artifact_key_prefix}/*"
    ]
    resourceless = {
        "cloudwatch:PutMetricData",
        "ssmmessages:CreateControlChannel",
        "ssmmessages:CreateDataChannel",
        "ssmmessages:OpenControlChannel",
        "ssmmessages:OpenDataChannel",
    }
    for doc in _policy_docs(cluster).values():
        for statement in _statements(doc):
            actions = set(_as_list(cluster, statement["actions"]))
            assert not any("*" in a for a in actions)
            if "*" in _as_list(cluster, statement["resources"]):
                assert actions <= resourceless, statement.get("sid")
    assert not any(a.startswith("ec2:") for s in statements.values() for a in _as_list(cluster, s["actions"]))


# ---------------------------------------------------------------- alarms


def _metrics(alarm: dict[str, Any]) -> list[dict[str, Any]]:
    if "metric_name" in alarm:
        return [alarm]
    return [_one(q, "metric") for q in _blocks(alarm, "metric_query") if q.get("metric")]


def test_alarms_watch_takeovers_stalls_and_the_nodes(cluster: Module) -> None:
    alarms = cluster.resources_of("aws_cloudwatch_metric_alarm")
    by_metric = {m["metric_name"]: (name, m) for name, a in alarms.items() for m in _metrics(a)}
    takeovers = by_metric["tiered_cluster_shards_taken_total"][1]
    assert takeovers["dimensions"] == {"node": "${var.name}", "from": "takeover"}
    assert takeovers["statistic"] == "Sum"
    assert by_metric["tiered_store_stalls_total"][1]["statistic"] == "Sum"
    assert by_metric["tiered_store_reachable"][1]["treat_missing_data"] == "breaching"
    for name in (
        "tiered_cluster_window_open",
        "GroupInServiceInstances",
        "UnHealthyHostCount",
        "tiered_integrity_errors_total",
    ):
        assert name in by_metric, name
    for alarm in alarms.values():
        assert alarm["alarm_actions"] == "${local.alarm_actions}"


def test_every_alarmed_metric_is_exported_by_tiered_and_shipped_by_the_agent(cluster: Module) -> None:
    agent_text = (TEMPLATES / "cloudwatch-agent-cluster.json.tftpl").read_text()
    agent = json.loads(re.sub(r"\$\{[a-z_]+\}", "x", agent_text))
    declarations = agent["logs"]["metrics_collected"]["prometheus"]["emf_processor"]["metric_declaration"]
    source = "\n".join(p.read_text() for p in (ROOT / "tiered").rglob("*.py"))
    source += "\n".join(p.read_text() for p in (ROOT / "cold").rglob("*.py"))
    for alarm in cluster.resources_of("aws_cloudwatch_metric_alarm").values():
        for metric in _metrics(alarm):
            name = metric["metric_name"]
            if not name.startswith("tiered_"):
                continue
            family = re.sub(r"_(total|sum|count)$", "", name)
            assert f'"{family}"' in source, f"tiered exports no {family}"
            matching = [d for d in declarations if any(re.search(s, name) for s in d["metric_selectors"])]
            assert matching, f"the agent does not ship {name}"
            dims = sorted(metric["dimensions"])
            assert any(dims in [sorted(ds) for ds in d["dimensions"]] for d in matching), (name, dims)
