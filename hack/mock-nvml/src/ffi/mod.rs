//! The C ABI: the exported NVML functions. This is the only place with
//! `unsafe`: it reads the caller's arguments and writes the caller's output
//! pointers, each block with a `SAFETY` comment. Every function body runs
//! under [`guard`], so a panic becomes NVML_ERROR_UNKNOWN instead of
//! unwinding into C; the logic lives in the safe modules.

#![allow(unsafe_code)]

use std::ffi::{CStr, OsStr, c_char, c_uint, c_void};
use std::os::unix::ffi::OsStrExt;
use std::panic::AssertUnwindSafe;
use std::path::PathBuf;

use crate::codes::{self, Code};
use crate::machine::{DeviceRef, Handle, Machine};

mod device;
mod fabric;
mod health;
mod instances;
mod links;
mod mig_device;
mod processes;
mod system;

/// Declares an exported NVML function: `#[unsafe(no_mangle)] pub unsafe
/// extern "C"`, returning `nvmlReturn_t`, its body (a block evaluating to
/// `Result<(), Code>`) run under [`guard`]. The body can use `NAME`, the
/// function's name, for failure injection.
macro_rules! export {
    ($(#[doc = $doc:literal])* fn $name:ident($($arg:ident: $ty:ty),* $(,)?) $body:block) => {
        $(#[doc = $doc])*
        ///
        /// # Safety
        ///
        /// Pointer arguments must be null or valid for the reads and writes
        /// NVML documents for this function (string buffers: `length` bytes;
        /// arrays: the documented number of elements). Handles are opaque
        /// tokens; unknown or stale ones are rejected.
        #[unsafe(no_mangle)]
        pub unsafe extern "C" fn $name($($arg: $ty),*) -> nvml_wrapper_sys::bindings::nvmlReturn_t {
            #[allow(dead_code)]
            const NAME: &str = stringify!($name);
            $crate::ffi::guard(|| $body)
        }
    };
}
pub(crate) use export;

/// Runs an FFI body, turning its result into a return code and a panic into
/// NVML_ERROR_UNKNOWN.
pub(crate) fn guard(body: impl FnOnce() -> Result<(), Code>) -> Code {
    match std::panic::catch_unwind(AssertUnwindSafe(body)) {
        Ok(Ok(())) => codes::SUCCESS,
        Ok(Err(code)) => code,
        Err(_) => {
            eprintln!("mock-nvml: internal error (panic) turned into NVML_ERROR_UNKNOWN");
            codes::UNKNOWN
        }
    }
}

/// The handle value behind an opaque NVML pointer type.
pub(crate) fn handle_of<T>(ptr: *mut T) -> Handle {
    ptr.addr() as Handle
}

/// An opaque NVML pointer carrying a handle value. It is never dereferenced.
pub(crate) fn pointer_of<T>(handle: Handle) -> *mut T {
    std::ptr::without_provenance_mut(handle as usize)
}

/// Resolves a device handle on `m`, applying the failure injected into
/// function `name` for its GPU.
pub(crate) fn device<T>(m: &Machine, handle: *mut T, name: &str) -> Result<DeviceRef, Code> {
    let device = m.device(handle_of(handle))?;
    m.injected(name, Some(device.gpu()))?;
    Ok(device)
}

/// Resolves a handle that must be a whole GPU: a MIG device handle gets
/// NOT_SUPPORTED, as queries that MIG devices do not answer.
pub(crate) fn full_gpu<T>(m: &Machine, handle: *mut T, name: &str) -> Result<usize, Code> {
    match device(m, handle, name)? {
        DeviceRef::Gpu(g) => Ok(g),
        DeviceRef::Mig(..) => Err(codes::NOT_SUPPORTED),
    }
}

/// Writes one value through an output pointer.
///
/// # Safety
///
/// `ptr` must be null or valid for a write of `T` (alignment not required).
pub(crate) unsafe fn write<T>(ptr: *mut T, value: T) -> Result<(), Code> {
    if ptr.is_null() {
        return Err(codes::INVALID_ARGUMENT);
    }
    // SAFETY: non-null, and valid for a write of T by the caller's contract.
    unsafe { ptr.write_unaligned(value) };
    Ok(())
}

/// Reads one value through an input pointer.
///
/// # Safety
///
/// `ptr` must be null or valid for a read of `T` (alignment not required).
pub(crate) unsafe fn read<T: Copy>(ptr: *const T) -> Result<T, Code> {
    if ptr.is_null() {
        return Err(codes::INVALID_ARGUMENT);
    }
    // SAFETY: non-null, and valid for a read of T by the caller's contract.
    Ok(unsafe { ptr.read_unaligned() })
}

/// Checks an output pointer before anything is changed, so a bad pointer
/// never leaves a half-done operation behind.
pub(crate) fn non_null<T>(ptr: *const T) -> Result<(), Code> {
    if ptr.is_null() {
        Err(codes::INVALID_ARGUMENT)
    } else {
        Ok(())
    }
}

/// Copies `text` and its NUL into a caller buffer of `length` bytes;
/// INSUFFICIENT_SIZE when it does not fit.
///
/// # Safety
///
/// `buffer` must be null or valid for writes of `length` bytes.
pub(crate) unsafe fn write_str(
    buffer: *mut c_char,
    length: c_uint,
    text: &str,
) -> Result<(), Code> {
    if buffer.is_null() {
        return Err(codes::INVALID_ARGUMENT);
    }
    let bytes = text.as_bytes();
    if bytes.len() >= length as usize {
        return Err(codes::INSUFFICIENT_SIZE);
    }
    // SAFETY: the buffer holds `length` > bytes.len() bytes (checked above)
    // and cannot overlap `text`, which this library owns.
    unsafe {
        std::ptr::copy_nonoverlapping(bytes.as_ptr().cast::<c_char>(), buffer, bytes.len());
        buffer.add(bytes.len()).write(0);
    }
    Ok(())
}

/// Writes `items` into a caller array that holds `capacity` elements (the
/// in/out `count` convention): sets `*count` to the number of items, and
/// fails with INSUFFICIENT_SIZE when they do not fit. A null array only
/// reports the number.
///
/// # Safety
///
/// `count` must be null or valid for a read and a write of `c_uint`;
/// `array` null or valid for writes of `*count` elements.
pub(crate) unsafe fn write_counted<T: Copy>(
    array: *mut T,
    count: *mut c_uint,
    items: &[T],
) -> Result<(), Code> {
    // SAFETY: forwarded caller contract for `count`.
    let capacity = unsafe { read(count) }?;
    let n = items.len() as c_uint;
    // SAFETY: as above.
    unsafe { write(count, n) }?;
    if array.is_null() {
        return Ok(());
    }
    if capacity < n {
        return Err(codes::INSUFFICIENT_SIZE);
    }
    // SAFETY: the array holds `capacity` >= n elements by the caller's contract.
    unsafe { std::ptr::copy_nonoverlapping(items.as_ptr(), array, items.len()) };
    Ok(())
}

/// Writes `items` into a caller array sized by NVML's rules (the profile's
/// instance count; no capacity is passed) and their number into `*count`.
///
/// # Safety
///
/// `array` null or valid for writes of `items.len()` elements; `count` null
/// or valid for a write.
pub(crate) unsafe fn write_array<T: Copy>(
    array: *mut T,
    count: *mut c_uint,
    items: &[T],
) -> Result<(), Code> {
    non_null(array)?;
    non_null(count)?;
    // SAFETY: the caller sized the array for the profile's instance count,
    // which bounds `items`.
    unsafe { std::ptr::copy_nonoverlapping(items.as_ptr(), array, items.len()) };
    // SAFETY: non-null, caller contract.
    unsafe { write(count, items.len() as c_uint) }
}

/// Reads a NUL-terminated UTF-8 argument.
///
/// # Safety
///
/// `text` must be null or point to a NUL-terminated string.
pub(crate) unsafe fn read_str(text: *const c_char) -> Result<String, Code> {
    if text.is_null() {
        return Err(codes::INVALID_ARGUMENT);
    }
    // SAFETY: non-null and NUL-terminated by the caller's contract.
    let text = unsafe { CStr::from_ptr(text) };
    text.to_str()
        .map(str::to_owned)
        .map_err(|_| codes::INVALID_ARGUMENT)
}

/// Reads the `version` word at the start of a versioned NVML struct.
///
/// # Safety
///
/// `ptr` must be null or valid for a read of at least 4 bytes.
pub(crate) unsafe fn struct_version<T>(ptr: *const T) -> Result<u32, Code> {
    // SAFETY: forwarded caller contract; every versioned struct starts with
    // an unsigned int `version`.
    unsafe { read(ptr.cast::<u32>()) }
}

/// `NVML_STRUCT_VERSION(T, v)`: the struct size with the version in the top byte.
pub(crate) fn struct_version_of<T>(version: u32) -> u32 {
    (std::mem::size_of::<T>() as u32) | (version << 24)
}

/// Copies `text` into a fixed C char array, truncated and NUL-terminated.
pub(crate) fn fill<const N: usize>(text: &str) -> [c_char; N] {
    let mut out = [0 as c_char; N];
    for (dst, src) in out.iter_mut().zip(text.bytes().take(N.saturating_sub(1))) {
        *dst = src as c_char;
    }
    out
}

/// The directory of the loaded library (where a `mock-nvml.env` sidecar may
/// sit), found with `dladdr` on one of its own functions.
pub(crate) fn library_dir() -> Option<PathBuf> {
    let mut info = libc::Dl_info {
        dli_fname: std::ptr::null(),
        dli_fbase: std::ptr::null_mut(),
        dli_sname: std::ptr::null(),
        dli_saddr: std::ptr::null_mut(),
    };
    let address = library_dir as fn() -> Option<PathBuf> as *const c_void;
    // SAFETY: dladdr only inspects the address and fills `info`, a valid
    // Dl_info owned by this frame.
    if unsafe { libc::dladdr(address, &raw mut info) } == 0 || info.dli_fname.is_null() {
        return None;
    }
    // SAFETY: dladdr set dli_fname to the loader's NUL-terminated path of the
    // object, which stays valid while the object is loaded (we are running
    // its code).
    let name = unsafe { CStr::from_ptr(info.dli_fname) };
    let path = std::fs::canonicalize(OsStr::from_bytes(name.to_bytes())).ok()?;
    path.parent().map(std::path::Path::to_path_buf)
}
