//! Device handles and per-device queries: lookup by index, UUID and PCI
//! address; name, UUID, index, minor, brand, architecture, compute
//! capability, memory, PCI info, NUMA node, compute mode, serial, board id,
//! attributes, addressing mode. MIG device handles answer the queries that
//! make sense for a MIG device (name, UUID, memory, attributes, and the
//! parent's PCI info, brand, architecture and compute capability).

use std::ffi::{c_char, c_int, c_uint};

use nvml_wrapper_sys::bindings as sys;

use super::{
    device, export, fill, full_gpu, non_null, pointer_of, read_str, struct_version,
    struct_version_of, write, write_str,
};
use crate::codes;
use crate::machine::{DeviceRef, Machine};
use crate::pci::PciAddress;
use crate::runtime;

const MIB: u64 = 1024 * 1024;

export! {
    /// The handle of the GPU at an index.
    fn nvmlDeviceGetHandleByIndex_v2(index: c_uint, handle: *mut sys::nvmlDevice_t) {
        let h = runtime::with_machine(|m| {
            let i = index as usize;
            if i >= m.gpus.len() {
                return Err(codes::INVALID_ARGUMENT);
            }
            m.injected(NAME, Some(i))?;
            Ok(m.gpu_handle(i))
        })?;
        // SAFETY: output pointer per the contract.
        unsafe { write(handle, pointer_of(h)) }
    }
}

export! {
    /// The handle of the GPU (`GPU-...`) or MIG device (`MIG-...`) with a UUID.
    fn nvmlDeviceGetHandleByUUID(uuid: *const c_char, handle: *mut sys::nvmlDevice_t) {
        // SAFETY: NUL-terminated string per the contract.
        let uuid = unsafe { read_str(uuid) }?;
        let h = runtime::with_machine(|m| {
            let h = m.by_uuid(&uuid).ok_or(codes::NOT_FOUND)?;
            m.injected(NAME, Some(m.device(h)?.gpu()))?;
            Ok(h)
        })?;
        // SAFETY: output pointer per the contract.
        unsafe { write(handle, pointer_of(h)) }
    }
}

export! {
    /// The handle of the GPU at a PCI address (`0000:18:00.0`,
    /// `00000000:18:00.0` or `18:00.0`, any case).
    fn nvmlDeviceGetHandleByPciBusId_v2(pci_bus_id: *const c_char, handle: *mut sys::nvmlDevice_t) {
        // SAFETY: NUL-terminated string per the contract.
        let text = unsafe { read_str(pci_bus_id) }?;
        let address = PciAddress::parse(text.trim()).ok_or(codes::INVALID_ARGUMENT)?;
        let h = runtime::with_machine(|m| {
            let i = m.by_pci(address).ok_or(codes::NOT_FOUND)?;
            m.injected(NAME, Some(i))?;
            Ok(m.gpu_handle(i))
        })?;
        // SAFETY: output pointer per the contract.
        unsafe { write(handle, pointer_of(h)) }
    }
}

fn mig_name(m: &Machine, gpu: usize, gi: u32, ci: u32) -> Result<String, u32> {
    let gi = m.gi(gpu, gi)?;
    let ci = m.ci(gpu, gi.id, ci)?;
    let profile = m.ci_profile(gpu, gi, ci)?;
    Ok(format!("{} MIG {}", m.gpus[gpu].model.name, profile.name))
}

export! {
    /// Product name; for a MIG device "<product> MIG <profile>".
    fn nvmlDeviceGetName(handle: sys::nvmlDevice_t, name: *mut c_char, length: c_uint) {
        let text = runtime::with_machine(|m| match device(m, handle, NAME)? {
            DeviceRef::Gpu(g) => Ok(m.gpus[g].model.name.clone()),
            DeviceRef::Mig(g, gi, ci) => mig_name(m, g, gi, ci),
        })?;
        // SAFETY: buffer of `length` bytes per the contract.
        unsafe { write_str(name, length, &text) }
    }
}

export! {
    /// `GPU-...` UUID, or `MIG-...` for a MIG device.
    fn nvmlDeviceGetUUID(handle: sys::nvmlDevice_t, uuid: *mut c_char, length: c_uint) {
        let text = runtime::with_machine(|m| match device(m, handle, NAME)? {
            DeviceRef::Gpu(g) => Ok(m.gpus[g].uuid.clone()),
            DeviceRef::Mig(g, gi, ci) => Ok(m.ci(g, gi, ci)?.uuid.clone()),
        })?;
        // SAFETY: buffer of `length` bytes per the contract.
        unsafe { write_str(uuid, length, &text) }
    }
}

export! {
    /// NVML index of the GPU.
    fn nvmlDeviceGetIndex(handle: sys::nvmlDevice_t, index: *mut c_uint) {
        let i = runtime::with_machine(|m| full_gpu(m, handle, NAME))?;
        // SAFETY: output pointer per the contract.
        unsafe { write(index, i as c_uint) }
    }
}

export! {
    /// Minor number (`/dev/nvidia<minor>`).
    fn nvmlDeviceGetMinorNumber(handle: sys::nvmlDevice_t, minor_number: *mut c_uint) {
        let minor = runtime::with_machine(|m| Ok(m.gpus[full_gpu(m, handle, NAME)?].minor))?;
        // SAFETY: output pointer per the contract.
        unsafe { write(minor_number, minor) }
    }
}

export! {
    /// Brand (`nvmlBrandType_t`); a MIG device reports its parent's.
    fn nvmlDeviceGetBrand(handle: sys::nvmlDevice_t, brand: *mut sys::nvmlBrandType_t) {
        let b = runtime::with_machine(|m| Ok(m.gpus[device(m, handle, NAME)?.gpu()].model.brand))?;
        // SAFETY: output pointer per the contract.
        unsafe { write(brand, b) }
    }
}

export! {
    /// Architecture (`NVML_DEVICE_ARCH_*`); a MIG device reports its parent's.
    fn nvmlDeviceGetArchitecture(handle: sys::nvmlDevice_t, arch: *mut sys::nvmlDeviceArchitecture_t) {
        let a = runtime::with_machine(|m| {
            Ok(m.gpus[device(m, handle, NAME)?.gpu()].model.architecture)
        })?;
        // SAFETY: output pointer per the contract.
        unsafe { write(arch, a) }
    }
}

export! {
    /// CUDA compute capability; a MIG device reports its parent's.
    fn nvmlDeviceGetCudaComputeCapability(handle: sys::nvmlDevice_t, major: *mut c_int, minor: *mut c_int) {
        non_null(major)?;
        non_null(minor)?;
        let (a, b) = runtime::with_machine(|m| {
            Ok(m.gpus[device(m, handle, NAME)?.gpu()].model.compute_capability)
        })?;
        // SAFETY: output pointers per the contract.
        unsafe {
            write(major, a)?;
            write(minor, b)
        }
    }
}

/// Total memory in bytes: the GPU's, or the MIG device's GPU instance's.
fn memory_total(m: &Machine, device: DeviceRef) -> Result<u64, u32> {
    match device {
        DeviceRef::Gpu(g) => Ok(m.gpus[g].model.memory_mib * MIB),
        DeviceRef::Mig(g, gi, _) => {
            let gi = m.gi(g, gi)?;
            Ok(m.gi_profile(g, gi)?.memory_mib * MIB)
        }
    }
}

export! {
    /// Memory (total, free, used); nothing is ever allocated.
    fn nvmlDeviceGetMemoryInfo(handle: sys::nvmlDevice_t, memory: *mut sys::nvmlMemory_t) {
        let total = runtime::with_machine(|m| memory_total(m, device(m, handle, NAME)?))?;
        let info = sys::nvmlMemory_t { total, free: total, used: 0 };
        // SAFETY: output pointer per the contract.
        unsafe { write(memory, info) }
    }
}

export! {
    /// Memory, versioned struct (`nvmlMemory_v2_t`, version 2).
    fn nvmlDeviceGetMemoryInfo_v2(handle: sys::nvmlDevice_t, memory: *mut sys::nvmlMemory_v2_t) {
        let total = runtime::with_machine(|m| memory_total(m, device(m, handle, NAME)?))?;
        // SAFETY: the struct starts with its version word.
        let version = unsafe { struct_version(memory) }?;
        if version != struct_version_of::<sys::nvmlMemory_v2_t>(2) {
            return Err(codes::ARGUMENT_VERSION_MISMATCH);
        }
        let info = sys::nvmlMemory_v2_t { version, total, reserved: 0, free: total, used: 0 };
        // SAFETY: output pointer per the contract.
        unsafe { write(memory, info) }
    }
}

export! {
    /// PCI information; a MIG device reports its parent's.
    fn nvmlDeviceGetPciInfo_v3(handle: sys::nvmlDevice_t, pci: *mut sys::nvmlPciInfo_t) {
        let info = runtime::with_machine(|m| {
            let gpu = &m.gpus[device(m, handle, NAME)?.gpu()];
            Ok(pci_info(gpu.pci, gpu.model.pci_device_id, gpu.model.pci_subsystem_id))
        })?;
        // SAFETY: output pointer per the contract.
        unsafe { write(pci, info) }
    }
}

/// An `nvmlPciInfo_t` for an address.
pub(super) fn pci_info(
    address: PciAddress,
    device_id: u32,
    subsystem_id: u32,
) -> sys::nvmlPciInfo_t {
    sys::nvmlPciInfo_t {
        busIdLegacy: fill(&address.nvml_legacy()),
        domain: address.domain,
        bus: u32::from(address.bus),
        device: u32::from(address.device),
        pciDeviceId: device_id,
        pciSubSystemId: subsystem_id,
        busId: fill(&address.nvml()),
    }
}

export! {
    /// NUMA node of the GPU; NOT_SUPPORTED when the profile says -1.
    fn nvmlDeviceGetNumaNodeId(handle: sys::nvmlDevice_t, node: *mut c_uint) {
        let numa = runtime::with_machine(|m| {
            let numa = m.gpus[full_gpu(m, handle, NAME)?].numa_node;
            u32::try_from(numa).map_err(|_| codes::NOT_SUPPORTED)
        })?;
        // SAFETY: output pointer per the contract.
        unsafe { write(node, numa) }
    }
}

export! {
    /// Compute mode (`nvmlComputeMode_t`).
    fn nvmlDeviceGetComputeMode(handle: sys::nvmlDevice_t, mode: *mut sys::nvmlComputeMode_t) {
        let value = runtime::with_machine(|m| Ok(m.gpus[full_gpu(m, handle, NAME)?].compute_mode))?;
        // SAFETY: output pointer per the contract.
        unsafe { write(mode, value) }
    }
}

export! {
    /// Sets the compute mode (saved to the state file).
    fn nvmlDeviceSetComputeMode(handle: sys::nvmlDevice_t, mode: sys::nvmlComputeMode_t) {
        if mode >= sys::nvmlComputeMode_enum_NVML_COMPUTEMODE_COUNT {
            return Err(codes::INVALID_ARGUMENT);
        }
        runtime::with_machine(|m| {
            let g = full_gpu(m, handle, NAME)?;
            m.mutate(g, |gpu| {
                gpu.compute_mode = mode;
                Ok(())
            })
        })
    }
}

export! {
    /// Board serial number.
    fn nvmlDeviceGetSerial(handle: sys::nvmlDevice_t, serial: *mut c_char, length: c_uint) {
        let text = runtime::with_machine(|m| Ok(m.gpus[full_gpu(m, handle, NAME)?].serial.clone()))?;
        // SAFETY: buffer of `length` bytes per the contract.
        unsafe { write_str(serial, length, &text) }
    }
}

export! {
    /// Board id.
    fn nvmlDeviceGetBoardId(handle: sys::nvmlDevice_t, board_id: *mut c_uint) {
        let id = runtime::with_machine(|m| Ok(m.gpus[full_gpu(m, handle, NAME)?].board_id))?;
        // SAFETY: output pointer per the contract.
        unsafe { write(board_id, id) }
    }
}

export! {
    /// Attributes: for a MIG device its SMs, shared engines, slices and
    /// memory; for a whole GPU its SMs and memory.
    fn nvmlDeviceGetAttributes_v2(handle: sys::nvmlDevice_t, attributes: *mut sys::nvmlDeviceAttributes_t) {
        let attrs = runtime::with_machine(|m| match device(m, handle, NAME)? {
            DeviceRef::Gpu(g) => Ok(sys::nvmlDeviceAttributes_t {
                multiprocessorCount: m.gpus[g].model.multiprocessors,
                sharedCopyEngineCount: 0,
                sharedDecoderCount: 0,
                sharedEncoderCount: 0,
                sharedJpegCount: 0,
                sharedOfaCount: 0,
                gpuInstanceSliceCount: 0,
                computeInstanceSliceCount: 0,
                memorySizeMB: m.gpus[g].model.memory_mib,
            }),
            DeviceRef::Mig(g, gi, ci) => {
                let gi = m.gi(g, gi)?;
                let ci = m.ci(g, gi.id, ci)?;
                let gp = m.gi_profile(g, gi)?;
                let cp = m.ci_profile(g, gi, ci)?;
                Ok(sys::nvmlDeviceAttributes_t {
                    multiprocessorCount: cp.multiprocessors,
                    sharedCopyEngineCount: gp.copy_engines,
                    sharedDecoderCount: gp.decoders,
                    sharedEncoderCount: gp.encoders,
                    sharedJpegCount: gp.jpeg_engines,
                    sharedOfaCount: gp.ofa_engines,
                    gpuInstanceSliceCount: gp.compute_slices,
                    computeInstanceSliceCount: cp.slices,
                    memorySizeMB: gp.memory_mib,
                })
            }
        })?;
        // SAFETY: output pointer per the contract.
        unsafe { write(attributes, attrs) }
    }
}

export! {
    /// Addressing mode (`nvmlDeviceAddressingMode_v1_t`); NOT_SUPPORTED
    /// unless the profile sets `addressingMode`.
    fn nvmlDeviceGetAddressingMode(handle: sys::nvmlDevice_t, mode: *mut sys::nvmlDeviceAddressingMode_t) {
        let value = runtime::with_machine(|m| {
            m.gpus[full_gpu(m, handle, NAME)?].addressing_mode.ok_or(codes::NOT_SUPPORTED)
        })?;
        // SAFETY: the struct starts with its version word.
        let version = unsafe { struct_version(mode) }?;
        if version != struct_version_of::<sys::nvmlDeviceAddressingMode_v1_t>(1) {
            return Err(codes::ARGUMENT_VERSION_MISMATCH);
        }
        // SAFETY: output pointer per the contract.
        unsafe { write(mode, sys::nvmlDeviceAddressingMode_t { version, value }) }
    }
}
