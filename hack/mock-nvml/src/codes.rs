//! NVML return codes: their numbers (from the bindings), the names profiles use
//! to inject failures, and the strings `nvmlErrorString` hands out.

use nvml_wrapper_sys::bindings as sys;

/// An NVML return code (`nvmlReturn_t`).
pub type Code = sys::nvmlReturn_t;

pub const SUCCESS: Code = sys::nvmlReturn_enum_NVML_SUCCESS;
pub const UNINITIALIZED: Code = sys::nvmlReturn_enum_NVML_ERROR_UNINITIALIZED;
pub const INVALID_ARGUMENT: Code = sys::nvmlReturn_enum_NVML_ERROR_INVALID_ARGUMENT;
pub const NOT_SUPPORTED: Code = sys::nvmlReturn_enum_NVML_ERROR_NOT_SUPPORTED;
pub const NOT_FOUND: Code = sys::nvmlReturn_enum_NVML_ERROR_NOT_FOUND;
pub const INSUFFICIENT_SIZE: Code = sys::nvmlReturn_enum_NVML_ERROR_INSUFFICIENT_SIZE;
pub const DRIVER_NOT_LOADED: Code = sys::nvmlReturn_enum_NVML_ERROR_DRIVER_NOT_LOADED;
pub const GPU_IS_LOST: Code = sys::nvmlReturn_enum_NVML_ERROR_GPU_IS_LOST;
pub const TIMEOUT: Code = sys::nvmlReturn_enum_NVML_ERROR_TIMEOUT;
pub const RESET_REQUIRED: Code = sys::nvmlReturn_enum_NVML_ERROR_RESET_REQUIRED;
pub const IN_USE: Code = sys::nvmlReturn_enum_NVML_ERROR_IN_USE;
pub const INSUFFICIENT_RESOURCES: Code = sys::nvmlReturn_enum_NVML_ERROR_INSUFFICIENT_RESOURCES;
pub const ARGUMENT_VERSION_MISMATCH: Code =
    sys::nvmlReturn_enum_NVML_ERROR_ARGUMENT_VERSION_MISMATCH;
pub const UNKNOWN: Code = sys::nvmlReturn_enum_NVML_ERROR_UNKNOWN;

/// Every code with the name a profile uses for it (the `NVML_ERROR_` suffix)
/// and the text `nvmlErrorString` returns.
const TABLE: &[(Code, &str, &std::ffi::CStr)] = &[
    (sys::nvmlReturn_enum_NVML_SUCCESS, "SUCCESS", c"Success"),
    (UNINITIALIZED, "UNINITIALIZED", c"Uninitialized"),
    (INVALID_ARGUMENT, "INVALID_ARGUMENT", c"Invalid Argument"),
    (NOT_SUPPORTED, "NOT_SUPPORTED", c"Not Supported"),
    (
        sys::nvmlReturn_enum_NVML_ERROR_NO_PERMISSION,
        "NO_PERMISSION",
        c"Insufficient Permissions",
    ),
    (
        sys::nvmlReturn_enum_NVML_ERROR_ALREADY_INITIALIZED,
        "ALREADY_INITIALIZED",
        c"Already Initialized",
    ),
    (NOT_FOUND, "NOT_FOUND", c"Not Found"),
    (INSUFFICIENT_SIZE, "INSUFFICIENT_SIZE", c"Insufficient Size"),
    (
        sys::nvmlReturn_enum_NVML_ERROR_INSUFFICIENT_POWER,
        "INSUFFICIENT_POWER",
        c"Insufficient External Power",
    ),
    (DRIVER_NOT_LOADED, "DRIVER_NOT_LOADED", c"Driver Not Loaded"),
    (
        sys::nvmlReturn_enum_NVML_ERROR_TIMEOUT,
        "TIMEOUT",
        c"Timeout",
    ),
    (
        sys::nvmlReturn_enum_NVML_ERROR_IRQ_ISSUE,
        "IRQ_ISSUE",
        c"Interrupt request issue",
    ),
    (
        sys::nvmlReturn_enum_NVML_ERROR_LIBRARY_NOT_FOUND,
        "LIBRARY_NOT_FOUND",
        c"NVML Shared Library Not Found",
    ),
    (
        sys::nvmlReturn_enum_NVML_ERROR_FUNCTION_NOT_FOUND,
        "FUNCTION_NOT_FOUND",
        c"Function Not Found",
    ),
    (
        sys::nvmlReturn_enum_NVML_ERROR_CORRUPTED_INFOROM,
        "CORRUPTED_INFOROM",
        c"Corrupted infoROM",
    ),
    (
        sys::nvmlReturn_enum_NVML_ERROR_GPU_IS_LOST,
        "GPU_IS_LOST",
        c"GPU is lost",
    ),
    (RESET_REQUIRED, "RESET_REQUIRED", c"GPU requires restart"),
    (
        sys::nvmlReturn_enum_NVML_ERROR_OPERATING_SYSTEM,
        "OPERATING_SYSTEM",
        c"The operating system has blocked the request.",
    ),
    (
        sys::nvmlReturn_enum_NVML_ERROR_LIB_RM_VERSION_MISMATCH,
        "LIB_RM_VERSION_MISMATCH",
        c"RM has detected an NVML/RM version mismatch.",
    ),
    (IN_USE, "IN_USE", c"In use by another client"),
    (
        sys::nvmlReturn_enum_NVML_ERROR_MEMORY,
        "MEMORY",
        c"Insufficient Memory",
    ),
    (
        sys::nvmlReturn_enum_NVML_ERROR_NO_DATA,
        "NO_DATA",
        c"No data",
    ),
    (
        sys::nvmlReturn_enum_NVML_ERROR_VGPU_ECC_NOT_SUPPORTED,
        "VGPU_ECC_NOT_SUPPORTED",
        c"The requested vgpu operation is not available on target device, because ECC is enabled",
    ),
    (
        INSUFFICIENT_RESOURCES,
        "INSUFFICIENT_RESOURCES",
        c"Insufficient resources for request",
    ),
    (
        sys::nvmlReturn_enum_NVML_ERROR_FREQ_NOT_SUPPORTED,
        "FREQ_NOT_SUPPORTED",
        c"Frequency not supported",
    ),
    (
        ARGUMENT_VERSION_MISMATCH,
        "ARGUMENT_VERSION_MISMATCH",
        c"Version mismatch of the struct argument",
    ),
    (
        sys::nvmlReturn_enum_NVML_ERROR_DEPRECATED,
        "DEPRECATED",
        c"Requested functionality has been deprecated",
    ),
    (
        sys::nvmlReturn_enum_NVML_ERROR_NOT_READY,
        "NOT_READY",
        c"The system is not ready for the request",
    ),
    (
        sys::nvmlReturn_enum_NVML_ERROR_GPU_NOT_FOUND,
        "GPU_NOT_FOUND",
        c"No GPUs were found",
    ),
    (
        sys::nvmlReturn_enum_NVML_ERROR_INVALID_STATE,
        "INVALID_STATE",
        c"Resource not in correct state to perform requested operation",
    ),
    (UNKNOWN, "UNKNOWN", c"Unknown Error"),
];

/// The code a profile names, e.g. `UNKNOWN` or `NVML_ERROR_GPU_IS_LOST`.
/// `SUCCESS` is not a failure and is rejected.
pub fn from_name(name: &str) -> Option<Code> {
    let bare = name.strip_prefix("NVML_ERROR_").unwrap_or(name);
    TABLE
        .iter()
        .find(|(code, n, _)| *n == bare && *code != SUCCESS)
        .map(|(code, _, _)| *code)
}

/// The names [`from_name`] accepts, for error messages.
pub fn failure_names() -> Vec<&'static str> {
    TABLE
        .iter()
        .filter(|(code, _, _)| *code != SUCCESS)
        .map(|(_, name, _)| *name)
        .collect()
}

/// The name of a code, e.g. `INSUFFICIENT_RESOURCES`.
pub fn name(code: Code) -> &'static str {
    TABLE
        .iter()
        .find(|(c, _, _)| *c == code)
        .map_or("UNRECOGNIZED", |(_, name, _)| *name)
}

/// The text of `nvmlErrorString` for a code.
pub fn description(code: Code) -> &'static std::ffi::CStr {
    TABLE
        .iter()
        .find(|(c, _, _)| *c == code)
        .map_or(c"Unknown Error", |(_, _, text)| *text)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip_with_and_without_prefix() {
        assert_eq!(from_name("UNKNOWN"), Some(UNKNOWN));
        assert_eq!(from_name("NVML_ERROR_GPU_IS_LOST"), Some(15));
        assert_eq!(name(INSUFFICIENT_RESOURCES), "INSUFFICIENT_RESOURCES");
        for failure in failure_names() {
            assert_eq!(name(from_name(failure).unwrap()), failure);
        }
    }

    #[test]
    fn success_and_garbage_are_not_failures() {
        assert_eq!(from_name("SUCCESS"), None);
        assert_eq!(from_name("unknown"), None);
        assert_eq!(from_name(""), None);
    }

    #[test]
    fn descriptions_match_nvml_wording() {
        assert_eq!(description(SUCCESS).to_str().unwrap(), "Success");
        assert_eq!(
            description(NOT_SUPPORTED).to_str().unwrap(),
            "Not Supported"
        );
        assert_eq!(description(12345).to_str().unwrap(), "Unknown Error");
    }
}
