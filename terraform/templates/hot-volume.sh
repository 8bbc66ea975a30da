#!/usr/bin/env bash
# Attach tiered's hot EBS volume to this instance, check its file system (make one
# only on a blank volume, never on one holding data) and mount it. Runs at every
# boot as tiered-hot-volume.service, before tiered.service; idempotent.
#
# After an instance loss the Auto Scaling group's replacement runs this too: it
# waits until the lost instance has released the volume, then attaches it, and
# tiered recovers from the journal on it.
set -euo pipefail

# shellcheck source=/dev/null
. /etc/tiered/bootstrap.env
: "${AWS_REGION:?}" "${HOT_VOLUME_ID:?}" "${MOUNT_POINT:?}" "${DATA_DIR:?}" "${VOLUME_ATTACH_TIMEOUT_S:?}"
export AWS_REGION AWS_DEFAULT_REGION="$AWS_REGION"

readonly DEVICE_NAME=/dev/sdf   # the name EC2 is asked for; NVMe instances rename it
readonly FS_TYPE=ext4
readonly FS_LABEL=tiered-hot

log() { echo "tiered-hot-volume: $*" >&2; }

instance_id() {
  local token
  token=$(curl -fsS --max-time 5 -X PUT http://169.254.169.254/latest/api/token \
    -H 'X-aws-ec2-metadata-token-ttl-seconds: 60')
  curl -fsS --max-time 5 -H "X-aws-ec2-metadata-token: $token" \
    http://169.254.169.254/latest/meta-data/instance-id
}

# The block device of the volume once attached: NVMe instances expose EBS volumes
# by serial (the volume id without its dash); Xen instances under the asked name.
find_device() {
  local candidate
  for candidate in "/dev/disk/by-id/nvme-Amazon_Elastic_Block_Store_${HOT_VOLUME_ID//-/}" \
    "$DEVICE_NAME" /dev/xvdf; do
    if [[ -b $candidate ]]; then
      readlink -f "$candidate"
      return 0
    fi
  done
  return 1
}

attach() {
  local me deadline out state attached_to
  me=$(instance_id)
  deadline=$((SECONDS + VOLUME_ATTACH_TIMEOUT_S))
  while :; do
    if out=$(aws ec2 describe-volumes --volume-ids "$HOT_VOLUME_ID" \
      --query 'Volumes[0].[State, Attachments[0].InstanceId]' --output text); then
      read -r state attached_to <<<"$out"
      case $state in
        in-use)
          if [[ $attached_to == "$me" ]]; then
            return 0
          fi
          log "$HOT_VOLUME_ID is attached to $attached_to; waiting for it to be released"
          ;;
        available)
          log "attaching $HOT_VOLUME_ID to $me as $DEVICE_NAME"
          aws ec2 attach-volume --volume-id "$HOT_VOLUME_ID" --instance-id "$me" \
            --device "$DEVICE_NAME" >/dev/null || log "attach-volume failed; retrying"
          ;;
        *)
          log "$HOT_VOLUME_ID is $state; waiting"
          ;;
      esac
    else
      log "describe-volumes failed; retrying"
    fi
    if ((SECONDS >= deadline)); then
      log "gave up after ${VOLUME_ATTACH_TIMEOUT_S}s: $HOT_VOLUME_ID is not attached here; tiered will not start"
      return 1
    fi
    sleep 5
  done
}

wait_for_device() {
  local deadline=$((SECONDS + 120))
  until find_device >/dev/null; do
    if ((SECONDS >= deadline)); then
      log "$HOT_VOLUME_ID is attached but no block device appeared"
      return 1
    fi
    sleep 2
  done
  find_device
}

# Make a file system only on a volume with no signature of any kind and nothing
# but zeros at its start; check (and replay the journal of) an existing one; refuse
# anything else rather than risk the data on it.
prepare_filesystem() {
  local dev=$1 probe rc fs_type
  rc=0
  probe=$(blkid -p -o export "$dev") || rc=$?
  case $rc in
    0)
      fs_type=$(sed -n 's/^TYPE=//p' <<<"$probe")
      if [[ $fs_type != "$FS_TYPE" ]]; then
        log "refusing to use $dev: it holds '${fs_type:-no file system (a partition table?)}', not $FS_TYPE"
        return 1
      fi
      rc=0
      e2fsck -p "$dev" || rc=$?
      # 0: clean, 1: errors corrected; anything else needs a human.
      if ((rc > 1)); then
        log "e2fsck -p $dev exited $rc: not mounting; repair it by hand (Session Manager)"
        return 1
      fi
      ;;
    2)
      if ! cmp -s -n 1048576 "$dev" /dev/zero; then
        log "refusing to format $dev: no known signature, but its first MiB is not blank"
        return 1
      fi
      log "$dev is blank: creating an $FS_TYPE file system"
      mkfs.ext4 -q -L "$FS_LABEL" -m 0 -E nodiscard "$dev"
      ;;
    *)
      log "blkid -p $dev exited $rc (ambiguous or unreadable): not touching it"
      return 1
      ;;
  esac
}

main() {
  local dev
  if mountpoint -q "$MOUNT_POINT"; then
    log "$MOUNT_POINT is already mounted"
  else
    attach
    dev=$(wait_for_device)
    prepare_filesystem "$dev"
    mkdir -p "$MOUNT_POINT"
    mount -t "$FS_TYPE" -o noatime,nodev,nosuid,noexec "$dev" "$MOUNT_POINT"
    log "mounted $dev ($HOT_VOLUME_ID) on $MOUNT_POINT"
    # After hot_volume_size_gib was raised (EBS grows in place), grow the file
    # system online to match; a no-op otherwise.
    resize2fs "$dev" || log "resize2fs $dev failed; the file system keeps its size"
  fi

  mkdir -p "$DATA_DIR"
  # A replacement instance may have given the tiered user another uid.
  if [[ $(stat -c %u "$DATA_DIR") != "$(id -u tiered)" ]]; then
    chown -R tiered:tiered "$DATA_DIR"
  fi
  chmod 0750 "$DATA_DIR"
}

main "$@"
