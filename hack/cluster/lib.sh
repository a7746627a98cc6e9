# shellcheck shell=bash
# Shared settings of hack/cluster/{build,up,down}: where things live, the
# node's own addresses, and small helpers. Sourced, never run.
#
# Environment (all optional):
#   GPU_DRA_CLUSTER_CACHE  built binaries, outside the clone, one folder per
#                          key of the pinned versions (default ~/.cache/gpu-dra-cluster)
#   GPU_DRA_CLUSTER_STATE  the running cluster: certificates, etcd data,
#                          configs, logs, pids (default /var/lib/gpu-dra-cluster)

CLUSTER_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REPO_ROOT="$(cd "$CLUSTER_DIR/../.." && pwd)"
MODULES="$CLUSTER_DIR/modules"
CACHE_ROOT="${GPU_DRA_CLUSTER_CACHE:-${HOME:-/root}/.cache/gpu-dra-cluster}"
STATE="${GPU_DRA_CLUSTER_STATE:-/var/lib/gpu-dra-cluster}"

# The node. Its address lives on a port-less bridge the cluster creates (these
# kernels have no dummy interfaces), never
# on the machine's uplink; the pod and service ranges are routed only on this
# machine (see up: the bridge may forward nowhere but to itself).
NODE_NAME=gpu-dra-node
NODE_IFACE=gpudra0
NODE_IP=198.51.100.10
POD_CIDR=10.244.0.0/24
POD_BRIDGE=gpudra-br0
SERVICE_CIDR=10.96.0.0/24
KUBERNETES_SVC_IP=10.96.0.1
API_PORT=6443
ETCD_PORT=23790
ETCD_PEER_PORT=23800
DRIVER_NAME=gpu.nvidia.com
# The fake GPU node's files (driver root, proc root) on the host.
FAKE_ROOT=/var/lib/gpu-dra-cluster-node

# Folders outside $STATE that kubelet, CNI and the driver create on the host
# (kubelet's root, CNI's result cache, the CDI spec folder, the chart's MPS
# folder); down removes those up found absent.
HOST_PATHS="/var/lib/kubelet /var/lib/cni /var/run/cdi /run/gpu-dra-driver /dev/nvidia-caps"

# What runs, in start order; `down` stops them in reverse.
COMPONENTS=(etcd kube-apiserver containerd kube-controller-manager kube-scheduler kubelet kube-proxy)

log() { printf '[%s] %s\n' "$(date +%T)" "$*" >&2; }
die() {
    printf 'error: %s\n' "$*" >&2
    exit 1
}

# The version a wrapper module requires of a module, from its go.mod.
module_version() { # <wrapper> <module path>
    awk -v m="$2" '$1 == m && $2 ~ /^v/ { print $2; exit }
        $1 == "require" && $2 == m { print $3; exit }' "$MODULES/$1/go.mod"
}

# The cache key: the Go version, every wrapper module (its pinned versions and
# sums) and the build flags' revision. A change to any of them builds anew.
BUILD_REVISION=1
cache_key() {
    {
        echo "revision $BUILD_REVISION"
        go version
        for f in "$MODULES"/*/go.mod "$MODULES"/*/go.sum; do
            echo "== ${f#"$MODULES"/}"
            cat "$f"
        done
    } | sha256sum | cut -c1-16
}

bin_dir() { echo "$CACHE_ROOT/bin-$(cache_key)"; }

# Every binary `build` makes.
BINARIES=(kube-apiserver kube-controller-manager kube-scheduler kubelet kubectl kube-proxy
    etcd containerd containerd-shim-runc-v2 ctr runc helm
    cni/bridge cni/host-local cni/loopback cni/portmap)

need_root() {
    [ "$(id -u)" = 0 ] || die "$1 needs root (it starts kubelet and containerd, and creates interfaces)"
}

pid_file() { echo "$STATE/run/$1.pid"; }

# Whether the process recorded for a component still runs.
running() { # <component>
    local f pid
    f="$(pid_file "$1")"
    [ -f "$f" ] || return 1
    pid="$(cat "$f")"
    [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null
}
