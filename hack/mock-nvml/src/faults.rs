//! The live health of the machine's GPUs and NVML's event sets: one
//! process-wide state (per library copy) behind a mutex and a condition
//! variable, so a thread blocked in `nvmlEventSetWait_v2` wakes as soon as a
//! control command emits an event, without holding the machine's lock.
//!
//! Lock order: the machine's lock (`runtime`) may be held while this one is
//! taken, never the reverse.

use std::collections::{BTreeMap, VecDeque};
use std::sync::{Condvar, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use crate::codes::{self, Code};
use crate::command::Command;
use crate::health::{self, GpuHealth};

/// Events kept per set before the oldest are dropped (a set nobody waits on
/// must not grow without bound).
pub const MAX_QUEUED: usize = 1024;

/// The id NVML reports for "the whole GPU" in an event's GI/CI.
pub const WHOLE_GPU: u32 = 0xFFFF_FFFF;

/// Tag of event set handles (top byte), as for the machine's handles.
const TAG_EVENT_SET: u64 = 0xA5;

/// One event as `nvmlEventData_t` carries it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Event {
    /// Device handle of the GPU.
    pub device: u64,
    /// GPU index.
    pub gpu: usize,
    /// `nvmlEventType*`.
    pub event_type: u64,
    /// XID number, recovery action, or 0.
    pub data: u64,
    /// GPU instance id, [`WHOLE_GPU`] when none.
    pub gpu_instance_id: u32,
    /// Compute instance id, [`WHOLE_GPU`] when none.
    pub compute_instance_id: u32,
}

/// An event set: what is registered per GPU and the events not yet read.
#[derive(Debug, Default)]
struct EventSet {
    /// GPU index to (event mask, device handle).
    registered: BTreeMap<usize, (u64, u64)>,
    queue: VecDeque<Event>,
}

#[derive(Debug, Default)]
struct World {
    /// Identity of the machine the GPU states belong to.
    machine: Option<String>,
    gpus: Vec<GpuHealth>,
    sets: BTreeMap<u64, EventSet>,
    next_set: u64,
}

static WORLD: Mutex<World> = Mutex::new(World {
    machine: None,
    gpus: Vec::new(),
    sets: BTreeMap::new(),
    next_set: 1,
});
static WOKEN: Condvar = Condvar::new();

fn lock() -> MutexGuard<'static, World> {
    // Every change is validated before anything is written, so a panic
    // cannot leave a half-applied change behind.
    WORLD.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Installs the GPUs' health of a newly built machine, unless the same
/// machine (same `identity`) is installed already: its faults live on
/// across `nvmlShutdown`/`nvmlInit`, as hardware state does. Event sets of
/// an earlier machine are dropped.
pub fn install(identity: &str, gpus: Vec<GpuHealth>) {
    let mut world = lock();
    if world.machine.as_deref() == Some(identity) && world.gpus.len() == gpus.len() {
        return;
    }
    world.machine = Some(identity.to_owned());
    world.gpus = gpus;
    world.sets.clear();
    WOKEN.notify_all();
}

/// Runs `f` on the health of GPU `gpu`; a GPU the state does not know
/// (no machine installed) is healthy.
pub fn with_gpu<R>(gpu: usize, f: impl FnOnce(&GpuHealth) -> R) -> Option<R> {
    lock().gpus.get(gpu).map(f)
}

/// Whether GPU `gpu` has fallen off the bus.
pub fn is_lost(gpu: usize) -> bool {
    with_gpu(gpu, |h| h.lost).unwrap_or(false)
}

/// The processes on GPU `gpu`, graphics or compute contexts; none when
/// the state does not know the GPU.
pub fn processes(gpu: usize, graphics: bool) -> Vec<crate::processes::Process> {
    with_gpu(gpu, |h| {
        if graphics {
            h.graphics_processes.clone()
        } else {
            h.compute_processes.clone()
        }
    })
    .unwrap_or_default()
}

/// Whether a link of the profile is up (links the profile does not have
/// are never up).
pub fn link_up(gpu: usize, link: u32) -> bool {
    with_gpu(gpu, |h| h.link_up(link)).unwrap_or(true)
}

/// `nvmlEventSetCreate`: a new, empty set's handle.
pub fn create_set() -> u64 {
    let mut world = lock();
    let id = world.next_set;
    world.next_set = (world.next_set + 1) & 0x00ff_ffff_ffff_ffff;
    world.sets.insert(id, EventSet::default());
    (TAG_EVENT_SET << 56) | id
}

fn set_id(handle: u64) -> Result<u64, Code> {
    if handle >> 56 == TAG_EVENT_SET {
        Ok(handle & 0x00ff_ffff_ffff_ffff)
    } else {
        Err(codes::INVALID_ARGUMENT)
    }
}

/// `nvmlEventSetFree`.
pub fn free_set(handle: u64) -> Result<(), Code> {
    let id = set_id(handle)?;
    let mut world = lock();
    world
        .sets
        .remove(&id)
        .map(|_| ())
        .ok_or(codes::INVALID_ARGUMENT)?;
    WOKEN.notify_all();
    Ok(())
}

/// `nvmlDeviceGetSupportedEventTypes`.
pub fn supported_events(gpu: usize) -> u64 {
    with_gpu(gpu, GpuHealth::supported_events).unwrap_or(health::EVENT_XID | health::EVENT_DBE)
}

/// `nvmlDeviceRegisterEvents`: NOT_SUPPORTED when the GPU refuses events
/// or a type in `mask` is not supported; the set's mask for the GPU grows.
pub fn register(set: u64, gpu: usize, device: u64, mask: u64) -> Result<(), Code> {
    let id = set_id(set)?;
    let mut world = lock();
    let supported = world.gpus.get(gpu).map_or(
        health::EVENT_XID | health::EVENT_DBE,
        GpuHealth::supported_events,
    );
    if world.gpus.get(gpu).is_some_and(|h| h.refuse_events) || mask & !supported != 0 {
        return Err(codes::NOT_SUPPORTED);
    }
    let set = world.sets.get_mut(&id).ok_or(codes::INVALID_ARGUMENT)?;
    let entry = set.registered.entry(gpu).or_insert((0, device));
    entry.0 |= mask;
    Ok(())
}

/// `nvmlEventSetWait_v2`: the next event, TIMEOUT when none comes in time,
/// GPU_IS_LOST while a GPU registered in the set is lost.
pub fn wait(set: u64, timeout: Duration) -> Result<Event, Code> {
    let id = set_id(set)?;
    let deadline = Instant::now() + timeout;
    let mut world = lock();
    loop {
        let World { sets, gpus, .. } = &mut *world;
        let set = sets.get_mut(&id).ok_or(codes::INVALID_ARGUMENT)?;
        if set
            .registered
            .keys()
            .any(|g| gpus.get(*g).is_some_and(|h| h.lost))
        {
            return Err(codes::GPU_IS_LOST);
        }
        if let Some(event) = set.queue.pop_front() {
            return Ok(event);
        }
        let now = Instant::now();
        if now >= deadline {
            return Err(codes::TIMEOUT);
        }
        world = WOKEN
            .wait_timeout(world, deadline - now)
            .unwrap_or_else(PoisonError::into_inner)
            .0;
    }
}

/// Queues an event of GPU `gpu` in every set that registered its type.
fn emit(world: &mut World, gpu: usize, event_type: u64, data: u64, instance: Option<(u32, u32)>) {
    let (gi, ci) = instance.unwrap_or((WHOLE_GPU, WHOLE_GPU));
    for set in world.sets.values_mut() {
        let Some(&(mask, device)) = set.registered.get(&gpu) else {
            continue;
        };
        if mask & event_type == 0 {
            continue;
        }
        if set.queue.len() == MAX_QUEUED {
            set.queue.pop_front();
            eprintln!(
                "mock-nvml: an event set holds {MAX_QUEUED} unread events; the oldest is dropped"
            );
        }
        set.queue.push_back(Event {
            device,
            gpu,
            event_type,
            data,
            gpu_instance_id: gi,
            compute_instance_id: ci,
        });
    }
}

/// An event to emit: type, data, MIG instance.
type Pending = (u64, u64, Option<(u32, u32)>);

/// Applies a control command: validated first (the GPU's minor, a link of
/// the profile, a field the driver has), then applied whole, its events
/// emitted and waiting threads woken. An error changes nothing.
pub fn apply(command: &Command) -> Result<(), String> {
    let mut world = lock();
    if world.machine.is_none() {
        return Err("no machine is loaded yet (nvmlInit has not succeeded)".into());
    }
    let minor = command.minor();
    let gpu = world
        .gpus
        .iter()
        .position(|h| h.minor == minor)
        .ok_or_else(|| {
            let minors: Vec<String> = world.gpus.iter().map(|h| h.minor.to_string()).collect();
            format!(
                "no GPU has minor {minor} (the machine's minors: {})",
                minors.join(", ")
            )
        })?;
    let mut next = world.gpus[gpu].clone();
    let mut events: Vec<Pending> = Vec::new();
    match *command {
        Command::Xid { xid, instance, .. } => {
            events.push((health::EVENT_XID, xid, instance));
        }
        Command::Lose { .. } => next.lost = true,
        Command::Restore { .. } => next.lost = false,
        Command::Recovery { action, .. } => {
            if !next.has_recovery_action {
                return Err(format!(
                    "GPU minor {minor}: the driver has no recovery action before R{}",
                    health::RECOVERY_ACTION_DRIVER
                ));
            }
            next.recovery_action = action.value();
            events.push((
                health::EVENT_RECOVERY_ACTION,
                u64::from(action.value()),
                None,
            ));
        }
        Command::Remap {
            pending, failure, ..
        } => {
            if failure && !next.row_remapping {
                return Err(format!(
                    "GPU minor {minor} retires pages, it has no row remapping to fail"
                ));
            }
            if pending && !next.remap_pending && next.row_remapping {
                events.push((health::EVENT_DRAM_RETIREMENT, 0, None));
            }
            if failure && !next.remap_failure {
                events.push((health::EVENT_DRAM_RETIREMENT_FAILURE, 0, None));
            }
            next.remap_pending = pending;
            next.remap_failure = failure;
        }
        Command::Ecc { uncorrected, .. } => {
            if uncorrected > next.ecc_uncorrected {
                events.push((health::EVENT_DBE, 0, None));
            }
            next.ecc_uncorrected = uncorrected;
        }
        Command::Nvlink { link, up, .. } => {
            if !next.links.contains(&link) {
                return Err(format!(
                    "GPU minor {minor}: link {link} is not one of its NVLinks in the profile ({})",
                    if next.links.is_empty() {
                        "it has none".to_owned()
                    } else {
                        next.links
                            .iter()
                            .map(u32::to_string)
                            .collect::<Vec<_>>()
                            .join(", ")
                    }
                ));
            }
            if up {
                next.links_down.remove(&link);
            } else {
                next.links_down.insert(link);
            }
        }
        Command::RefuseEvents { .. } => next.refuse_events = true,
        Command::AcceptEvents { .. } => next.refuse_events = false,
        Command::Slowdown { reason, .. } => next.clock_reasons = reason.bits(),
        Command::PcieReplays { count, .. } => next.pcie_replays = count,
        Command::Processes {
            graphics,
            ref processes,
            ..
        } => {
            if graphics {
                next.graphics_processes.clone_from(processes);
            } else {
                next.compute_processes.clone_from(processes);
            }
        }
    }
    world.gpus[gpu] = next;
    for (event_type, data, instance) in events {
        emit(&mut world, gpu, event_type, data, instance);
    }
    WOKEN.notify_all();
    Ok(())
}
