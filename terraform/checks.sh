#!/usr/bin/env bash
# Static checks of the Terraform modules (the single node in terraform/, the cluster in
# terraform/cluster/) and of what deploys tiered beside them: checkov (security and
# misconfiguration policies) on the modules and on the Dockerfile, shellcheck on every
# shell script the modules and the repository's CI ship, and - where a terraform binary
# exists - `terraform fmt -check` and `terraform validate` of both examples with the AWS
# provider (the only one the modules need) from a local provider mirror or the registry.
# A validate that cannot get the provider (no mirror, registry unreachable) is skipped
# with the reason. Exits non-zero on any finding.
#
#   terraform/checks.sh                                   # from anywhere
#   CHECKOV_VENV=/path TF_PROVIDER_MIRROR=/path terraform/checks.sh
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(dirname "$here")"
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
echo "== checkov (framework dockerfile) on $repo/Dockerfile"
if ! CKV_SKIP_PACKAGE_UPDATE_CHECK=true BC_SKIP_MAPPING=TRUE \
  "$venv/bin/checkov" --file "$repo/Dockerfile" --framework dockerfile --skip-download \
  --compact --quiet; then
  echo "checkov (Dockerfile): FAILED" >&2
  status=1
fi
echo "== checkov scans took $((SECONDS - start)) s"

echo "== shellcheck"
if ! command -v shellcheck >/dev/null 2>&1; then
  echo "shellcheck is missing: apt-get install -y shellcheck" >&2
  exit 1
fi
mapfile -t scripts < <(
  {
    find "$here" "$repo/deploy" -type f \( -name '*.sh' -o -name '*.sh.tftpl' \) -not -path '*/.terraform/*'
    find "$repo/.ci" -type f
  } | sort
)
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

if ! command -v terraform >/dev/null 2>&1; then
  echo "terraform fmt / validate: SKIPPED: no terraform binary on this machine"
  exit "$status"
fi

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

echo "== terraform fmt -check"
# An empty CLI configuration: fmt needs none, and this keeps it from warning.
: >"$work/empty.tfrc"
if ! TF_CLI_CONFIG_FILE="$work/empty.tfrc" terraform fmt -check -recursive -diff "$here"; then
  echo "terraform fmt: FAILED" >&2
  status=1
fi

# terraform validate of each example (which calls its module) against the real provider
# schema. The AWS provider comes from a filesystem mirror when one holds it (a
# TF_PROVIDER_MIRROR, or the usual implied locations), else from the registry.
mirror=""
for dir in "${TF_PROVIDER_MIRROR:-}" /opt/tf-plugins "$HOME/.terraform.d/plugins" \
  "$HOME/.local/share/terraform/plugins" /usr/local/share/terraform/plugins /usr/share/terraform/plugins; do
  if [[ -n $dir && -d $dir/registry.terraform.io/hashicorp/aws ]]; then
    mirror=$dir
    break
  fi
done
if [[ -n $mirror ]]; then
  cat >"$work/validate.tfrc" <<TFRC
provider_installation {
  filesystem_mirror {
    path    = "$mirror"
    include = ["registry.terraform.io/hashicorp/aws"]
  }
  direct {
    exclude = ["registry.terraform.io/hashicorp/aws"]
  }
}
TFRC
else
  : >"$work/validate.tfrc"
fi
# A copy, so that .terraform/ and lock files never land in the work tree.
cp -r "$here" "$work/terraform"
for example in "$work"/terraform/examples/*/; do
  name=$(basename "$example")
  echo "== terraform validate examples/$name (aws provider from ${mirror:-the registry})"
  if ! (cd "$example" && TF_CLI_CONFIG_FILE="$work/validate.tfrc" terraform init -backend=false -input=false \
    -no-color >"$work/init-$name.log" 2>&1); then
    if [[ -z $mirror ]] && ! curl -sS --max-time 10 -o /dev/null https://registry.terraform.io/.well-known/terraform.json 2>"$work/curl.log"; then
      echo "terraform validate: SKIPPED examples/$name: no local mirror holds hashicorp/aws and the registry cannot be reached ($(head -n1 "$work/curl.log"))"
      continue
    fi
    cat "$work/init-$name.log" >&2
    echo "terraform init (examples/$name): FAILED" >&2
    status=1
    continue
  fi
  if ! (cd "$example" && TF_CLI_CONFIG_FILE="$work/validate.tfrc" terraform validate -no-color); then
    echo "terraform validate (examples/$name): FAILED" >&2
    status=1
  fi
done

exit "$status"
