#!/usr/bin/env bash
# Read tiered's secrets from SSM Parameter Store into root-only files on tmpfs (never
# on disk, never in the user data or the logs): the admin token, and in a cluster the
# cluster secret that signs node-to-node requests. tiered.service (and
# tiered-gc.service) get them through systemd's LoadCredential=; the CloudWatch agent
# (root) reads the admin token to scrape /metrics. Runs at every boot as
# tiered-secrets.service.
#
#   secrets.sh [BOOTSTRAP_ENV]   (default /etc/tiered/bootstrap.env)
set -euo pipefail

# shellcheck source=/dev/null
. "${1:-/etc/tiered/bootstrap.env}"
: "${AWS_REGION:?}" "${ADMIN_TOKEN_PARAMETER:?}" "${ADMIN_TOKEN_FILE:?}"

umask 077

# fetch PARAMETER FILE: the SecureString's value into FILE (0600, root), atomically.
fetch() {
  local parameter=$1 file=$2 dir tmp attempt
  dir=$(dirname "$file")
  install -d -m 0700 -o root -g root "$dir"
  tmp=$(mktemp "$dir/.secret.XXXXXX")
  # Retried: a role created moments ago can take a while to be usable everywhere.
  for attempt in $(seq 1 30); do
    if aws ssm get-parameter --region "$AWS_REGION" --name "$parameter" \
      --with-decryption --query Parameter.Value --output text >"$tmp" && [[ -s $tmp ]]; then
      chmod 0600 "$tmp"
      mv -f "$tmp" "$file"
      echo "tiered-secrets: wrote $file from $parameter" >&2
      return 0
    fi
    echo "tiered-secrets: cannot read $parameter (attempt $attempt); retrying" >&2
    sleep $((attempt < 6 ? attempt * 2 : 10))
  done
  rm -f "$tmp"
  echo "tiered-secrets: giving up on $parameter; tiered will not start" >&2
  return 1
}

fetch "$ADMIN_TOKEN_PARAMETER" "$ADMIN_TOKEN_FILE"
if [[ -n ${CLUSTER_SECRET_PARAMETER:-} ]]; then
  fetch "$CLUSTER_SECRET_PARAMETER" "${CLUSTER_SECRET_FILE:?}"
fi
