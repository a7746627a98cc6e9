//! The raw NVML calls that nvml-wrapper's safe API lacks (GPU and compute
//! instance management and listing, possible placements, addressing mode),
//! the cached device handle, and the init diagnostics of the project's fake
//! NVML ([`LoadedLibrary::last_error`]). This is the only module of the
//! workspace's driver code that contains `unsafe`; every block says why it is
//! sound.
//!
//! Handles returned here borrow the [`Nvml`] they came from, so none of them
//! can outlive `nvmlShutdown`.
#![allow(unsafe_code)]

use std::ffi::{CStr, OsStr};
use std::marker::PhantomData;
use std::os::raw::{c_char, c_uint};

use nvml_wrapper::Device;
use nvml_wrapper::Nvml;
use nvml_wrapper::error::{NvmlError, nvml_sym, nvml_try};
use nvml_wrapper_sys::bindings as sys;

/// A physical GPU's NVML handle, cached so that later calls skip the lookup.
///
/// nvml-wrapper's `Device<'nvml>` borrows the `Nvml`, which cannot be stored
/// next to it in one struct; the raw handle can, and [`RawDevice::device`]
/// turns it back into a `Device` for free.
#[derive(Debug, Clone, Copy)]
pub(crate) struct RawDevice(sys::nvmlDevice_t);

// SAFETY: an nvmlDevice_t is an opaque token that NVML hands out once per GPU
// and keeps valid until nvmlShutdown; NVML's API is thread-safe, so the token
// may be used from any thread. nvml-wrapper makes the same claim for
// `Device` (Send + Sync). The backend that stores these tokens owns the
// `Nvml` and drops the tokens with it, so none outlives the library.
unsafe impl Send for RawDevice {}
// SAFETY: see the Send impl above; the token is never written through.
unsafe impl Sync for RawDevice {}

impl RawDevice {
    /// Remembers the handle of a device fetched through nvml-wrapper.
    pub(crate) fn of(device: &Device<'_>) -> Self {
        // SAFETY: `handle()` only copies the pointer out of the wrapper; it is
        // marked unsafe so that callers think about its lifetime, which the
        // backend ties to its own `Nvml` (see the Send impl).
        Self(unsafe { device.handle() })
    }

    /// The raw handle, for the NVML calls made without nvml-wrapper
    /// (see `backend::health`).
    pub(crate) fn raw(self) -> sys::nvmlDevice_t {
        self.0
    }

    /// Turns the cached handle back into a `Device` for the safe API.
    pub(crate) fn device<'n>(&self, nvml: &'n Nvml) -> Device<'n> {
        // SAFETY: the handle came from this same `Nvml` (the backend never
        // mixes libraries) and stays valid as long as `nvml` is alive, which
        // the returned `Device<'n>` borrows.
        unsafe { Device::new(self.0, nvml) }
    }
}

/// A GPU instance handle, valid while the borrowed `Nvml` lives and the GPU
/// instance is not destroyed.
#[derive(Debug)]
pub(crate) struct GpuInstance<'n> {
    handle: sys::nvmlGpuInstance_t,
    nvml: PhantomData<&'n Nvml>,
}

/// A compute instance handle, valid while the borrowed `Nvml` lives and the
/// compute instance is not destroyed.
#[derive(Debug)]
pub(crate) struct ComputeInstance<'n> {
    handle: sys::nvmlComputeInstance_t,
    nvml: PhantomData<&'n Nvml>,
}

/// What `nvmlGpuInstanceGetInfo` says about a GPU instance.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct GpuInstanceInfo {
    pub id: u32,
    pub profile_id: u32,
    pub start: u32,
    pub size: u32,
}

/// The parts of a compute instance profile the backend needs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct ComputeInstanceProfile {
    pub id: u32,
    pub slice_count: u32,
    pub instance_count: u32,
}

/// `nvmlDeviceGetGpuInstancePossiblePlacements_v2` as (start, size) pairs.
///
/// nvml-wrapper 0.13's `possible_placements` never sets the length of the
/// vector it fills, so it always returns an empty list; this is the
/// working replacement.
pub(crate) fn possible_placements(
    nvml: &Nvml,
    device: RawDevice,
    profile_id: u32,
) -> Result<Vec<(u32, u32)>, NvmlError> {
    let sym = nvml_sym(
        nvml.lib()
            .nvmlDeviceGetGpuInstancePossiblePlacements_v2
            .as_ref(),
    )?;
    let mut count: c_uint = 0;
    // SAFETY: valid device handle (see RawDevice); a null array with a valid
    // count pointer asks NVML for the number of placements only.
    nvml_try(unsafe { sym(device.0, profile_id, std::ptr::null_mut(), &raw mut count) })?;
    if count == 0 {
        return Ok(Vec::new());
    }
    let mut placements =
        vec![sys::nvmlGpuInstancePlacement_t { start: 0, size: 0 }; count as usize];
    // SAFETY: `placements` holds `count` initialised elements and NVML writes
    // at most `count` of them, updating `count` to the number written.
    nvml_try(unsafe {
        sym(
            device.0,
            profile_id,
            placements.as_mut_ptr(),
            &raw mut count,
        )
    })?;
    placements.truncate(count as usize);
    Ok(placements.into_iter().map(|p| (p.start, p.size)).collect())
}

/// `nvmlDeviceGetAddressingMode`: 0 none, 1 HMM, 2 ATS.
pub(crate) fn addressing_mode(nvml: &Nvml, device: RawDevice) -> Result<u32, NvmlError> {
    let sym = nvml_sym(nvml.lib().nvmlDeviceGetAddressingMode.as_ref())?;
    let mut mode = sys::nvmlDeviceAddressingMode_t {
        // NVML_STRUCT_VERSION(DeviceAddressingMode, 1).
        version: (size_of::<sys::nvmlDeviceAddressingMode_v1_t>() as u32) | (1 << 24),
        value: 0,
    };
    // SAFETY: valid device handle; `mode` is a properly versioned v1 struct
    // that NVML fills in place.
    nvml_try(unsafe { sym(device.0, &raw mut mode) })?;
    Ok(mode.value)
}

/// GPU instance id and compute instance id of a MIG device handle.
pub(crate) fn mig_instance_ids(nvml: &Nvml, mig: &Device<'_>) -> Result<(u32, u32), NvmlError> {
    let gi_sym = nvml_sym(nvml.lib().nvmlDeviceGetGpuInstanceId.as_ref())?;
    let ci_sym = nvml_sym(nvml.lib().nvmlDeviceGetComputeInstanceId.as_ref())?;
    // SAFETY: the MIG handle comes from nvml-wrapper's mig_device_by_index on
    // this `nvml` and is only read.
    let handle = unsafe { mig.handle() };
    let (mut gi, mut ci): (c_uint, c_uint) = (0, 0);
    // SAFETY: valid MIG device handle and a valid out pointer.
    nvml_try(unsafe { gi_sym(handle, &raw mut gi) })?;
    // SAFETY: as above.
    nvml_try(unsafe { ci_sym(handle, &raw mut ci) })?;
    Ok((gi, ci))
}

/// `nvmlDeviceGetGpuInstanceById`.
pub(crate) fn gpu_instance_by_id(
    nvml: &Nvml,
    device: RawDevice,
    id: u32,
) -> Result<GpuInstance<'_>, NvmlError> {
    let sym = nvml_sym(nvml.lib().nvmlDeviceGetGpuInstanceById.as_ref())?;
    let mut handle: sys::nvmlGpuInstance_t = std::ptr::null_mut();
    // SAFETY: valid device handle and a valid out pointer for the GI handle.
    nvml_try(unsafe { sym(device.0, id, &raw mut handle) })?;
    Ok(GpuInstance {
        handle,
        nvml: PhantomData,
    })
}

/// `nvmlDeviceGetGpuInstances`: the GPU instances of profile `profile_id`.
/// `capacity` must be the profile's instance count (NVML takes no array
/// size and writes up to that many).
pub(crate) fn gpu_instances(
    nvml: &Nvml,
    device: RawDevice,
    profile_id: u32,
    capacity: u32,
) -> Result<Vec<GpuInstance<'_>>, NvmlError> {
    let sym = nvml_sym(nvml.lib().nvmlDeviceGetGpuInstances.as_ref())?;
    // One spare slot: never pass NVML an empty array.
    let mut handles: Vec<sys::nvmlGpuInstance_t> =
        vec![std::ptr::null_mut(); capacity as usize + 1];
    let mut count: c_uint = 0;
    // SAFETY: valid device handle; `handles` holds more elements than the
    // profile can have instances, which bounds what NVML writes; `count` is
    // a valid out pointer.
    nvml_try(unsafe { sym(device.0, profile_id, handles.as_mut_ptr(), &raw mut count) })?;
    handles.truncate((count as usize).min(capacity as usize + 1));
    Ok(handles
        .into_iter()
        .map(|handle| GpuInstance {
            handle,
            nvml: PhantomData,
        })
        .collect())
}

/// `nvmlGpuInstanceGetComputeInstances`: the compute instances of compute
/// instance profile `profile_id` in `gi`. `capacity` must be that profile's
/// instance count.
pub(crate) fn compute_instances<'n>(
    nvml: &'n Nvml,
    gi: &GpuInstance<'n>,
    profile_id: u32,
    capacity: u32,
) -> Result<Vec<ComputeInstance<'n>>, NvmlError> {
    let sym = nvml_sym(nvml.lib().nvmlGpuInstanceGetComputeInstances.as_ref())?;
    let mut handles: Vec<sys::nvmlComputeInstance_t> =
        vec![std::ptr::null_mut(); capacity as usize + 1];
    let mut count: c_uint = 0;
    // SAFETY: valid GI handle; `handles` holds more elements than the
    // profile can have instances; `count` is a valid out pointer.
    nvml_try(unsafe { sym(gi.handle, profile_id, handles.as_mut_ptr(), &raw mut count) })?;
    handles.truncate((count as usize).min(capacity as usize + 1));
    Ok(handles
        .into_iter()
        .map(|handle| ComputeInstance {
            handle,
            nvml: PhantomData,
        })
        .collect())
}

/// `nvmlGpuInstanceGetInfo`.
pub(crate) fn gpu_instance_info(
    nvml: &Nvml,
    gi: &GpuInstance<'_>,
) -> Result<GpuInstanceInfo, NvmlError> {
    let sym = nvml_sym(nvml.lib().nvmlGpuInstanceGetInfo.as_ref())?;
    let mut info = sys::nvmlGpuInstanceInfo_t {
        device: std::ptr::null_mut(),
        id: 0,
        profileId: 0,
        placement: sys::nvmlGpuInstancePlacement_t { start: 0, size: 0 },
    };
    // SAFETY: valid GI handle (not destroyed: GpuInstance is consumed by
    // destroy) and a valid out struct.
    nvml_try(unsafe { sym(gi.handle, &raw mut info) })?;
    Ok(GpuInstanceInfo {
        id: info.id,
        profile_id: info.profileId,
        start: info.placement.start,
        size: info.placement.size,
    })
}

/// `nvmlDeviceCreateGpuInstanceWithPlacement`.
pub(crate) fn create_gpu_instance(
    nvml: &Nvml,
    device: RawDevice,
    profile_id: u32,
    start: u32,
    size: u32,
) -> Result<GpuInstance<'_>, NvmlError> {
    let sym = nvml_sym(nvml.lib().nvmlDeviceCreateGpuInstanceWithPlacement.as_ref())?;
    let placement = sys::nvmlGpuInstancePlacement_t { start, size };
    let mut handle: sys::nvmlGpuInstance_t = std::ptr::null_mut();
    // SAFETY: valid device handle; `placement` lives across the call and is
    // only read; `handle` is a valid out pointer.
    nvml_try(unsafe { sym(device.0, profile_id, &raw const placement, &raw mut handle) })?;
    Ok(GpuInstance {
        handle,
        nvml: PhantomData,
    })
}

/// `nvmlGpuInstanceDestroy`. Consumes the handle: it is dangling afterwards.
#[expect(
    clippy::needless_pass_by_value,
    reason = "taking the handle by value makes later use impossible"
)]
pub(crate) fn destroy_gpu_instance(nvml: &Nvml, gi: GpuInstance<'_>) -> Result<(), NvmlError> {
    let sym = nvml_sym(nvml.lib().nvmlGpuInstanceDestroy.as_ref())?;
    // SAFETY: valid GI handle, never used again (moved in).
    nvml_try(unsafe { sym(gi.handle) })
}

/// `nvmlGpuInstanceGetComputeInstanceProfileInfo` for a compute instance
/// profile enumerant with the shared engine profile.
pub(crate) fn compute_instance_profile(
    nvml: &Nvml,
    gi: &GpuInstance<'_>,
    profile: u32,
) -> Result<ComputeInstanceProfile, NvmlError> {
    let sym = nvml_sym(
        nvml.lib()
            .nvmlGpuInstanceGetComputeInstanceProfileInfo
            .as_ref(),
    )?;
    let mut info = sys::nvmlComputeInstanceProfileInfo_t {
        id: 0,
        sliceCount: 0,
        instanceCount: 0,
        multiprocessorCount: 0,
        sharedCopyEngineCount: 0,
        sharedDecoderCount: 0,
        sharedEncoderCount: 0,
        sharedJpegCount: 0,
        sharedOfaCount: 0,
    };
    // SAFETY: valid GI handle and a valid out struct of the unversioned type
    // this entry point takes.
    nvml_try(unsafe {
        sym(
            gi.handle,
            profile,
            sys::NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED,
            &raw mut info,
        )
    })?;
    Ok(ComputeInstanceProfile {
        id: info.id,
        slice_count: info.sliceCount,
        instance_count: info.instanceCount,
    })
}

/// `nvmlGpuInstanceCreateComputeInstance`.
pub(crate) fn create_compute_instance<'n>(
    nvml: &'n Nvml,
    gi: &GpuInstance<'n>,
    profile_id: u32,
) -> Result<ComputeInstance<'n>, NvmlError> {
    let sym = nvml_sym(nvml.lib().nvmlGpuInstanceCreateComputeInstance.as_ref())?;
    let mut handle: sys::nvmlComputeInstance_t = std::ptr::null_mut();
    // SAFETY: valid GI handle and a valid out pointer for the CI handle.
    nvml_try(unsafe { sym(gi.handle, profile_id, &raw mut handle) })?;
    Ok(ComputeInstance {
        handle,
        nvml: PhantomData,
    })
}

/// `nvmlGpuInstanceGetComputeInstanceById`.
pub(crate) fn compute_instance_by_id<'n>(
    nvml: &'n Nvml,
    gi: &GpuInstance<'n>,
    id: u32,
) -> Result<ComputeInstance<'n>, NvmlError> {
    let sym = nvml_sym(nvml.lib().nvmlGpuInstanceGetComputeInstanceById.as_ref())?;
    let mut handle: sys::nvmlComputeInstance_t = std::ptr::null_mut();
    // SAFETY: valid GI handle and a valid out pointer for the CI handle.
    nvml_try(unsafe { sym(gi.handle, id, &raw mut handle) })?;
    Ok(ComputeInstance {
        handle,
        nvml: PhantomData,
    })
}

/// The compute instance id (`nvmlComputeInstanceGetInfo_v2`).
pub(crate) fn compute_instance_id(nvml: &Nvml, ci: &ComputeInstance<'_>) -> Result<u32, NvmlError> {
    compute_instance_info(nvml, ci).map(|(id, _)| id)
}

/// The compute instance id and profile id (`nvmlComputeInstanceGetInfo_v2`).
pub(crate) fn compute_instance_info(
    nvml: &Nvml,
    ci: &ComputeInstance<'_>,
) -> Result<(u32, u32), NvmlError> {
    let sym = nvml_sym(nvml.lib().nvmlComputeInstanceGetInfo_v2.as_ref())?;
    let mut info = sys::nvmlComputeInstanceInfo_t {
        device: std::ptr::null_mut(),
        gpuInstance: std::ptr::null_mut(),
        id: 0,
        profileId: 0,
        placement: sys::nvmlComputeInstancePlacement_t { start: 0, size: 0 },
    };
    // SAFETY: valid CI handle and a valid out struct.
    nvml_try(unsafe { sym(ci.handle, &raw mut info) })?;
    Ok((info.id, info.profileId))
}

/// `nvmlComputeInstanceDestroy`. Consumes the handle: it is dangling afterwards.
#[expect(
    clippy::needless_pass_by_value,
    reason = "taking the handle by value makes later use impossible"
)]
pub(crate) fn destroy_compute_instance(
    nvml: &Nvml,
    ci: ComputeInstance<'_>,
) -> Result<(), NvmlError> {
    let sym = nvml_sym(nvml.lib().nvmlComputeInstanceDestroy.as_ref())?;
    // SAFETY: valid CI handle, never used again (moved in).
    nvml_try(unsafe { sym(ci.handle) })
}

/// The NVML library loaded a second time, alongside nvml-wrapper's own
/// handle (the dynamic loader hands out the same loaded object), so that it
/// stays loaded after a failed `nvmlInit` (nvml-wrapper unloads its copy
/// then) and its extra symbols can be looked up.
pub(crate) struct LoadedLibrary(libloading::Library);

/// The symbol of the fake NVML that explains its last init failure:
/// `const char *mockNvmlLastError(void)`.
const LAST_ERROR_SYMBOL: &[u8] = b"mockNvmlLastError\0";

/// The longest explanation kept from the library, in bytes.
const LAST_ERROR_MAX: usize = 1024;

impl LoadedLibrary {
    /// Loads `path` (a path or a soname, as nvml-wrapper is given it).
    pub(crate) fn open(path: &OsStr) -> Result<Self, libloading::Error> {
        // SAFETY: this is the very library nvml-wrapper loads right after
        // (same path, so the loader returns the same object and runs its
        // initialisers once); loading it here adds no code that the backend
        // would not run anyway.
        unsafe { libloading::Library::new(path) }.map(Self)
    }

    /// The library's own explanation of its last init failure, when it
    /// exports `mockNvmlLastError` (the project's fake NVML does; NVIDIA's
    /// library does not, and gives `None`). One line, at most
    /// [`LAST_ERROR_MAX`] bytes; `None` when empty.
    pub(crate) fn last_error(&self) -> Option<String> {
        // SAFETY: the symbol is looked up with the signature the fake NVML
        // documents and exports it with (`const char *(void)`, see
        // hack/mock-nvml/README.md); the returned function pointer is used
        // only while `self.0` keeps the library loaded.
        let function = unsafe {
            self.0
                .get::<unsafe extern "C" fn() -> *const c_char>(LAST_ERROR_SYMBOL)
        }
        .ok()?;
        // SAFETY: the function takes no arguments and returns a pointer to a
        // NUL-terminated string that the library keeps valid for the life of
        // the process (or null, handled below).
        let text = unsafe { function() };
        if text.is_null() {
            return None;
        }
        // SAFETY: non-null and NUL-terminated, per the contract above; the
        // bytes are copied out at once.
        let text = unsafe { CStr::from_ptr(text) }.to_string_lossy();
        one_line(&text, LAST_ERROR_MAX)
    }
}

/// `text` on one line (control characters as spaces, runs of spaces
/// squeezed, trimmed), cut to at most `max` bytes on a character boundary;
/// `None` when nothing is left.
fn one_line(text: &str, max: usize) -> Option<String> {
    let mut out = String::with_capacity(text.len().min(max));
    for word in text
        .split(|c: char| c.is_control() || c.is_whitespace())
        .filter(|w| !w.is_empty())
    {
        if !out.is_empty() {
            out.push(' ');
        }
        out.push_str(word);
        if out.len() > max {
            break;
        }
    }
    if out.len() > max {
        let mut end = max;
        while !out.is_char_boundary(end) {
            end -= 1;
        }
        out.truncate(end);
    }
    (!out.is_empty()).then_some(out)
}

#[cfg(test)]
mod tests {
    use super::one_line;

    #[test]
    fn diagnostics_are_cut_to_one_short_line() {
        assert_eq!(one_line("  a\nb\t c\r\n", 100).as_deref(), Some("a b c"));
        assert_eq!(one_line(" \n\t", 100), None);
        assert_eq!(one_line("", 100), None);
        assert_eq!(one_line("abcdef", 4).as_deref(), Some("abcd"));
        // Never in the middle of a character.
        assert_eq!(one_line("aé", 2).as_deref(), Some("a"));
        assert_eq!(one_line(&"x".repeat(10_000), 1024).unwrap().len(), 1024);
    }
}
