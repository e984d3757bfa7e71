#!/usr/bin/env bash
# The kvdepotd image (scripts/build-image.sh) loaded into podman and run as
# deploy/README.md runs it: the socket directory and the NVMe directory
# from the host, host network, metrics on a port chosen here. Checks that
# it runs as the non-root user kvdepot (990), that /readyz answers, that a
# process on the host (an engine's place) stores and loads a block through
# the shared socket (the arena reaches it as a memfd), that the image holds
# no compiler or -dev package, and that `podman stop` is a clean stop
# (exit 0). `make test-image`; needs root and podman.
# Usage: tests/packaging/test_image.sh IMAGE.tar HOST_KVDEPOT_CLI
set -euo pipefail
image=$(realpath "${1:?usage: $0 IMAGE.tar HOST_KVDEPOT_CLI}")
cli=$(realpath "${2:?usage: $0 IMAGE.tar HOST_KVDEPOT_CLI}")
tmp=$(mktemp -d "${TMPDIR:-/tmp}/kvdepot-image-test.XXXXXX")
name=kvdepotd-test-$$
tag=localhost/kvdepotd-test:$$
cleanup()
{
    podman rm --force --time 0 "$name" >/dev/null 2>&1 || true
    podman rmi --force "$tag" >/dev/null 2>&1 || true
    rm -rf "$tmp"
}
trap cleanup EXIT
fail()
{
    echo "test_image: $*" >&2
    podman logs "$name" 2>&1 | tail -20 >&2 || true
    exit 1
}
start=$SECONDS

loaded=$(podman load --quiet --input "$image" | sed -n 's/^Loaded image[^:]*: //p')
[[ -n $loaded ]] || fail "podman load named no image"
podman tag "$loaded" "$tag"

# Host directories for the socket and the NVMe tier, given to the image's
# fixed uid/gid as deploy/k8s does.
install -d -o 990 -g 990 -m 0750 "$tmp/run" "$tmp/nvme"
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
# runc where it is installed: podman's default crun refuses hosts whose
# cgroups are in hybrid mode. The limits are set below the host's hard
# limits, which a container may not exceed.
runtime=()
if command -v runc >/dev/null; then
    runtime=(--runtime "$(command -v runc)")
fi
podman "${runtime[@]}" run -d --name "$name" --network host \
    --ulimit nofile=4096:4096 --ulimit nproc=4096:4096 \
    -v "$tmp/run:/run/kvdepot" -v "$tmp/nvme:/var/lib/kvdepot" \
    "$tag" --set store.arena_size=256m --set store.disk_size=256m \
    --set server.metrics_address="127.0.0.1:$port" >/dev/null ||
    fail "podman run"
for _ in $(seq 300); do
    curl -sf "http://127.0.0.1:$port/readyz" >/dev/null 2>&1 && break
    [[ $(podman inspect -f '{{.State.Running}}' "$name") == true ]] ||
        fail "the container stopped"
    sleep 0.1
done
curl -sf "http://127.0.0.1:$port/readyz" | grep -q '^ready' || fail "/readyz"

test "$(podman exec "$name" id -u)" = 990 || fail "not running as uid 990"
test "$(podman top "$name" user comm | awk '$2 == "kvdepotd" {print $1}')" = kvdepot ||
    fail "kvdepotd is not the user kvdepot: $(podman top "$name" user comm)"
if podman exec "$name" sh -c 'command -v cc || command -v gcc ||
        dpkg-query -W -f "\${Package}\n" | grep -e "-dev$"'; then
    fail "the image holds a compiler or a -dev package"
fi
podman exec "$name" kvdepot ping | grep -q kvdepotd || fail "ping inside"

sock=unix:$tmp/run/kvdepotd.sock
"$cli" ping --address "$sock" | grep -q kvdepotd || fail "ping from the host"
head -c 300000 /dev/urandom >"$tmp/block"
ns=00112233445566778899aabbccddeeff
key=$(printf '%064x' 7)
"$cli" put --address "$sock" -n "$ns" -k "$key" "$tmp/block" >/dev/null ||
    fail "put from the host"
"$cli" get --address "$sock" -n "$ns" -k "$key" "$tmp/back" >/dev/null ||
    fail "get from the host"
cmp "$tmp/block" "$tmp/back" || fail "the host got other bytes back"

podman stop --time 60 "$name" >/dev/null
rc=$(podman inspect -f '{{.State.ExitCode}}' "$name")
[[ $rc == 0 ]] || fail "kvdepotd exited $rc on podman stop"
echo "test_image: $(basename "$image") runs as kvdepot (990), serves the" \
    "host through the shared socket, stops cleanly ($((SECONDS - start)) s)"
