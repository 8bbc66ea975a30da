#!/usr/bin/env bash
# Checks of the Helm chart that need helm: `helm lint --strict` and `helm template` with
# the values in ci/ (one server; a cluster of three), and the rendered manifests against
# the Kubernetes schemas with kubeconform. Each tool that is missing is skipped with the
# reason (neither is in Debian's archive, PyPI or npm; install them from their releases).
# The checks that need no tool (values against values.schema.json, template references,
# the configuration's keys) are tests/deploy/test_helm_chart.py.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
chart="$here/tiered"

if ! command -v helm >/dev/null 2>&1; then
  echo "helm chart: SKIPPED helm lint / helm template / kubeconform: helm is not installed (not in this machine's package registries)"
  exit 0
fi
status=0
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
for values in "$here"/ci/*.yaml; do
  name=$(basename "$values" .yaml)
  echo "== helm lint --strict ($name)"
  helm lint --strict "$chart" -f "$values" || status=1
  echo "== helm template ($name)"
  helm template ci "$chart" -f "$values" >"$out/$name.yaml" || status=1
done
if command -v kubeconform >/dev/null 2>&1; then
  echo "== kubeconform"
  kubeconform -strict -summary "$out"/*.yaml || status=1
else
  echo "helm chart: SKIPPED kubeconform: not installed (not in this machine's package registries)"
fi
exit "$status"
