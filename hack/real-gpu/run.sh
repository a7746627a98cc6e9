#!/usr/bin/env bash
# Checks the driver on a machine with a real NVIDIA GPU and driver (never in
# CI; see README.md beside this file). Read-only for the GPU: it records what
# the machine and NVML report (facts.sh), runs the read-only health check of
# driver/nvml/tests/real_gpu_health.rs (NVML events registered and waited on
# with a timeout, recovery action and remap state read; nothing injected),
# then the ignored tests of driver/tests/real_gpu.rs: the plugin's pool
# against nvidia-smi, and a whole-GPU claim consumed by podman running
# nvidia-smi and a CUDA kernel.
#
#   hack/real-gpu/run.sh [TEST-BINARY]
#
# TEST-BINARY: the real_gpu test binary built elsewhere (with
# GPU_DRA_REAL_PLUGIN naming the plugin binary, and GPU_DRA_REAL_HEALTH_TEST
# the real_gpu_health test binary); by default cargo builds them.
# Results go to $GPU_DRA_REAL_OUT (default $OUT, else /tmp/gpu-dra-real).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
out=${GPU_DRA_REAL_OUT:-${OUT:-/tmp/gpu-dra-real}}
mkdir -p "$out"
export GPU_DRA_REAL_OUT=$out

smi=$(command -v nvidia-smi) || { echo "no nvidia-smi on PATH: is the NVIDIA driver installed?" >&2; exit 1; }
if [ -z "${GPU_DRA_REAL_DRIVER_ROOT:-}" ]; then
    # <root>/bin/nvidia-smi or <root>/usr/bin/nvidia-smi.
    root=$(dirname "$(dirname "$(readlink -f "$smi")")")
    case $root in
        */usr) root=${root%/usr}; root=${root:-/} ;;
    esac
    export GPU_DRA_REAL_DRIVER_ROOT=$root
fi
echo "driver root: $GPU_DRA_REAL_DRIVER_ROOT"

bash "$here/facts.sh" "$out"

if [ -z "${GPU_DRA_REAL_CUDA_CHECK:-}" ]; then
    nvcc=$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)
    if [ -x "$nvcc" ]; then
        "$nvcc" -O2 -o "$out/cuda-check" "$here/cuda_check.cu"
        export GPU_DRA_REAL_CUDA_CHECK=$out/cuda-check
    else
        echo "!!!!!!!! no nvcc: the container part of the tests is skipped" >&2
    fi
fi

health_bin=${GPU_DRA_REAL_HEALTH_TEST:-}
if [ -n "$health_bin" ]; then
    "$health_bin" --ignored --nocapture 2>&1 | tee "$out/health.txt"
elif [ -z "${1:-}" ]; then
    (cd "$here/../.." && cargo test --profile plugin -p gpu-nvml --test real_gpu_health -- --ignored --nocapture) \
        2>&1 | tee "$out/health.txt"
else
    echo "!!!!!!!! health check skipped: GPU_DRA_REAL_HEALTH_TEST is not set" >&2
fi

test_bin=${1:-}
if [ -z "$test_bin" ]; then
    cd "$here/../.."
    cargo build --profile plugin -p gpu-kubelet-plugin
    test_bin=$(cargo test --profile plugin -p gpu-kubelet-plugin --test real_gpu --no-run --message-format=json 2>/dev/null \
        | python3 -c 'import json,sys
for line in sys.stdin:
    m = json.loads(line)
    if m.get("reason") == "compiler-artifact" and m["target"]["name"] == "real_gpu" and m.get("executable"):
        print(m["executable"])')
fi
mkdir -p /var/run/cdi
set -o pipefail
"$test_bin" --ignored --test-threads 1 --nocapture 2>&1 | tee "$out/tests.txt"
