#!/usr/bin/env bash
# Offline static checks of the Terraform module: checkov (security/misconfiguration
# policies) and shellcheck (every shell script the module ships). No provider
# downloads and no terraform binary needed. Exits non-zero on any finding.
#
#   terraform/checks.sh            # from anywhere
#   CHECKOV_VENV=/path terraform/checks.sh
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
venv="${CHECKOV_VENV:-$HOME/.cache/tiered-checkov-venv}"
checkov_version="3.3.30"
status=0

# checkov pins its own (old) boto3 and friends: keep it in a venv of its own,
# never in the project's environment.
installed=""
if [[ -x "$venv/bin/pip" ]]; then
  installed=$("$venv/bin/pip" show checkov 2>/dev/null | sed -n 's/^Version: //p') || true
fi
if [[ ! -x "$venv/bin/checkov" || "$installed" != "$checkov_version" ]]; then
  echo "== installing checkov $checkov_version into $venv"
  start=$SECONDS
  python3 -m venv "$venv"
  "$venv/bin/pip" install --quiet --disable-pip-version-check "checkov==$checkov_version"
  echo "== checkov installed in $((SECONDS - start)) s"
fi

echo "== checkov (framework terraform) on $here"
start=$SECONDS
# --skip-download: no policy/guideline download from the platform;
# CKV_SKIP_PACKAGE_UPDATE_CHECK: no PyPI version check. The scan makes no network calls.
if ! CKV_SKIP_PACKAGE_UPDATE_CHECK=true BC_SKIP_MAPPING=TRUE \
  "$venv/bin/checkov" --directory "$here" --framework terraform --skip-download \
  --compact --quiet --download-external-modules false; then
  echo "checkov: FAILED" >&2
  status=1
fi
echo "== checkov scan took $((SECONDS - start)) s"

echo "== shellcheck"
if ! command -v shellcheck >/dev/null 2>&1; then
  echo "shellcheck is missing: apt-get install -y shellcheck" >&2
  exit 1
fi
mapfile -t scripts < <(find "$here" -type f \( -name '*.sh' -o -name '*.sh.tftpl' \) -not -path '*/.terraform/*' | sort)
for script in "${scripts[@]}"; do
  if ! bash -n "$script"; then
    echo "bash -n: $script FAILED" >&2
    status=1
  fi
done
if ! shellcheck --shell=bash --severity=style "${scripts[@]}"; then
  echo "shellcheck: FAILED" >&2
  status=1
else
  echo "shellcheck: ${#scripts[@]} scripts clean"
fi

# terraform fmt needs no providers; use it when a terraform binary happens to exist.
if command -v terraform >/dev/null 2>&1; then
  echo "== terraform fmt -check"
  # An empty CLI configuration: fmt needs none, and this keeps it from warning.
  tf_cli_config=$(mktemp)
  trap 'rm -f "$tf_cli_config"' EXIT
  if ! TF_CLI_CONFIG_FILE="$tf_cli_config" terraform fmt -check -recursive -diff "$here"; then
    echo "terraform fmt: FAILED" >&2
    status=1
  fi
fi

exit "$status"
