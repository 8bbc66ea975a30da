#!/usr/bin/env bash
# First boot of a tiered node (cloud-init's runcmd runs this once per instance, after
# writing /etc/tiered/bootstrap.env, /etc/tiered/tiered.toml, the systemd units and the
# CloudWatch agent configuration). Installs tiered from the release artifact in the
# deployment's bucket - offline, every file checked against the digests Terraform
# recorded - and the agent, then starts the units; every later boot just starts the
# enabled units. Output goes to /var/log/cloud-init-output.log.
#
# Plain bash on purpose: no Terraform templating in here, so shellcheck sees exactly
# what runs. Inputs come from the env file; none of them is a secret.
#
#   user-data.sh [BOOTSTRAP_ENV]   (default /etc/tiered/bootstrap.env)
set -euo pipefail

# shellcheck source=/dev/null
. "${1:-/etc/tiered/bootstrap.env}"
: "${AWS_REGION:?}" "${ARTIFACT_BUCKET:?}" "${ARTIFACT_PREFIX:?}" "${ARTIFACT_SHA256SUMS:?}"
: "${WHEELHOUSE:?}" "${VENV:?}" "${CONFIG_FILE:?}" "${ENABLE_UNITS:?}" "${START_UNITS:?}"
: "${CWAGENT_CTL:?}" "${CWAGENT_CONFIG:?}"

log() { echo "tiered-boot: $*" >&2; }

# tiered needs Python 3.11+; e2fsprogs for the hot volume's file system.
dnf install -y python3.11 python3.11-pip amazon-cloudwatch-agent e2fsprogs

# An unprivileged system user owns the data dir and runs the server.
getent group tiered >/dev/null || groupadd --system tiered
id -u tiered >/dev/null 2>&1 ||
  useradd --system --gid tiered --home-dir /nonexistent --no-create-home --shell /sbin/nologin tiered

# The wheelhouse: one copy of the artifact's prefix, then SHA256SUMS checked against the
# digest Terraform recorded and every other file against SHA256SUMS (no file more, none
# less). pip checks every wheel once more against requirements.txt (--require-hashes),
# so every instance of one deployment runs byte-identical code and libraries, and
# nothing comes from a package index.
rm -rf "$WHEELHOUSE"
install -d -m 0755 "$WHEELHOUSE"
for attempt in $(seq 1 10); do
  if aws s3 cp --only-show-errors --recursive --region "$AWS_REGION" \
    "s3://$ARTIFACT_BUCKET/$ARTIFACT_PREFIX/" "$WHEELHOUSE/"; then
    break
  fi
  if ((attempt == 10)); then
    log "giving up on s3://$ARTIFACT_BUCKET/$ARTIFACT_PREFIX/"
    exit 1
  fi
  # A role created moments ago can take a while to be usable everywhere.
  log "cannot fetch the wheelhouse (attempt $attempt); retrying"
  sleep $((attempt * 3))
done
if [[ ! -f $WHEELHOUSE/SHA256SUMS ]]; then
  log "s3://$ARTIFACT_BUCKET/$ARTIFACT_PREFIX/ holds no SHA256SUMS: not installing"
  exit 1
fi
digest=$(sha256sum "$WHEELHOUSE/SHA256SUMS" | cut -d' ' -f1)
if [[ $digest != "$ARTIFACT_SHA256SUMS" ]]; then
  log "SHA256SUMS has digest $digest, not the $ARTIFACT_SHA256SUMS this deployment recorded: not installing"
  exit 1
fi
listed=$(cut -c67- "$WHEELHOUSE/SHA256SUMS" | LC_ALL=C sort)
present=$(find "$WHEELHOUSE" -mindepth 1 ! -name SHA256SUMS -printf '%P\n' | LC_ALL=C sort)
if [[ $listed != "$present" ]] || ! (cd "$WHEELHOUSE" && sha256sum --check --strict --quiet SHA256SUMS); then
  log "the wheelhouse does not match SHA256SUMS: not installing"
  exit 1
fi

rm -rf "$VENV"
python3.11 -m venv "$VENV"
"$VENV/bin/pip" install --disable-pip-version-check --no-cache-dir --no-index \
  --find-links "$WHEELHOUSE" --require-hashes -r "$WHEELHOUSE/requirements.txt"

# A cluster node: its id (the instance id) and the URL its peers forward to (its private
# address), from the instance metadata (IMDSv2), once: they do not change for an instance.
node_env=()
if [[ -n ${NODE_ENV_FILE:-} ]]; then
  : "${IMDS_ENDPOINT:?}" "${PORT:?}"
  imds_token=$(curl -fsS --max-time 5 -X PUT "$IMDS_ENDPOINT/latest/api/token" \
    -H 'X-aws-ec2-metadata-token-ttl-seconds: 60')
  metadata() { curl -fsS --max-time 5 -H "X-aws-ec2-metadata-token: $imds_token" "$IMDS_ENDPOINT/latest/meta-data/$1"; }
  instance_id=$(metadata instance-id)
  address=$(metadata local-ipv4)
  if [[ ! $instance_id =~ ^i-[0-9a-f]+$ || ! $address =~ ^[0-9]+(\.[0-9]+){3}$ ]]; then
    log "unexpected instance metadata: id '$instance_id', address '$address'"
    exit 1
  fi
  install -d -m 0755 "$(dirname "$NODE_ENV_FILE")"
  printf 'TIERED_CLUSTER_NODE_ID=%s\nTIERED_CLUSTER_ADVERTISE_URL=http://%s:%s\n' \
    "$instance_id" "$address" "$PORT" >"$NODE_ENV_FILE"
  node_env=("$NODE_ENV_FILE")
fi

# Refuse to go on with a configuration tiered would refuse (unknown keys, bad values),
# before anything is started (with the node's environment, as tiered.service runs it;
# -I: only the venv's tiered, never a directory that happens to be the current one).
"$VENV/bin/python" -I -c '
import sys
from tiered.core.config import load_config
env = {}
for path in sys.argv[2:]:
    for line in open(path):
        name, sep, value = line.strip().partition("=")
        if sep:
            env[name] = value
load_config(sys.argv[1], env=env)
' "$CONFIG_FILE" "${node_env[@]}"

# Metrics first, so disk use and the scrape are there from the start.
"$CWAGENT_CTL" -a fetch-config -m ec2 -s -c "file:$CWAGENT_CONFIG"

systemctl daemon-reload
read -ra enable <<<"$ENABLE_UNITS"
read -ra start <<<"$START_UNITS"
systemctl enable "${enable[@]}"
# tiered.service pulls in what it Requires= first (the data dir's disk, the secrets)
# and fails loudly here (and in cloud-init's status) if any of it cannot be had.
systemctl start "${start[@]}"
log "started ${start[*]}; journalctl -u tiered"
