#!/usr/bin/env bash
# The .deb on a clean Debian 12: a minbase root made by mmdebstrap (nothing
# of this machine in it), `apt-get install ./kvdepot_*.deb` inside it, then
# what the package promises: the user kvdepot and its directories, the
# configuration in /etc readable by the group only, the unit pointing at
# the installed daemon, the daemon started as kvdepot on the package's own
# configuration answering a member of the group kvdepot (and refusing
# anyone else), a put and a get through the installed CLI, a clean stop,
# and remove / purge leaving what each should. `make test-deb`; needs root.
# Usage: tests/packaging/test_deb.sh DEB
set -euo pipefail

if [[ ${1:-} == --inside ]]; then
    # In a mount and PID namespace of our own: whatever is started here
    # dies with this script, and /proc is mounted for the root only.
    root=$2 deb=$3 port=$4
    mount -t proc proc "$root/proc"
    inroot() { chroot "$root" "$@"; }
    as() {
        local user=$1
        shift
        chroot --userspec="$user:$user" --groups="$(inroot id -Gn "$user" | tr ' ' ,)" \
            "$root" "$@"
    }
    fail() {
        echo "test_deb: $*" >&2
        exit 1
    }

    cp "$deb" "$root/tmp/"
    inroot apt-get -o Dpkg::Use-Pty=0 update -qq
    DEBIAN_FRONTEND=noninteractive inroot apt-get -o Dpkg::Use-Pty=0 install -y -qq --no-install-recommends \
        "/tmp/$(basename "$deb")" >/dev/null
    inroot dpkg-query -W -f='${Status} ${Version}\n' kvdepot | grep -q '^install ok installed'

    inroot getent passwd kvdepot | grep -q ':/var/lib/kvdepot:/usr/sbin/nologin$' ||
        fail "no system user kvdepot"
    test "$(inroot stat -c '%U:%G %a' /etc/kvdepot/kvdepotd.yaml)" = "root:kvdepot 640" ||
        fail "/etc/kvdepot/kvdepotd.yaml: $(inroot stat -c '%U:%G %a' /etc/kvdepot/kvdepotd.yaml)"
    for d in /run/kvdepot /var/lib/kvdepot; do
        test "$(inroot stat -c '%U:%G %a' "$d")" = "kvdepot:kvdepot 750" || fail "$d"
    done
    grep -qx 'ExecStart=/usr/sbin/kvdepotd --config /etc/kvdepot/kvdepotd.yaml' \
        "$root/usr/lib/systemd/system/kvdepotd.service" || fail "unit ExecStart"
    grep -qx 'u kvdepot - "kvdepot store daemon" /var/lib/kvdepot /usr/sbin/nologin' \
        "$root/usr/lib/sysusers.d/kvdepot.conf" || fail "sysusers entry"
    inroot kvdepotd --version | grep -q "$(dpkg-deb -f "$deb" Version)" || fail "--version"
    # Every check a start makes, on the package's configuration as is.
    as kvdepot /usr/sbin/kvdepotd --config /etc/kvdepot/kvdepotd.yaml --check-config >/dev/null ||
        fail "--check-config refuses the package's configuration"

    # An engine's user (in the group kvdepot) and a stranger.
    inroot useradd --create-home --groups kvdepot engine
    inroot useradd --create-home stranger

    # Started as the unit would (user kvdepot, its configuration); only the
    # sizes (an 8 GiB arena touched at start, 16 GiB preallocated on NVMe)
    # and the fixed metrics port are changed for a test machine.
    chroot --userspec=kvdepot:kvdepot "$root" \
        /usr/sbin/kvdepotd --config /etc/kvdepot/kvdepotd.yaml \
        --set store.arena_size=256m --set store.disk_size=256m \
        --set server.metrics_address="127.0.0.1:$port" \
        --ready-file /run/kvdepot/ready 2>"$root/tmp/kvdepotd.log" &
    pid=$!
    for _ in $(seq 300); do
        [[ -f $root/run/kvdepot/ready ]] || ! kill -0 "$pid" 2>/dev/null && break
        sleep 0.1
    done
    [[ -f $root/run/kvdepot/ready ]] || {
        cat "$root/tmp/kvdepotd.log" >&2
        fail "kvdepotd did not start"
    }
    test "$(inroot stat -c '%U:%G %a' /run/kvdepot/kvdepotd.sock)" = "kvdepot:kvdepot 660" ||
        fail "socket $(inroot stat -c '%U:%G %a' /run/kvdepot/kvdepotd.sock)"
    as engine kvdepot ping | grep -q 'kvdepotd' || fail "ping as a member of kvdepot"
    if as stranger kvdepot ping >/dev/null 2>&1; then
        fail "a user outside the group kvdepot reached the socket"
    fi
    head -c 100000 /dev/urandom >"$root/tmp/block"
    chmod 0644 "$root/tmp/block"
    ns=00112233445566778899aabbccddeeff
    key=$(printf '%064x' 42)
    as engine kvdepot put -n "$ns" -k "$key" /tmp/block >/dev/null || fail "put"
    as engine kvdepot get -n "$ns" -k "$key" /home/engine/back >/dev/null || fail "get"
    cmp "$root/tmp/block" "$root/home/engine/back" || fail "get returned other bytes"
    curl -sf "http://127.0.0.1:$port/readyz" | grep -q ready || fail "/readyz"

    kill -TERM "$pid"
    rc=0
    wait "$pid" || rc=$?
    [[ $rc -eq 0 ]] || {
        cat "$root/tmp/kvdepotd.log" >&2
        fail "kvdepotd exited $rc after SIGTERM"
    }

    DEBIAN_FRONTEND=noninteractive inroot apt-get -o Dpkg::Use-Pty=0 remove -y -qq kvdepot >/dev/null
    [[ ! -e $root/usr/sbin/kvdepotd ]] || fail "remove left kvdepotd"
    [[ -f $root/etc/kvdepot/kvdepotd.yaml ]] || fail "remove took the conffile"
    DEBIAN_FRONTEND=noninteractive inroot apt-get -o Dpkg::Use-Pty=0 purge -y -qq kvdepot >/dev/null
    [[ ! -e $root/etc/kvdepot && ! -e $root/var/lib/kvdepot ]] ||
        fail "purge left /etc/kvdepot or /var/lib/kvdepot"
    exit 0
fi

deb=$(realpath "${1:?usage: $0 DEB}")
if [[ $(id -u) -ne 0 ]]; then
    echo "test_deb: needs root (mmdebstrap, chroot)" >&2
    exit 1
fi
src=$(cd "$(dirname "$0")/../.." && pwd)
tmp=$(mktemp -d "${TMPDIR:-/tmp}/kvdepot-deb.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
start=$SECONDS
"$src/scripts/debian-root.sh" "$tmp/root"
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
unshare --mount --pid --fork --kill-child "$0" --inside "$tmp/root" "$deb" "$port"
echo "test_deb: $(basename "$deb") installs on a clean Debian 12, runs as" \
    "kvdepot, serves its group only, removes and purges cleanly" \
    "($((SECONDS - start)) s)"
