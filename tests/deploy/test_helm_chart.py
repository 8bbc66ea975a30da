"""The Helm chart (deploy/helm/tiered), checked without helm.

deploy/helm/check.sh runs `helm lint`, `helm template` and kubeconform where they are
installed. Here, always: the default and CI values validate against values.schema.json
(and values the chart must refuse do not); every `.Values...` a template reads exists
in values.yaml; the tiered.toml the ConfigMap renders uses only tiered's settings; the
StatefulSet has a volume per node, the same health checks as the other deployments,
and the image's non-root user with a read-only root file system.
"""

from __future__ import annotations

import copy
import dataclasses
import json
import re
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml

from tests.support.lockfiles import pyproject
from tiered.core.config import Config

HELM = Path(__file__).resolve().parent.parent.parent / "deploy" / "helm"
CHART = HELM / "tiered"


def values() -> dict[str, Any]:
    return yaml.safe_load((CHART / "values.yaml").read_text())


def schema() -> dict[str, Any]:
    return json.loads((CHART / "values.schema.json").read_text())


def merged(override: dict[str, Any]) -> dict[str, Any]:
    def merge(base: dict[str, Any], extra: dict[str, Any]) -> dict[str, Any]:
        out = copy.deepcopy(base)
        for key, value in extra.items():
            out[key] = (
                merge(out[key], value)
                if isinstance(value, dict) and isinstance(out.get(key), dict)
                else value
            )
        return out

    return merge(values(), override)


@pytest.mark.parametrize("ci_values", sorted(p.name for p in (HELM / "ci").glob("*.yaml")))
def test_default_and_ci_values_satisfy_the_schema(ci_values: str) -> None:
    jsonschema.validate(values(), schema())
    jsonschema.validate(merged(yaml.safe_load((HELM / "ci" / ci_values).read_text())), schema())


@pytest.mark.parametrize(
    "override",
    [
        {"replicas": 3},  # several nodes without cluster mode: two servers on one prefix
        {"cluster": {"enabled": True}, "coldStore": "local"},  # a cluster needs the shared bucket
        {"auth": {"mode": "open"}},
        {"image": {"digest": "latest"}},
        {"unknown": 1},
    ],
)
def test_values_the_chart_must_refuse_are_refused(override: dict[str, Any]) -> None:
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(merged(override), schema())


def test_the_chart_and_its_image_follow_the_project_version() -> None:
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    version = pyproject()["project"]["version"]  # type: ignore[index]
    assert chart["apiVersion"] == "v2" and chart["appVersion"] == version
    assert values()["image"]["tag"] == version
    assert values()["image"]["repository"] == ""  # no public image: the operator names theirs


def _templates() -> dict[str, str]:
    return {p.name: p.read_text() for p in (CHART / "templates").iterdir() if p.is_file()}


def test_every_value_a_template_reads_exists() -> None:
    defined = values()
    for name, text in _templates().items():
        for path in re.findall(r"\.Values((?:\.[A-Za-z][A-Za-z0-9]*)+)", text):
            node: Any = defined
            for part in path.strip(".").split("."):
                assert isinstance(node, dict) and part in node, (
                    f"{name} reads .Values{path}, which values.yaml lacks"
                )
                node = node[part]


def test_the_configuration_uses_only_tiered_settings() -> None:
    configmap = _templates()["configmap.yaml"]
    toml = configmap.split("tiered.toml: |", 1)[1]
    keys = set(re.findall(r"^\s{4}([a-z_0-9]+) = ", toml, re.M))
    fields = {f.name for f in dataclasses.fields(Config)}
    assert keys and keys <= fields, f"not tiered settings: {sorted(keys - fields)}"
    assert {"admin_token_file", "auth", "cold_store", "durability", "cluster_secret_file"} <= keys


def test_the_statefulset_has_a_volume_per_node_the_health_checks_and_a_locked_down_pod() -> None:
    text = _templates()["statefulset.yaml"]
    assert "kind: StatefulSet" in text and "volumeClaimTemplates:" in text
    assert re.search(r"readinessProbe:\s+httpGet:\s+path: /readyz", text)
    assert re.search(r"livenessProbe:\s+httpGet:\s+path: /healthz", text)
    assert "readOnlyRootFilesystem: true" in text and "runAsNonRoot: true" in text
    assert 'drop: ["ALL"]' in text and "allowPrivilegeEscalation: false" in text
    (uid,) = re.findall(r"runAsUser: (\d+)", text)
    dockerfile = (HELM.parent.parent / "Dockerfile").read_text()
    assert f"USER {uid}:{uid}" in dockerfile
    assert "mountPath: /var/lib/tiered\n" in text and "topology.kubernetes.io/zone" in text
    configmap = _templates()["configmap.yaml"]
    assert 'data_dir = "/var/lib/tiered/data"' in configmap
    # The secrets the configuration names are the files the pod mounts.
    for file in re.findall(r'_file = "(/run/secrets/[^"]+)"', configmap):
        directory, name = file.rsplit("/", 1)
        assert f"mountPath: {directory}" in text and f"path: {name}" in text, file
