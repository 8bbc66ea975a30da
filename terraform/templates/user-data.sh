#!/usr/bin/env bash
# First boot of a tiered node (cloud-init runs this once per instance, after writing
# /etc/tiered/bootstrap.env, /etc/tiered/tiered.toml, the systemd units and the
# CloudWatch agent configuration). Installs tiered and the agent, then starts the
# units; every later boot just starts the enabled units. Output goes to
# /var/log/cloud-init-output.log.
#
# Plain bash on purpose: no Terraform templating in here, so shellcheck sees exactly
# what runs. Inputs come from the env file; none of them is a secret.
set -euo pipefail

# shellcheck source=/dev/null
. /etc/tiered/bootstrap.env
: "${PIP_SPEC:?}" "${VENV:?}" "${CONFIG_FILE:?}" "${CWAGENT_CONFIG:?}"

# tiered needs Python 3.11+; e2fsprogs for the hot volume's file system.
dnf install -y python3.11 python3.11-pip amazon-cloudwatch-agent e2fsprogs

# An unprivileged system user owns the data dir and runs the server.
getent group tiered >/dev/null || groupadd --system tiered
id -u tiered >/dev/null 2>&1 ||
  useradd --system --gid tiered --home-dir /nonexistent --no-create-home --shell /sbin/nologin tiered

python3.11 -m venv "$VENV"
"$VENV/bin/pip" install --disable-pip-version-check --no-cache-dir --upgrade pip
"$VENV/bin/pip" install --disable-pip-version-check --no-cache-dir "$PIP_SPEC"

# Refuse to go on with a configuration tiered would refuse (unknown keys, bad values),
# before anything is started.
"$VENV/bin/python" -c 'import sys; from tiered.config import load_config; load_config(sys.argv[1], env={})' "$CONFIG_FILE"

# Metrics first, so disk use and the scrape are there from the start.
/opt/aws/amazon-cloudwatch-agent/bin/amazon-cloudwatch-agent-ctl -a fetch-config -m ec2 -s -c "file:$CWAGENT_CONFIG"

systemctl daemon-reload
systemctl enable tiered-hot-volume.service tiered-admin-token.service tiered.service tiered-gc.timer
# Pulls in the token and the volume (attach, check, mount) first; fails loudly here
# (and in cloud-init's status) if either cannot be had.
systemctl start tiered.service
systemctl start tiered-gc.timer
echo "tiered: started; journalctl -u tiered -u tiered-hot-volume -u tiered-admin-token"
