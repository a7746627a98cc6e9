//! The names of the C functions the library exports, used to validate the
//! failure-injection keys of profiles (`fail: {nvmlDeviceGetMemoryInfo: UNKNOWN}`).
//! An integration test checks that every name here is a symbol of the built
//! library.

/// Every exported NVML function.
pub const NVML_FUNCTIONS: &[&str] = &[
    "nvmlInit_v2",
    "nvmlInitWithFlags",
    "nvmlShutdown",
    "nvmlErrorString",
    "nvmlSystemGetDriverVersion",
    "nvmlSystemGetNVMLVersion",
    "nvmlSystemGetCudaDriverVersion",
    "nvmlSystemGetCudaDriverVersion_v2",
    "nvmlDeviceGetCount_v2",
    "nvmlDeviceGetHandleByIndex_v2",
    "nvmlDeviceGetHandleByUUID",
    "nvmlDeviceGetHandleByPciBusId_v2",
    "nvmlDeviceGetName",
    "nvmlDeviceGetUUID",
    "nvmlDeviceGetIndex",
    "nvmlDeviceGetMinorNumber",
    "nvmlDeviceGetBrand",
    "nvmlDeviceGetArchitecture",
    "nvmlDeviceGetCudaComputeCapability",
    "nvmlDeviceGetMemoryInfo",
    "nvmlDeviceGetMemoryInfo_v2",
    "nvmlDeviceGetPciInfo_v3",
    "nvmlDeviceGetNumaNodeId",
    "nvmlDeviceGetComputeMode",
    "nvmlDeviceSetComputeMode",
    "nvmlDeviceGetSerial",
    "nvmlDeviceGetBoardId",
    "nvmlDeviceGetAttributes_v2",
    "nvmlDeviceGetAddressingMode",
    "nvmlDeviceGetTopologyCommonAncestor",
    "nvmlDeviceGetP2PStatus",
    "nvmlDeviceGetNvLinkState",
    "nvmlDeviceGetNvLinkVersion",
    "nvmlDeviceGetNvLinkRemotePciInfo_v2",
    "nvmlDeviceGetNvLinkRemoteDeviceType",
    "nvmlDeviceGetNvLinkCapability",
    "nvmlDeviceGetGpuFabricInfo",
    "nvmlDeviceGetGpuFabricInfoV",
    "nvmlDeviceGetMigMode",
    "nvmlDeviceSetMigMode",
    "nvmlDeviceGetMaxMigDeviceCount",
    "nvmlDeviceGetMigDeviceHandleByIndex",
    "nvmlDeviceGetDeviceHandleFromMigDeviceHandle",
    "nvmlDeviceIsMigDeviceHandle",
    "nvmlDeviceGetGpuInstanceId",
    "nvmlDeviceGetComputeInstanceId",
    "nvmlDeviceGetGpuInstanceProfileInfo",
    "nvmlDeviceGetGpuInstanceProfileInfoV",
    "nvmlDeviceGetGpuInstanceProfileInfoByIdV",
    "nvmlDeviceGetGpuInstancePossiblePlacements_v2",
    "nvmlDeviceGetGpuInstanceRemainingCapacity",
    "nvmlDeviceCreateGpuInstance",
    "nvmlDeviceCreateGpuInstanceWithPlacement",
    "nvmlDeviceGetGpuInstances",
    "nvmlDeviceGetGpuInstanceById",
    "nvmlGpuInstanceGetInfo",
    "nvmlGpuInstanceDestroy",
    "nvmlGpuInstanceGetComputeInstanceProfileInfo",
    "nvmlGpuInstanceGetComputeInstanceProfileInfoV",
    "nvmlGpuInstanceGetComputeInstanceRemainingCapacity",
    "nvmlGpuInstanceGetComputeInstancePossiblePlacements",
    "nvmlGpuInstanceCreateComputeInstance",
    "nvmlGpuInstanceCreateComputeInstanceWithPlacement",
    "nvmlGpuInstanceGetComputeInstances",
    "nvmlGpuInstanceGetComputeInstanceById",
    "nvmlComputeInstanceGetInfo_v2",
    "nvmlComputeInstanceDestroy",
    "nvmlEventSetCreate",
    "nvmlEventSetFree",
    "nvmlEventSetWait",
    "nvmlEventSetWait_v2",
    "nvmlDeviceRegisterEvents",
    "nvmlDeviceGetSupportedEventTypes",
    "nvmlDeviceGetFieldValues",
    "nvmlDeviceGetRemappedRows",
    "nvmlDeviceGetRetiredPagesPendingStatus",
    "nvmlDeviceGetTotalEccErrors",
    "nvmlDeviceGetCurrentClocksEventReasons",
    "nvmlDeviceGetCurrentClocksThrottleReasons",
    "nvmlDeviceGetPcieReplayCounter",
    "nvmlDeviceGetComputeRunningProcesses_v3",
    "nvmlDeviceGetGraphicsRunningProcesses_v3",
];

/// The extra, non-NVML function that returns why `nvmlInit` failed.
pub const LAST_ERROR_FUNCTION: &str = "mockNvmlLastError";

/// `nvmlDeviceGetMemoryInfo_v2` -> `nvmlDeviceGetMemoryInfo`.
fn unversioned(name: &str) -> &str {
    match name.rsplit_once("_v") {
        Some((base, digits))
            if !digits.is_empty() && digits.bytes().all(|b| b.is_ascii_digit()) =>
        {
            base
        }
        _ => name,
    }
}

/// Whether a failure-injection key applies to a call of `function`: the key
/// is the exact name or the name without its `_vN` suffix, so
/// `nvmlDeviceGetMemoryInfo` covers `nvmlDeviceGetMemoryInfo_v2` too.
pub fn key_matches(key: &str, function: &str) -> bool {
    key == function || key == unversioned(function)
}

/// Whether a key names at least one exported function that can fail.
pub fn is_failable(key: &str) -> bool {
    NVML_FUNCTIONS
        .iter()
        .filter(|f| **f != "nvmlErrorString")
        .any(|f| key_matches(key, f))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_match_with_and_without_version_suffix() {
        assert!(key_matches(
            "nvmlDeviceGetMemoryInfo",
            "nvmlDeviceGetMemoryInfo_v2"
        ));
        assert!(key_matches(
            "nvmlDeviceGetMemoryInfo_v2",
            "nvmlDeviceGetMemoryInfo_v2"
        ));
        assert!(!key_matches(
            "nvmlDeviceGetMemoryInfo_v2",
            "nvmlDeviceGetMemoryInfo"
        ));
        assert!(key_matches("nvmlInit", "nvmlInit_v2"));
        assert!(!key_matches(
            "nvmlDeviceGetGpuInstanceProfileInfo",
            "nvmlDeviceGetGpuInstanceProfileInfoV"
        ));
    }

    #[test]
    fn only_exported_functions_are_failable() {
        assert!(is_failable("nvmlDeviceGetMemoryInfo"));
        assert!(is_failable("nvmlInit"));
        assert!(!is_failable("nvmlErrorString"));
        assert!(!is_failable("nvmlDeviceGetFanSpeed"));
        assert!(!is_failable(""));
    }

    #[test]
    fn names_are_unique() {
        let mut names = NVML_FUNCTIONS.to_vec();
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), NVML_FUNCTIONS.len());
    }
}
