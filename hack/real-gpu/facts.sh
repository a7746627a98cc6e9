#!/usr/bin/env bash
# Read-only facts about a real GPU machine, written under $1 (default $OUT,
# else /tmp/gpu-dra-real):
# the OS, the driver's files and device nodes, NVIDIA's proc tree, and
# NVML's answers (nvml_snapshot.py). Nothing here changes a GPU setting.
set -u
out=${1:-${OUT:-/tmp/gpu-dra-real}}
mkdir -p "$out"
{
    echo "== os"; cat /etc/os-release 2>/dev/null | head -3; uname -r; ldd --version 2>&1 | head -1
    echo "== nvidia-smi"; command -v nvidia-smi; nvidia-smi -L
    echo "== driver tools"
    for t in nvidia-smi nvidia-cuda-mps-control nvidia-cuda-mps-server nvidia-cdi-hook nvidia-ctk nvidia-debugdump nvidia-persistenced podman runc crun conmon unshare curl; do
        printf '%s: %s\n' "$t" "$(command -v $t || echo missing)"
    done
    echo "== libraries (ldconfig)"; ldconfig -p | grep -E 'nvidia|libcuda' | sort
    echo "== /usr/local/nvidia"; find /usr/local/nvidia -maxdepth 3 2>/dev/null | head -80
    echo "== device nodes"; ls -l /dev/nvidia* 2>&1; ls -lR /dev/nvidia-caps 2>&1 | head -20; ls -l /dev/dri 2>&1 | head
    echo "== /proc/driver/nvidia"; find /proc/driver/nvidia -maxdepth 5 2>&1 | head -60
    for f in /proc/driver/nvidia/capabilities/mig/config /proc/driver/nvidia/capabilities/mig/monitor; do
        echo "-- $f"; cat "$f" 2>&1
    done
    echo "== /proc/devices nvidia"; grep -i nvidia /proc/devices
    echo "== sysfs of the GPU"; for d in /sys/bus/pci/drivers/nvidia/0*; do echo "$d -> $(readlink -f "$d")"; cat "$d/numa_node" 2>&1; done
    echo "== mounts"; grep -E 'nvidia|cgroup| / ' /proc/mounts | head -20
    echo "== boot id"; cat /proc/sys/kernel/random/boot_id
} > "$out/facts.txt" 2>&1
nvidia-smi -q > "$out/nvidia-smi-q.txt" 2>&1
nvidia-smi topo -m > "$out/nvidia-smi-topo.txt" 2>&1
python3 "$(dirname "$0")/nvml_snapshot.py" > "$out/nvml-snapshot.json" 2> "$out/nvml-snapshot.err"
echo "facts written to $out"
