#!/usr/bin/env bash
# A kvdepot cluster on one machine, in one command: an etcd, N kvdepotd
# nodes (default 3) registered in it, and the prefill -> decode proxy of
# docs/cluster.md in front of two engine URLs. Everything listens on
# 127.0.0.1 on ports picked at start (the daemons bind port 0 and report
# theirs), runs in the background and is stopped by its pid.
#
# Usage: deploy/local/cluster.sh up|down|status [--dir DIR] [--nodes N]
#   up      start etcd, the nodes and the proxy; print where each listens
#           and write DIR/cluster.env (shell variables, for `source`)
#   down    SIGTERM to each process (graceful), SIGKILL after 30 s;
#           --purge also deletes DIR
#   status  which processes run; the first node's view of the cluster
#   --dir DIR   state: configs, sockets, logs, pids, data
#               (default ./.kvdepot-cluster)
# Environment:
#   KVDEPOTD, KVDEPOT_CLI, ETCD  the programs (default: on PATH, else this
#               source tree's build/dev)
#   KVDEPOT_LOCAL_ARENA   each node's arena (default 256m)
#   KVDEPOT_LOCAL_DISK    each node's NVMe tier, under DIR (default 1g; 0:
#               none)
#   KVDEPOT_PREFILL_URL, KVDEPOT_DECODE_URL  the engines behind the proxy,
#               comma-separated for several (default http://127.0.0.1:8100
#               and http://127.0.0.1:8200); KVDEPOT_PROXY_PORT (default:
#               picked)
# Engines on node i use unix:DIR/node<i>/kvdepotd.sock as their store
# address and node<i> as their node_id (deploy/README.md, "A local
# cluster").
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
src=$(cd "$here/../.." && pwd)
cmd=${1:-}
[[ $# -gt 0 ]] && shift
dir=$PWD/.kvdepot-cluster
nodes=3
purge=0
while [[ $# -gt 0 ]]; do
    case "$1" in
    --dir) dir=$(realpath -m "$2") && shift ;;
    --nodes) nodes=$2 && shift ;;
    --purge) purge=1 ;;
    *) cmd=usage ;;
    esac
    shift
done

usage()
{
    awk 'NR >= 8 { if (!/^#/) exit; sub(/^# ?/, ""); print }' "$0" >&2
    exit 2
}
die()
{
    echo "cluster.sh: $*" >&2
    exit 1
}
find_prog()
{ # $1 variable value, $2 name on PATH, $3 path in the source tree
    if [[ -n $1 ]]; then
        echo "$1"
    elif command -v "$2" >/dev/null; then
        command -v "$2"
    elif [[ -x $src/$3 ]]; then
        echo "$src/$3"
    else
        die "no $2: install it or set the variable (see $0 --help)"
    fi
}
free_port()
{
    python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}
alive()
{ # $1 pid file
    [[ -f $1 ]] && kill -0 "$(cat "$1")" 2>/dev/null
}
wait_for()
{ # $1 seconds, then a command
    local end=$((SECONDS + $1))
    shift
    until "$@"; do
        ((SECONDS < end)) || return 1
        sleep 0.1
    done
}
metric()
{ # $1 metrics port, $2 name: the value, or nothing
    curl -sf "http://127.0.0.1:$1/metrics" 2>/dev/null |
        awk -v n="$2" '$1 == n {print $2}'
}
all_see()
{ # every node counts $nodes nodes
    local i p
    for i in $(seq "$nodes"); do
        p=$(sed -n 's/^metrics_port=//p' "$dir/node$i/ready" 2>/dev/null)
        [[ -n $p && "$(metric "$p" kvdepot_cluster_nodes)" == "$nodes" ]] || return 1
    done
}

start_etcd()
{
    local cport pport
    cport=$(free_port)
    pport=$(free_port)
    echo "$cport" >"$dir/etcd.port"
    setsid "$etcd" --name local --data-dir "$dir/etcd" \
        --listen-client-urls "http://127.0.0.1:$cport" \
        --advertise-client-urls "http://127.0.0.1:$cport" \
        --listen-peer-urls "http://127.0.0.1:$pport" \
        --initial-advertise-peer-urls "http://127.0.0.1:$pport" \
        --initial-cluster "local=http://127.0.0.1:$pport" \
        --log-level warn --logger zap </dev/null >>"$dir/etcd.log" 2>&1 &
    echo $! >"$dir/etcd.pid"
    wait_for 20 curl -sf "http://127.0.0.1:$cport/health" -o /dev/null ||
        die "etcd did not answer on 127.0.0.1:$cport ($dir/etcd.log)"
}

node_config()
{ # $1 node number: its kvdepotd.yaml
    local d=$dir/node$1 disk=${KVDEPOT_LOCAL_DISK:-1g}
    cat <<EOF
# node$1 of the local cluster (deploy/local/cluster.sh); a kvdepotd.yaml like
# deploy/config/kvdepotd.yaml, sized for one machine holding every node.
log:
  level: info
server:
  node_id: node$1
  unix_socket: $d/kvdepotd.sock
  tcp_address: "127.0.0.1:0"
  token_file: $dir/admin-token
  metrics_address: "127.0.0.1:0"
cluster:
  etcd: "127.0.0.1:$(cat "$dir/etcd.port")"
  name: local
  token_file: $dir/cluster-token
  lease_ttl: 5s
store:
  arena_size: ${KVDEPOT_LOCAL_ARENA:-256m}
  arena_chunk: 16m
  arena_prefault: false
  disk_path: "$([[ $disk == 0 ]] || echo "$d/nvme")"
  disk_size: $([[ $disk == 0 ]] && echo 16g || echo "$disk")
EOF
}

start_node()
{ # $1 node number
    local d=$dir/node$1
    mkdir -p "$d"
    rm -f "$d/ready"
    node_config "$1" >"$d/kvdepotd.yaml"
    # UCX on loopback only: without it UCX also offers the host's other
    # interfaces to the peers.
    UCX_NET_DEVICES=lo setsid "$kvdepotd" --config "$d/kvdepotd.yaml" \
        --ready-file "$d/ready" </dev/null >>"$d/kvdepotd.log" 2>&1 &
    echo $! >"$d/kvdepotd.pid"
}

start_proxy()
{
    local port=${KVDEPOT_PROXY_PORT:-$(free_port)}
    setsid python3 "$here/disagg_proxy.py" --listen "127.0.0.1:$port" \
        --prefill "${KVDEPOT_PREFILL_URL:-http://127.0.0.1:8100}" \
        --decode "${KVDEPOT_DECODE_URL:-http://127.0.0.1:8200}" \
        </dev/null >>"$dir/proxy.log" 2>&1 &
    echo $! >"$dir/proxy.pid"
    echo "$port" >"$dir/proxy.port"
    wait_for 10 curl -sf "http://127.0.0.1:$port/healthz" -o /dev/null ||
        die "the proxy did not start ($dir/proxy.log)"
}

up()
{
    [[ $nodes =~ ^[1-9][0-9]?$ ]] || die "--nodes: 1 to 99"
    kvdepotd=$(find_prog "${KVDEPOTD:-}" kvdepotd build/dev/server/kvdepotd)
    etcd=$(find_prog "${ETCD:-}" etcd /nonexistent)
    local pidfile
    for pidfile in "$dir"/*.pid "$dir"/node*/*.pid; do
        alive "$pidfile" && die "already up in $dir ($pidfile): down first"
    done
    mkdir -p "$dir"
    chmod 0700 "$dir"
    echo "$nodes" >"$dir/nodes"
    # The peers' shared secret and the admin token of the TCP listeners:
    # kept once made, so a restarted node rejoins.
    local t
    for t in cluster-token admin-token; do
        if [[ ! -s $dir/$t ]]; then
            (umask 077 && python3 -c 'import secrets; print(secrets.token_hex(32))' >"$dir/$t")
        fi
    done
    trap 'echo "cluster.sh: start failed; stopping what started" >&2; down' ERR
    start_etcd
    local i
    for i in $(seq "$nodes"); do
        start_node "$i"
    done
    for i in $(seq "$nodes"); do
        wait_for 60 test -f "$dir/node$i/ready" ||
            die "node$i did not start ($dir/node$i/kvdepotd.log)"
    done
    wait_for 30 all_see || die "the nodes do not all see $nodes nodes"
    start_proxy
    trap - ERR
    write_env
    status
    echo "environment: source $dir/cluster.env"
}

write_env()
{
    local i f=$dir/cluster.env
    {
        echo "# deploy/local/cluster.sh up: where the local cluster listens"
        echo "KVDEPOT_LOCAL_DIR=$dir"
        echo "KVDEPOT_LOCAL_NODES=$nodes"
        echo "KVDEPOT_LOCAL_ETCD=127.0.0.1:$(cat "$dir/etcd.port")"
        echo "KVDEPOT_LOCAL_PROXY=http://127.0.0.1:$(cat "$dir/proxy.port")"
        echo "KVDEPOT_LOCAL_TOKEN_FILE=$dir/admin-token"
        for i in $(seq "$nodes"); do
            echo "KVDEPOT_NODE${i}_ADDRESS=unix:$dir/node$i/kvdepotd.sock"
            echo "KVDEPOT_NODE${i}_TCP=tcp:127.0.0.1:$(sed -n 's/^tcp_port=//p' "$dir/node$i/ready")"
            echo "KVDEPOT_NODE${i}_METRICS=http://127.0.0.1:$(sed -n 's/^metrics_port=//p' "$dir/node$i/ready")"
        done
    } >"$f"
}

stop_pid()
{ # $1 pid file
    local pid
    alive "$1" || {
        rm -f "$1"
        return 0
    }
    pid=$(cat "$1")
    kill -TERM "$pid" 2>/dev/null || true
    wait_for 30 eval "! kill -0 $pid 2>/dev/null" || kill -KILL "$pid" 2>/dev/null || true
    rm -f "$1"
}

down()
{
    local f
    stop_pid "$dir/proxy.pid"
    for f in "$dir"/node*/kvdepotd.pid; do
        [[ -e $f ]] && stop_pid "$f" &
    done
    wait
    stop_pid "$dir/etcd.pid"
    if ((purge)); then
        rm -rf "$dir"
    fi
    echo "local cluster in $dir: stopped"
}

status()
{
    local i rc=0 p
    printf '%-8s %-8s %s\n' what pid where
    for i in $(seq "$nodes"); do
        p=$dir/node$i/kvdepotd.pid
        if alive "$p"; then
            printf '%-8s %-8s unix:%s, metrics 127.0.0.1:%s\n' "node$i" "$(cat "$p")" \
                "$dir/node$i/kvdepotd.sock" "$(sed -n 's/^metrics_port=//p' "$dir/node$i/ready")"
        else
            printf '%-8s %-8s %s\n' "node$i" - "not running" && rc=1
        fi
    done
    if alive "$dir/etcd.pid"; then
        printf '%-8s %-8s 127.0.0.1:%s\n' etcd "$(cat "$dir/etcd.pid")" "$(cat "$dir/etcd.port")"
    else
        printf '%-8s %-8s %s\n' etcd - "not running" && rc=1
    fi
    if alive "$dir/proxy.pid"; then
        printf '%-8s %-8s http://127.0.0.1:%s\n' proxy "$(cat "$dir/proxy.pid")" "$(cat "$dir/proxy.port")"
    else
        printf '%-8s %-8s %s\n' proxy - "not running" && rc=1
    fi
    if alive "$dir/node1/kvdepotd.pid"; then
        cli=$(find_prog "${KVDEPOT_CLI:-}" kvdepot build/dev/cli/kvdepot)
        "$cli" cluster nodes --address "unix:$dir/node1/kvdepotd.sock" || rc=1
    fi
    return $rc
}

if [[ $cmd != up && -f $dir/nodes ]]; then
    nodes=$(cat "$dir/nodes")
fi
case "$cmd" in
up) up ;;
down) down ;;
status) status ;;
*) usage ;;
esac
