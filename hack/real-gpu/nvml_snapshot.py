#!/usr/bin/env python3
"""Read-only snapshot of what NVML reports on a real GPU machine, as JSON.

Used to check the fake NVML library's machine models against real
hardware (hack/real-gpu/README.md). Only queries: nothing here changes a
GPU setting.
"""
import json
import sys

import pynvml as n


def call(fn, *args):
    try:
        v = fn(*args)
    except n.NVMLError as e:  # the error is the answer
        return {"error": str(e)}
    except Exception as e:  # noqa: BLE001 - older bindings lack a call
        return {"error": f"{type(e).__name__}: {e}"}
    if isinstance(v, bytes):
        v = v.decode()
    return v


def struct(v):
    if isinstance(v, dict):
        return v
    out = {}
    for field in getattr(v, "_fields_", []):
        name = field[0]
        x = getattr(v, name)
        if isinstance(x, bytes):
            x = x.decode(errors="replace")
        elif hasattr(x, "_fields_"):
            x = struct(x)
        elif not isinstance(x, (int, float, str)):
            x = repr(x)
        out[name] = x
    return out


def placements(h, profile_id):
    """[[start, size], ...] of a GPU instance profile (the bindings take
    the output buffers as arguments)."""
    import ctypes

    array = (n.c_nvmlGpuInstancePlacement_t * 16)()
    count = ctypes.c_uint(16)
    try:
        n.nvmlDeviceGetGpuInstancePossiblePlacements(h, profile_id, array, ctypes.byref(count))
    except n.NVMLError as e:
        return {"error": str(e)}
    except Exception as e:  # noqa: BLE001
        return {"error": f"{type(e).__name__}: {e}"}
    return [[array[i].start, array[i].size] for i in range(count.value)]


def gpu(i):
    h = n.nvmlDeviceGetHandleByIndex(i)
    d = {
        "index": i,
        "name": call(n.nvmlDeviceGetName, h),
        "uuid": call(n.nvmlDeviceGetUUID, h),
        "brand": call(n.nvmlDeviceGetBrand, h),
        "architecture": call(n.nvmlDeviceGetArchitecture, h),
        "cudaComputeCapability": call(n.nvmlDeviceGetCudaComputeCapability, h),
        "memoryTotalBytes": (lambda m: m if isinstance(m, dict) else m.total)(
            call(n.nvmlDeviceGetMemoryInfo, h)
        ),
        "pci": struct(call(n.nvmlDeviceGetPciInfo_v3, h)),
        "minor": call(n.nvmlDeviceGetMinorNumber, h),
        "numaNode": call(getattr(n, "nvmlDeviceGetNumaNodeId", lambda _: "n/a"), h),
        "computeMode": call(n.nvmlDeviceGetComputeMode, h),
        "persistenceMode": call(n.nvmlDeviceGetPersistenceMode, h),
        "migMode": call(n.nvmlDeviceGetMigMode, h),
        "maxMigDeviceCount": call(n.nvmlDeviceGetMaxMigDeviceCount, h),
        "attributes": struct(call(n.nvmlDeviceGetAttributes_v2, h)),
        "boardPartNumber": call(n.nvmlDeviceGetBoardPartNumber, h),
        "vbios": call(n.nvmlDeviceGetVbiosVersion, h),
        "addressingMode": call(getattr(n, "nvmlDeviceGetAddressingMode", lambda _: "n/a"), h),
    }
    links = []
    for link in range(18):
        state = call(n.nvmlDeviceGetNvLinkState, h, link)
        entry = {"link": link, "state": state}
        if not isinstance(state, dict):
            entry["version"] = call(n.nvmlDeviceGetNvLinkVersion, h, link)
            entry["remote"] = struct(call(n.nvmlDeviceGetNvLinkRemotePciInfo_v2, h, link))
            entry["remoteType"] = call(
                getattr(n, "nvmlDeviceGetNvLinkRemoteDeviceType", lambda *_: "n/a"), h, link
            )
        links.append(entry)
    d["nvlinks"] = links
    profiles = []
    for p in range(0, 16):
        info = call(n.nvmlDeviceGetGpuInstanceProfileInfoV, h, p)
        if isinstance(info, dict) and "error" in info:
            info = call(n.nvmlDeviceGetGpuInstanceProfileInfo, h, p)
        entry = {"profile": p, "info": struct(info)}
        if not (isinstance(info, dict) and "error" in info):
            entry["placements"] = placements(h, info.id)
            entry["remainingCapacity"] = call(
                n.nvmlDeviceGetGpuInstanceRemainingCapacity, h, info.id
            )
        profiles.append(entry)
    d["gpuInstanceProfiles"] = profiles
    d["gpuInstances"] = repr(call(n.nvmlDeviceGetGpuInstances, h, 0, 8))
    return d


def main():
    n.nvmlInit()
    out = {
        "driverVersion": call(n.nvmlSystemGetDriverVersion),
        "cudaDriverVersion": call(n.nvmlSystemGetCudaDriverVersion_v2),
        "nvmlVersion": call(n.nvmlSystemGetNVMLVersion),
        "count": n.nvmlDeviceGetCount(),
    }
    out["gpus"] = [gpu(i) for i in range(out["count"])]
    n.nvmlShutdown()
    json.dump(out, sys.stdout, indent=1, default=str)
    print()


if __name__ == "__main__":
    main()
