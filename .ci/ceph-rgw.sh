#!/usr/bin/env bash
# A single-node Ceph RADOS Gateway on loopback: a real S3-compatible store for
# tests and CI (tests/support/ceph_rgw.py starts it once per pytest session).
#
#   .ci/ceph-rgw.sh up DIR     start mon + memstore OSD + radosgw, state under DIR
#   .ci/ceph-rgw.sh down DIR   stop them (by the pid files in DIR/run) and wait
#
# `up` writes DIR/env (NAME=value lines, shell- and Python-readable):
#   RGW_URL, RGW_TLS_URL, RGW_CA_BUNDLE, RGW_ACCESS_KEY, RGW_SECRET_KEY,
#   RGW_REGION, RGW_BUCKET, CEPH_CONF
# Settings (environment):
#   RGW_PORT, RGW_TLS_PORT, MON_PORT  ports on 127.0.0.1; unset or 0: pick free ones
#   RGW_BUCKET (tiered-test), RGW_REGION (us-east-1)
#   RGW_ACCESS_KEY / RGW_SECRET_KEY   default: random per cluster
#   CEPH_RGW_TIMEOUT                  seconds each daemon may take to come up (60)
#
# Needs the Debian/Ubuntu packages radosgw ceph-mon ceph-osd ceph-common, plus
# openssl, curl and python3. Runs as root in a container without systemd: the
# daemons run in the foreground of their own session (no daemonizing, no
# systemd), and this script records their pids itself. Everything listens on
# 127.0.0.1 only. The OSD keeps objects in memory (memstore): a restart starts
# from an empty cluster, which is what tests want.
set -euo pipefail

readonly DAEMONS_STOP_ORDER=(rgw osd mon)

die() {
    echo "ceph-rgw: $*" >&2
    exit 1
}

usage() {
    echo "usage: $0 up|down DIR" >&2
    exit 2
}

T0=$EPOCHREALTIME
mark() {
    # Elapsed time since the script started, in seconds with millisecond precision.
    local now=$EPOCHREALTIME
    local us=$(((${now//[.,]/} - ${T0//[.,]/}) / 1000))
    printf '[%3d.%03ds] %s\n' $((us / 1000)) $((us % 1000)) "$*"
}

# -- processes ------------------------------------------------------------------

# The binary each daemon name runs, so we never signal a recycled pid.
binary_of() {
    case $1 in
        mon) echo ceph-mon ;;
        osd) echo ceph-osd ;;
        rgw) echo radosgw ;;
        *) die "unknown daemon $1" ;;
    esac
}

# True if pid runs the daemon's binary and is not a zombie (an orphaned daemon
# may linger as a zombie when PID 1 does not reap, as in some containers).
is_running() {
    local pid=$1 binary=$2 state exe
    [[ -r /proc/$pid/stat ]] || return 1
    state=$(awk '{print $3}' "/proc/$pid/stat" 2>/dev/null) || return 1
    [[ $state != Z && $state != X ]] || return 1
    exe=$(tr '\0' '\n' <"/proc/$pid/cmdline" 2>/dev/null | head -n 1) || return 1
    [[ ${exe##*/} == "$binary" ]]
}

pid_of() {
    local file=$DIR/run/$1.pid pid
    [[ -s $file ]] || return 1
    pid=$(<"$file")
    [[ $pid =~ ^[0-9]+$ ]] || return 1
    is_running "$pid" "$(binary_of "$1")" || return 1
    echo "$pid"
}

stop_daemon() {
    local name=$1 pid i
    if pid=$(pid_of "$name"); then
        kill -TERM "$pid" 2>/dev/null || true
        for ((i = 0; i < 100; i++)); do
            is_running "$pid" "$(binary_of "$name")" || break
            sleep 0.1
        done
        if is_running "$pid" "$(binary_of "$name")"; then
            echo "ceph-rgw: $name ($pid) ignored SIGTERM for 10 s; SIGKILL" >&2
            kill -KILL "$pid" 2>/dev/null || true
            for ((i = 0; i < 50; i++)); do
                is_running "$pid" "$(binary_of "$name")" || break
                sleep 0.1
            done
            is_running "$pid" "$(binary_of "$name")" && die "$name ($pid) survived SIGKILL"
        fi
        echo "stopped $name ($pid)"
    fi
    rm -f "$DIR/run/$name.pid"
}

down() {
    local name
    for name in "${DAEMONS_STOP_ORDER[@]}"; do
        stop_daemon "$name"
    done
}

# Start a daemon in the foreground of its own session, detached from our stdio
# (a caller capturing our output must not wait for the daemons to exit).
spawn() {
    local name=$1
    shift
    setsid "$@" </dev/null >>"$DIR/log/$name.out" 2>&1 &
    echo $! >"$DIR/run/$name.pid"
}

# -- failure reporting ---------------------------------------------------------------

show_log() {
    local file
    for file in "$@"; do
        [[ -s $file ]] || continue
        echo "---- last lines of $file" >&2
        tail -n 40 "$file" >&2
    done
}

# Print the daemon's logs, stop everything started so far, and fail.
fail_daemon() {
    local name=$1 log=$2
    shift 2
    echo "ceph-rgw: $*" >&2
    show_log "$DIR/log/$name.out" "$DIR/log/$log.log"
    down >&2 || true
    exit 1
}

# Poll `check` every 0.1 s until it succeeds; fail with the daemon's log after the timeout.
wait_for() {
    local name=$1 log=$2 what=$3
    shift 3
    local deadline=$((${EPOCHREALTIME//[.,]/} + TIMEOUT * 1000000))
    until "$@" >/dev/null 2>&1; do
        pid_of "$name" >/dev/null || fail_daemon "$name" "$log" "$name exited before $what"
        ((${EPOCHREALTIME//[.,]/} < deadline)) || fail_daemon "$name" "$log" "$what: not within ${TIMEOUT} s"
        sleep 0.1
    done
}

ceph_cli() {
    timeout 10 ceph -c "$CONF" --connect-timeout 5 "$@"
}

osd_is_up() {
    ceph_cli osd dump 2>/dev/null | grep -q '^osd\.0 up'
}

# -- set-up steps ------------------------------------------------------------------

free_ports() {
    # $1 ports bound at once (so they differ), then released for the daemons.
    python3 - "$1" <<'EOF'
import socket, sys
socks = [socket.socket() for _ in range(int(sys.argv[1]))]
for s in socks:
    s.bind(("127.0.0.1", 0))
print(" ".join(str(s.getsockname()[1]) for s in socks))
EOF
}

port_is_free() {
    ! (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null
}

choose_ports() {
    local picked
    read -r -a picked <<<"$(free_ports 3)"
    RGW_PORT=${RGW_PORT:-0}
    RGW_TLS_PORT=${RGW_TLS_PORT:-0}
    MON_PORT=${MON_PORT:-0}
    [[ $RGW_PORT != 0 ]] || RGW_PORT=${picked[0]}
    [[ $RGW_TLS_PORT != 0 ]] || RGW_TLS_PORT=${picked[1]}
    [[ $MON_PORT != 0 ]] || MON_PORT=${picked[2]}
    local port
    for port in "$RGW_PORT" "$RGW_TLS_PORT" "$MON_PORT"; do
        if ! [[ $port =~ ^[0-9]+$ ]] || ((port < 1 || port > 65535)); then
            die "bad port $port"
        fi
        port_is_free "$port" || die "127.0.0.1:$port is already in use"
    done
}

# A throwaway CA and a server certificate it signs for 127.0.0.1 and localhost:
# clients verify the server against the CA bundle, as they would in production.
make_tls() {
    local tls=$DIR/tls
    mkdir -p "$tls"
    openssl req -x509 -new -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -days 30 \
        -subj "/CN=tiered test CA $(date -u +%Y%m%dT%H%M%S)" -keyout "$tls/ca.key" -out "$tls/ca.crt" \
        -addext "basicConstraints=critical,CA:TRUE" \
        -addext "keyUsage=critical,keyCertSign,cRLSign" 2>/dev/null
    openssl req -new -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes \
        -subj "/CN=localhost" -keyout "$tls/server.key" -out "$tls/server.csr" 2>/dev/null
    cat >"$tls/server.ext" <<'EOF'
basicConstraints = critical, CA:FALSE
keyUsage = critical, digitalSignature, keyEncipherment
extendedKeyUsage = serverAuth
subjectAltName = IP:127.0.0.1, DNS:localhost
subjectKeyIdentifier = hash
authorityKeyIdentifier = keyid, issuer
EOF
    openssl x509 -req -in "$tls/server.csr" -CA "$tls/ca.crt" -CAkey "$tls/ca.key" \
        -set_serial "0x$(openssl rand -hex 16)" -days 30 -extfile "$tls/server.ext" \
        -out "$tls/server.crt" 2>/dev/null
    openssl verify -CAfile "$tls/ca.crt" "$tls/server.crt" >/dev/null ||
        die "the generated server certificate does not verify against its CA"
    chmod 600 "$tls/ca.key" "$tls/server.key"
}

write_conf() {
    cat >"$CONF" <<EOF
[global]
fsid = $(cat /proc/sys/kernel/random/uuid)
mon host = v2:127.0.0.1:$MON_PORT
mon initial members = a
public addr = 127.0.0.1
cluster addr = 127.0.0.1
ms bind msgr1 = false
keyring = $DIR/keyring
run dir = $DIR/run
admin socket = $DIR/run/\$name.asok
log file = $DIR/log/\$name.log
mon data = $DIR/mon
osd data = $DIR/osd
rgw data = $DIR/rgw
# One OSD holding everything in memory; one replica, few placement groups.
osd objectstore = memstore
memstore device bytes = 2147483648
osd pool default size = 1
osd pool default min size = 1
osd pool default pg num = 8
osd pool default pgp num = 8
osd pool default pg autoscale mode = off
osd crush chooseleaf type = 0
mon allow pool size one = true
mon warn on pool no redundancy = false
mon max pg per osd = 1000
auth allow insecure global id reclaim = false
# The monitor stops itself when its disk has less free space than this (%).
mon data avail warn = 2
mon data avail crit = 1
# Without this every pool creation waits about a second for a paxos round.
paxos propose interval = 0.05

[client.rgw]
# tcp_nodelay: without it Nagle adds about 40 ms to every request.
rgw frontends = beast endpoint=127.0.0.1:$RGW_PORT ssl_endpoint=127.0.0.1:$RGW_TLS_PORT ssl_certificate=$DIR/tls/server.crt ssl_private_key=$DIR/tls/server.key tcp_nodelay=1
rgw dns name = localhost
rgw thread pool size = 64
# No lifecycle rules here; its thread sleeps in 5 s steps and holds up shutdown.
rgw enable lc threads = false
EOF
}

write_keyring() {
    # One keyring for every entity; `ceph-mon --mkfs` seeds the auth database from it.
    local keyring=$DIR/keyring
    ceph-authtool --create-keyring "$keyring" --gen-key -n mon. --cap mon 'allow *' >/dev/null
    ceph-authtool "$keyring" --gen-key -n client.admin \
        --cap mon 'allow *' --cap osd 'allow *' --cap mgr 'allow *' >/dev/null
    ceph-authtool "$keyring" --gen-key -n osd.0 \
        --cap mon 'allow profile osd' --cap osd 'allow *' --cap mgr 'allow profile osd' >/dev/null
    ceph-authtool "$keyring" --gen-key -n client.rgw \
        --cap mon 'allow rw' --cap osd 'allow rwx' --cap mgr 'allow rw' >/dev/null
    chmod 600 "$keyring"
}

rgw_answers() {
    curl -fsS -o /dev/null --max-time 2 "http://127.0.0.1:$RGW_PORT/" &&
        curl -fsS -o /dev/null --max-time 2 --cacert "$DIR/tls/ca.crt" "https://127.0.0.1:$RGW_TLS_PORT/"
}

# PUT /bucket signed with SigV4 (curl >= 7.75); 200 also when we already own it.
create_bucket() {
    curl -fsS -o /dev/null --max-time 10 -X PUT \
        --aws-sigv4 "aws:amz:$REGION:s3" --user "$ACCESS_KEY:$SECRET_KEY" \
        -H "x-amz-content-sha256: e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855" \
        "http://127.0.0.1:$RGW_PORT/$BUCKET"
}

# The daemons are up and S3 answers with our credentials: a rerun has nothing to do.
already_up() {
    [[ -s $DIR/env ]] || return 1
    local name
    for name in mon osd rgw; do
        pid_of "$name" >/dev/null || return 1
    done
    # shellcheck disable=SC1091
    (set -a && . "$DIR/env" && curl -fsS -o /dev/null --max-time 2 \
        --aws-sigv4 "aws:amz:$RGW_REGION:s3" --user "$RGW_ACCESS_KEY:$RGW_SECRET_KEY" \
        -H "x-amz-content-sha256: e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855" \
        "$RGW_URL/$RGW_BUCKET")
}

up() {
    local bin
    for bin in ceph-mon ceph-osd radosgw radosgw-admin ceph ceph-authtool monmaptool openssl curl python3 setsid timeout; do
        command -v "$bin" >/dev/null ||
            die "$bin is not installed (apt-get install -y --no-install-recommends radosgw ceph-mon ceph-osd ceph-common openssl curl)"
    done
    if already_up; then
        mark "already up: settings in $DIR/env"
        return 0
    fi
    # A fresh cluster every time: memstore lost its data with the old OSD anyway.
    down
    rm -rf "${DIR:?}"/{mon,osd,rgw,run,log,tls} "$DIR/keyring" "$DIR/monmap" "$DIR/ceph.conf" "$DIR/env"
    mkdir -p "$DIR"/{mon,osd,rgw,run,log}

    TIMEOUT=${CEPH_RGW_TIMEOUT:-60}
    [[ $TIMEOUT =~ ^[0-9]+$ ]] || die "CEPH_RGW_TIMEOUT must be whole seconds"
    BUCKET=${RGW_BUCKET:-tiered-test}
    REGION=${RGW_REGION:-us-east-1}
    ACCESS_KEY=${RGW_ACCESS_KEY:-TIERED$(openssl rand -hex 7 | tr '[:lower:]' '[:upper:]')}
    SECRET_KEY=${RGW_SECRET_KEY:-$(openssl rand -hex 20)}
    CONF=$DIR/ceph.conf
    choose_ports
    make_tls
    write_conf
    write_keyring
    mark "config, keys and TLS certificates written (mon :$MON_PORT, S3 :$RGW_PORT, S3 over TLS :$RGW_TLS_PORT)"

    monmaptool --create --fsid "$(awk '/^fsid/ {print $3}' "$CONF")" \
        --addv a "[v2:127.0.0.1:$MON_PORT]" "$DIR/monmap" >/dev/null
    ceph-mon -c "$CONF" -i a --mkfs --monmap "$DIR/monmap" >>"$DIR/log/mon.out" 2>&1 ||
        fail_daemon mon mon.a "ceph-mon --mkfs failed"
    spawn mon ceph-mon -c "$CONF" -i a -f
    wait_for mon mon.a "the monitor answering" ceph_cli mon stat
    mark "mon up"

    local osd_uuid
    osd_uuid=$(cat /proc/sys/kernel/random/uuid)
    ceph_cli osd new "$osd_uuid" 0 >/dev/null || fail_daemon mon mon.a "ceph osd new failed"
    ceph-osd -c "$CONF" -i 0 --mkfs --osd-uuid "$osd_uuid" >>"$DIR/log/osd.out" 2>&1 ||
        fail_daemon osd osd.0 "ceph-osd --mkfs failed"
    spawn osd ceph-osd -c "$CONF" -i 0 -f
    wait_for osd osd.0 "osd.0 up" osd_is_up
    mark "osd up"

    spawn rgw radosgw -c "$CONF" -n client.rgw -f
    wait_for rgw client.rgw "radosgw answering on :$RGW_PORT and :$RGW_TLS_PORT" rgw_answers
    mark "rgw answering"

    timeout 30 radosgw-admin -c "$CONF" user create --uid=tiered --display-name="tiered tests" \
        --access-key="$ACCESS_KEY" --secret-key="$SECRET_KEY" >/dev/null 2>>"$DIR/log/rgw.out" ||
        fail_daemon rgw client.rgw "radosgw-admin user create failed"
    create_bucket 2>>"$DIR/log/rgw.out" || fail_daemon rgw client.rgw "creating bucket $BUCKET failed"
    mark "user and bucket $BUCKET ready"

    # Written last and atomically: its presence means the cluster came up.
    (
        umask 077
        cat >"$DIR/env.tmp" <<EOF
RGW_URL=http://127.0.0.1:$RGW_PORT
RGW_TLS_URL=https://127.0.0.1:$RGW_TLS_PORT
RGW_CA_BUNDLE=$DIR/tls/ca.crt
RGW_ACCESS_KEY=$ACCESS_KEY
RGW_SECRET_KEY=$SECRET_KEY
RGW_REGION=$REGION
RGW_BUCKET=$BUCKET
CEPH_CONF=$CONF
EOF
    )
    mv "$DIR/env.tmp" "$DIR/env"
    mark "up: settings in $DIR/env"
}

main() {
    [[ $# -eq 2 && -n $2 ]] || usage
    local cmd=$1
    [[ $cmd == up || $cmd == down ]] || usage
    if [[ $cmd == down && ! -d $2 ]]; then
        return 0 # nothing was ever started there
    fi
    mkdir -p "$2"
    DIR=$(cd "$2" && pwd -P)
    # The path goes into ceph.conf and DIR/env unquoted.
    [[ $DIR =~ ^[A-Za-z0-9._/+-]+$ ]] || die "DIR must be a path without spaces or special characters: $DIR"
    if [[ $cmd == up ]]; then
        up
    else
        down
        mark "down"
    fi
}

main "$@"
