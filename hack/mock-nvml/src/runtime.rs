//! The library's global state: NVML's reference-counted init/shutdown, the
//! current machine, and the message of the last failed init. A machine
//! outlives `nvmlShutdown` (as hardware state does) and is reused by the next
//! `nvmlInit` when nothing about its configuration changed.

use std::ffi::{CStr, CString};
use std::sync::{Mutex, MutexGuard, PoisonError};

use crate::codes::{self, Code};
use crate::config::{self, Config};
use crate::error::Error;
use crate::ids;
use crate::machine::Machine;

#[derive(Default)]
struct Runtime {
    /// Successful inits minus shutdowns.
    init_count: u32,
    /// The machine while initialised.
    machine: Option<Machine>,
    /// The machine of the last shutdown, its configuration and profile digest.
    retained: Option<(Config, String, Machine)>,
}

static RUNTIME: Mutex<Runtime> = Mutex::new(Runtime {
    init_count: 0,
    machine: None,
    retained: None,
});

/// Messages of failed inits. Each is leaked so the pointer handed out by
/// `mockNvmlLastError` stays valid for the life of the process.
static LAST_ERROR: Mutex<Option<&'static CStr>> = Mutex::new(None);

fn lock() -> MutexGuard<'static, Runtime> {
    // A panic while the lock was held is caught at the FFI boundary; the
    // state it left is still consistent (mutations are applied whole).
    RUNTIME.lock().unwrap_or_else(PoisonError::into_inner)
}

fn set_last_error(message: &str) {
    let text = CString::new(message.replace('\0', " ")).unwrap_or_default();
    let leaked: &'static CStr = Box::leak(text.into_boxed_c_str());
    *LAST_ERROR.lock().unwrap_or_else(PoisonError::into_inner) = Some(leaked);
}

/// The message of the last failed `nvmlInit`, or an empty string.
pub fn last_error() -> &'static CStr {
    LAST_ERROR
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .unwrap_or(c"")
}

fn fail_init(code: Code, message: &str) -> Code {
    let message = format!("nvmlInit failed ({}): {message}", codes::name(code));
    eprintln!("mock-nvml: {message}");
    set_last_error(&message);
    code
}

/// `nvmlInit_v2` / `nvmlInitWithFlags`: the first init loads the machine
/// from the configuration (the sidecar in `library_dir`, else the
/// environment); later ones only count.
pub fn init(function: &str, library_dir: Option<&std::path::Path>) -> Code {
    let mut rt = lock();
    if rt.init_count > 0 {
        rt.init_count += 1;
        return codes::SUCCESS;
    }
    let config = match config::resolve(library_dir) {
        Ok(c) => c,
        Err(e @ Error::NotConfigured) => {
            return fail_init(codes::DRIVER_NOT_LOADED, &e.to_string());
        }
        Err(e) => return fail_init(codes::UNKNOWN, &e.to_string()),
    };
    let digest = match std::fs::read(&config.profile) {
        Ok(bytes) => ids::digest(&bytes),
        Err(e) => {
            let e = Error::io("read profile", &config.profile, e);
            return fail_init(codes::UNKNOWN, &e.to_string());
        }
    };
    // Without a state file the hardware state lives in this process: reuse
    // the machine of the last shutdown if it is the same machine. With a
    // state file, the file is the truth.
    let retained = rt.retained.take();
    let machine = match retained {
        Some((c, d, m)) if c == config && d == digest && config.state.is_none() => m,
        _ => match Machine::build(&config) {
            Ok(m) => m,
            Err(e) => return fail_init(codes::UNKNOWN, &e.to_string()),
        },
    };
    if let Err(code) = machine.injected(function, None) {
        rt.retained = Some((config, digest, machine));
        return fail_init(code, "failure injected by the profile");
    }
    crate::faults::install(
        &digest,
        machine.gpus.iter().map(|g| g.health.clone()).collect(),
    );
    if let Some(control) = &config.control {
        crate::control::start(control);
    }
    rt.retained = Some((config, digest, machine.clone()));
    rt.machine = Some(machine);
    rt.init_count = 1;
    *LAST_ERROR.lock().unwrap_or_else(PoisonError::into_inner) = None;
    codes::SUCCESS
}

/// `nvmlShutdown`.
pub fn shutdown() -> Code {
    let mut rt = lock();
    if rt.init_count == 0 {
        return codes::UNINITIALIZED;
    }
    rt.init_count -= 1;
    if rt.init_count == 0
        && let Some(machine) = rt.machine.take()
        && let Some((_, _, retained)) = rt.retained.as_mut()
    {
        *retained = machine;
    }
    codes::SUCCESS
}

/// Runs `f` on the machine; UNINITIALIZED before a successful init.
pub fn with_machine<R>(f: impl FnOnce(&mut Machine) -> Result<R, Code>) -> Result<R, Code> {
    let mut rt = lock();
    let machine = rt.machine.as_mut().ok_or(codes::UNINITIALIZED)?;
    f(machine)
}
