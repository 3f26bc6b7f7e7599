#!/usr/bin/env bash
# The flashrt-ros2 tests as CI runs them: everything in the crate, with the ROS 2 interop test
# (node <-> PyPI cyclonedds peer) inside a fresh network namespace that has only loopback.
#
# Needs installed (.ci/run installs them; this script checks and says what is missing):
#   - python3 >= 3.11 with  pip install -r ros2_bridge/tests/peer/requirements.txt
#     (cyclonedds==11.0.1: a manylinux wheel, nothing to compile)
#   - iproute2 (`ip`)           apt-get install -y iproute2
#   - util-linux (`unshare`)    present on Debian; `unshare -n` needs root or CAP_SYS_ADMIN
#   - cargo (the workspace toolchain)
# The peer runs with $FRT_PYTHON (default python3): point it at a venv's python if cyclonedds is
# installed there. The interop test also runs in a plain `cargo test --workspace`, re-running
# itself under `unshare -n`: that is how tools/test.sh runs it (once), so this script is for
# running the crate's tests on their own.
# Usage: bash ros2_bridge/ci.sh        (from anywhere; FRT_REQUIRE_ALL defaults to 1 here)
set -euo pipefail
cd "$(dirname "$0")/.."
export FRT_REQUIRE_ALL="${FRT_REQUIRE_ALL:-1}"

missing=()
"${FRT_PYTHON:-python3}" -c 'import cyclonedds' 2>/dev/null || missing+=("python3 cyclonedds (pip install -r ros2_bridge/tests/peer/requirements.txt)")
command -v ip >/dev/null || missing+=("ip (apt-get install -y iproute2)")
command -v unshare >/dev/null || missing+=("unshare (util-linux)")
if ((${#missing[@]})); then
    printf 'ros2_bridge/ci.sh: missing: %s\n' "${missing[@]}" >&2
    exit 1
fi
if ! unshare -n true 2>/dev/null; then
    echo "ros2_bridge/ci.sh: cannot create a network namespace (unshare -n needs root or CAP_SYS_ADMIN)" >&2
    exit 1
fi

# Build outside the namespace (crates may have to be fetched); inside it there is no network.
cargo test --locked -p flashrt-ros2 --no-run

# Only loopback exists in the new namespace. DDS discovers over multicast, so loopback gets the
# MULTICAST flag and the multicast route; nothing can leave the namespace.
unshare -n bash -euo pipefail -c '
    ip link set lo up
    ip link set lo multicast on
    ip route add 224.0.0.0/4 dev lo
    cargo test --locked --offline -p flashrt-ros2
'
