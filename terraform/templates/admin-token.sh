#!/usr/bin/env bash
# Read tiered's admin token from SSM Parameter Store into a root-only file on tmpfs
# (never on disk, never in the user data or the logs). tiered.service and
# tiered-gc.service get it through systemd's LoadCredential=; the CloudWatch agent
# (root) reads it to scrape /metrics. Runs at every boot as tiered-admin-token.service.
set -euo pipefail

# shellcheck source=/dev/null
. /etc/tiered/bootstrap.env
: "${AWS_REGION:?}" "${ADMIN_TOKEN_PARAMETER:?}" "${ADMIN_TOKEN_FILE:?}"

umask 077
dir=$(dirname "$ADMIN_TOKEN_FILE")
install -d -m 0700 -o root -g root "$dir"
tmp=$(mktemp "$dir/.admin-token.XXXXXX")
trap 'rm -f "$tmp"' EXIT

# Retried: a role created moments ago can take a while to be usable everywhere.
for attempt in $(seq 1 30); do
  if aws ssm get-parameter --region "$AWS_REGION" --name "$ADMIN_TOKEN_PARAMETER" \
    --with-decryption --query Parameter.Value --output text >"$tmp" && [[ -s $tmp ]]; then
    chmod 0600 "$tmp"
    mv -f "$tmp" "$ADMIN_TOKEN_FILE"
    trap - EXIT
    echo "tiered-admin-token: wrote $ADMIN_TOKEN_FILE from $ADMIN_TOKEN_PARAMETER" >&2
    exit 0
  fi
  echo "tiered-admin-token: cannot read $ADMIN_TOKEN_PARAMETER (attempt $attempt); retrying" >&2
  sleep $((attempt < 6 ? attempt * 2 : 10))
done
echo "tiered-admin-token: giving up on $ADMIN_TOKEN_PARAMETER; tiered will not start" >&2
exit 1
