//! MIG through the real NVML entry points: placements, overlap, capacity,
//! GPU instances without compute instances, MIG device handles, MIG mode
//! changes, and NOT_SUPPORTED where the hardware has no MIG. GPU/compute
//! instance calls are raw (nvml-wrapper has no safe API for them), exactly
//! as the driver's backend makes them.
#![allow(unsafe_code)]

#[macro_use]
mod common;

use std::ffi::c_uint;

use common::Fake;
use nvml_wrapper::error::NvmlError;
use nvml_wrapper::{Device, Nvml};
use nvml_wrapper_sys::bindings as sys;

const SUCCESS: u32 = 0;
const INVALID_ARGUMENT: u32 = 2;
const NOT_SUPPORTED: u32 = 3;
const NOT_FOUND: u32 = 6;
const INSUFFICIENT_SIZE: u32 = 7;
const IN_USE: u32 = 19;
const INSUFFICIENT_RESOURCES: u32 = 23;
const ARGUMENT_VERSION_MISMATCH: u32 = 25;

fn handle(d: &Device<'_>) -> sys::nvmlDevice_t {
    // SAFETY: the handle is only passed back to the library it came from.
    unsafe { d.handle() }
}

fn create_gi(
    nvml: &Nvml,
    d: &Device<'_>,
    profile_id: u32,
    at: Option<(u32, u32)>,
) -> Result<sys::nvmlGpuInstance_t, u32> {
    let mut gi: sys::nvmlGpuInstance_t = std::ptr::null_mut();
    let rc = match at {
        None => call!(
            nvml,
            nvmlDeviceCreateGpuInstance(handle(d), profile_id, &raw mut gi)
        ),
        Some((start, size)) => {
            let placement = sys::nvmlGpuInstancePlacement_t { start, size };
            call!(
                nvml,
                nvmlDeviceCreateGpuInstanceWithPlacement(
                    handle(d),
                    profile_id,
                    &raw const placement,
                    &raw mut gi
                )
            )
        }
    };
    if rc == SUCCESS { Ok(gi) } else { Err(rc) }
}

fn gi_info(nvml: &Nvml, gi: sys::nvmlGpuInstance_t) -> Result<sys::nvmlGpuInstanceInfo_t, u32> {
    let mut info = sys::nvmlGpuInstanceInfo_t {
        device: std::ptr::null_mut(),
        id: 0,
        profileId: 0,
        placement: sys::nvmlGpuInstancePlacement_t { start: 0, size: 0 },
    };
    match call!(nvml, nvmlGpuInstanceGetInfo(gi, &raw mut info)) {
        SUCCESS => Ok(info),
        rc => Err(rc),
    }
}

fn placement_of(nvml: &Nvml, gi: sys::nvmlGpuInstance_t) -> (u32, u32) {
    let info = gi_info(nvml, gi).unwrap();
    (info.placement.start, info.placement.size)
}

fn remaining(nvml: &Nvml, d: &Device<'_>, profile_id: u32) -> u32 {
    let mut n: c_uint = 99;
    assert_eq!(
        call!(
            nvml,
            nvmlDeviceGetGpuInstanceRemainingCapacity(handle(d), profile_id, &raw mut n)
        ),
        SUCCESS
    );
    n
}

fn placements(nvml: &Nvml, d: &Device<'_>, profile_id: u32) -> Result<Vec<(u32, u32)>, u32> {
    let mut count: c_uint = 0;
    let rc = call!(
        nvml,
        nvmlDeviceGetGpuInstancePossiblePlacements_v2(
            handle(d),
            profile_id,
            std::ptr::null_mut(),
            &raw mut count
        )
    );
    if rc != SUCCESS {
        return Err(rc);
    }
    let mut list = vec![sys::nvmlGpuInstancePlacement_t { start: 0, size: 0 }; count as usize];
    let rc = call!(
        nvml,
        nvmlDeviceGetGpuInstancePossiblePlacements_v2(
            handle(d),
            profile_id,
            list.as_mut_ptr(),
            &raw mut count
        )
    );
    assert_eq!(rc, SUCCESS);
    Ok(list
        .iter()
        .take(count as usize)
        .map(|p| (p.start, p.size))
        .collect())
}

fn gpu_instances(nvml: &Nvml, d: &Device<'_>, profile_id: u32) -> Vec<sys::nvmlGpuInstance_t> {
    let mut list = vec![std::ptr::null_mut(); 8];
    let mut count: c_uint = 0;
    assert_eq!(
        call!(
            nvml,
            nvmlDeviceGetGpuInstances(handle(d), profile_id, list.as_mut_ptr(), &raw mut count)
        ),
        SUCCESS
    );
    list.truncate(count as usize);
    list
}

fn create_ci(
    nvml: &Nvml,
    gi: sys::nvmlGpuInstance_t,
    profile: u32,
) -> Result<sys::nvmlComputeInstance_t, u32> {
    let mut ci: sys::nvmlComputeInstance_t = std::ptr::null_mut();
    match call!(
        nvml,
        nvmlGpuInstanceCreateComputeInstance(gi, profile, &raw mut ci)
    ) {
        SUCCESS => Ok(ci),
        rc => Err(rc),
    }
}

fn ci_info(
    nvml: &Nvml,
    ci: sys::nvmlComputeInstance_t,
) -> Result<sys::nvmlComputeInstanceInfo_t, u32> {
    let mut info = sys::nvmlComputeInstanceInfo_t {
        device: std::ptr::null_mut(),
        gpuInstance: std::ptr::null_mut(),
        id: 0,
        profileId: 0,
        placement: sys::nvmlComputeInstancePlacement_t { start: 0, size: 0 },
    };
    match call!(nvml, nvmlComputeInstanceGetInfo_v2(ci, &raw mut info)) {
        SUCCESS => Ok(info),
        rc => Err(rc),
    }
}

#[test]
fn placements_follow_the_a100_table() {
    let fake = Fake::bundled("dgx-a100");
    let nvml = fake.nvml();
    let gpu = nvml.device_by_index(3).unwrap(); // MIG on, empty
    assert_eq!(
        placements(&nvml, &gpu, 19).unwrap(),
        (0..7).map(|s| (s, 1)).collect::<Vec<_>>()
    );
    assert_eq!(
        placements(&nvml, &gpu, 15).unwrap(),
        [(0, 2), (2, 2), (4, 2), (6, 2)]
    );
    assert_eq!(
        placements(&nvml, &gpu, 14).unwrap(),
        [(0, 2), (2, 2), (4, 2)]
    );
    assert_eq!(placements(&nvml, &gpu, 9).unwrap(), [(0, 4), (4, 4)]);
    assert_eq!(placements(&nvml, &gpu, 5).unwrap(), [(0, 4)]);
    assert_eq!(placements(&nvml, &gpu, 0).unwrap(), [(0, 8)]);
    assert_eq!(placements(&nvml, &gpu, 77), Err(INVALID_ARGUMENT));
    // a too-small array gets INSUFFICIENT_SIZE and the needed count
    let mut small = [sys::nvmlGpuInstancePlacement_t { start: 0, size: 0 }; 2];
    let mut count: c_uint = 2;
    assert_eq!(
        call!(
            nvml,
            nvmlDeviceGetGpuInstancePossiblePlacements_v2(
                handle(&gpu),
                19,
                small.as_mut_ptr(),
                &raw mut count
            )
        ),
        INSUFFICIENT_SIZE
    );
    assert_eq!(count, 7);
    let info = gpu
        .profile_info(sys::NVML_GPU_INSTANCE_PROFILE_1_SLICE_REV2)
        .unwrap();
    assert_eq!(
        (
            info.id,
            info.slice_count,
            info.instance_count,
            info.multiprocessor_count,
            info.memory_size_mb
        ),
        (15, 1, 4, 14, 19968)
    );
}

#[test]
fn overlapping_placements_fail_and_destroy_frees_them() {
    let fake = Fake::bundled("dgx-a100");
    let nvml = fake.nvml();
    let gpu = nvml.device_by_index(3).unwrap();
    let three = create_gi(&nvml, &gpu, 9, Some((4, 4))).unwrap();
    assert_eq!(placement_of(&nvml, three), (4, 4));
    assert_eq!(gi_info(&nvml, three).unwrap().profileId, 9);
    assert_eq!(
        create_gi(&nvml, &gpu, 14, Some((4, 2))),
        Err(INSUFFICIENT_RESOURCES)
    );
    assert_eq!(
        create_gi(&nvml, &gpu, 14, Some((6, 2))),
        Err(INVALID_ARGUMENT),
        "not a 2g placement"
    );
    assert_eq!(
        create_gi(&nvml, &gpu, 14, Some((0, 4))),
        Err(INVALID_ARGUMENT),
        "wrong size"
    );
    assert_eq!(remaining(&nvml, &gpu, 9), 1);
    assert_eq!(remaining(&nvml, &gpu, 19), 4);
    assert_eq!(remaining(&nvml, &gpu, 0), 0);
    // without a placement, 4g.40gb lands in the free lower half
    let four = create_gi(&nvml, &gpu, 5, None).unwrap();
    assert_eq!(placement_of(&nvml, four), (0, 4));
    assert_eq!(remaining(&nvml, &gpu, 19), 0);
    assert_eq!(
        create_gi(&nvml, &gpu, 19, None),
        Err(INSUFFICIENT_RESOURCES)
    );

    assert_eq!(call!(nvml, nvmlGpuInstanceDestroy(three)), SUCCESS);
    assert_eq!(
        gi_info(&nvml, three).err(),
        Some(INVALID_ARGUMENT),
        "stale handle"
    );
    assert_eq!(call!(nvml, nvmlGpuInstanceDestroy(three)), INVALID_ARGUMENT);
    let two = create_gi(&nvml, &gpu, 14, Some((4, 2))).unwrap();
    assert_eq!(placement_of(&nvml, two), (4, 2));
    assert_eq!(gpu_instances(&nvml, &gpu, 14).len(), 1);
    assert_eq!(gpu_instances(&nvml, &gpu, 5).len(), 1);
    assert_eq!(gpu_instances(&nvml, &gpu, 9).len(), 0);
    let id = gi_info(&nvml, two).unwrap().id;
    let mut found: sys::nvmlGpuInstance_t = std::ptr::null_mut();
    assert_eq!(
        call!(
            nvml,
            nvmlDeviceGetGpuInstanceById(handle(&gpu), id, &raw mut found)
        ),
        SUCCESS
    );
    assert_eq!(gi_info(&nvml, found).unwrap().placement.start, 4);
    assert_eq!(
        call!(
            nvml,
            nvmlDeviceGetGpuInstanceById(handle(&gpu), 14, &raw mut found)
        ),
        NOT_FOUND
    );
}

#[test]
fn instance_counts_are_enforced() {
    let fake = Fake::bundled("dgx-a100");
    let nvml = fake.nvml();
    let gpu = nvml.device_by_index(3).unwrap();
    for _ in 0..7 {
        create_gi(&nvml, &gpu, 19, None).unwrap();
    }
    assert_eq!(
        create_gi(&nvml, &gpu, 19, None),
        Err(INSUFFICIENT_RESOURCES)
    );
    let starts: Vec<u32> = gpu_instances(&nvml, &gpu, 19)
        .iter()
        .map(|gi| placement_of(&nvml, *gi).0)
        .collect();
    let mut sorted = starts.clone();
    sorted.sort_unstable();
    assert_eq!(sorted, [0, 1, 2, 3, 4, 5, 6]);
    // the media-extension profile: one instance at most
    let fake = Fake::bundled("mixed");
    let nvml = fake.nvml();
    let h100 = nvml.device_by_index(1).unwrap(); // MIG on, 3g.40gb at 0
    create_gi(&nvml, &h100, 20, Some((4, 1))).unwrap();
    assert_eq!(
        create_gi(&nvml, &h100, 20, Some((5, 1))),
        Err(INSUFFICIENT_RESOURCES)
    );
    assert_eq!(remaining(&nvml, &h100, 20), 0);
    assert_eq!(remaining(&nvml, &h100, 19), 2);
}

#[test]
fn a_gpu_instance_without_compute_instance_is_not_a_mig_device() {
    let fake = Fake::bundled("dgx-a100");
    let nvml = fake.nvml();
    let gpu = nvml.device_by_index(3).unwrap();
    let gi = create_gi(&nvml, &gpu, 9, None).unwrap();
    assert!(matches!(
        gpu.mig_device_by_index(0),
        Err(NvmlError::NotFound)
    ));

    // compute-instance profiles of a 3g.40gb
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
    assert_eq!(
        call!(
            nvml,
            nvmlGpuInstanceGetComputeInstanceProfileInfo(gi, 0, 0, &raw mut info)
        ),
        SUCCESS
    );
    assert_eq!(
        (
            info.sliceCount,
            info.instanceCount,
            info.multiprocessorCount,
            info.sharedCopyEngineCount
        ),
        (1, 3, 14, 3)
    );
    assert_eq!(
        call!(
            nvml,
            nvmlGpuInstanceGetComputeInstanceProfileInfo(gi, 2, 0, &raw mut info)
        ),
        SUCCESS
    );
    assert_eq!((info.id, info.multiprocessorCount), (2, 42));
    assert_eq!(
        call!(
            nvml,
            nvmlGpuInstanceGetComputeInstanceProfileInfo(gi, 4, 0, &raw mut info)
        ),
        NOT_SUPPORTED
    );
    assert_eq!(
        call!(
            nvml,
            nvmlGpuInstanceGetComputeInstanceProfileInfo(gi, 0, 1, &raw mut info)
        ),
        INVALID_ARGUMENT
    );

    let one = create_ci(&nvml, gi, 0).unwrap();
    let two = create_ci(&nvml, gi, 1).unwrap();
    assert_eq!(
        create_ci(&nvml, gi, 0),
        Err(INSUFFICIENT_RESOURCES),
        "all 3 slices used"
    );
    assert_eq!(create_ci(&nvml, gi, 2), Err(INSUFFICIENT_RESOURCES));
    let one_info = ci_info(&nvml, one).unwrap();
    let two_info = ci_info(&nvml, two).unwrap();
    assert_eq!((one_info.id, one_info.placement.start), (0, 0));
    assert_eq!(
        (
            two_info.id,
            two_info.placement.start,
            two_info.placement.size
        ),
        (1, 2, 2)
    );
    assert_eq!(two_info.gpuInstance, gi);
    assert_eq!(two_info.device, handle(&gpu));

    // two MIG devices now
    let mig = gpu.mig_device_by_index(0).unwrap();
    assert!(mig.mig_is_mig_device_handle().unwrap());
    let uuid = mig.uuid().unwrap();
    assert!(uuid.starts_with("MIG-") && uuid.len() == 40, "{uuid}");
    assert_eq!(mig.name().unwrap(), "NVIDIA A100-SXM4-80GB MIG 1c.3g.40gb");
    assert_eq!(mig.memory_info().unwrap().total, 40192 * 1024 * 1024);
    assert_eq!(
        mig.mig_parent_device().unwrap().uuid().unwrap(),
        gpu.uuid().unwrap()
    );
    let (mut gi_id, mut ci_id) = (99, 99);
    assert_eq!(
        call!(
            nvml,
            nvmlDeviceGetGpuInstanceId(handle(&mig), &raw mut gi_id)
        ),
        SUCCESS
    );
    assert_eq!(
        call!(
            nvml,
            nvmlDeviceGetComputeInstanceId(handle(&mig), &raw mut ci_id)
        ),
        SUCCESS
    );
    assert_eq!((gi_id, ci_id), (gi_info(&nvml, gi).unwrap().id, 0));
    assert_eq!(
        call!(
            nvml,
            nvmlDeviceGetGpuInstanceId(handle(&gpu), &raw mut gi_id)
        ),
        NOT_SUPPORTED
    );
    let mut attrs: sys::nvmlDeviceAttributes_t = empty_attributes();
    assert_eq!(
        call!(
            nvml,
            nvmlDeviceGetAttributes_v2(handle(&mig), &raw mut attrs)
        ),
        SUCCESS
    );
    assert_eq!(
        (
            attrs.multiprocessorCount,
            attrs.gpuInstanceSliceCount,
            attrs.computeInstanceSliceCount,
            attrs.memorySizeMB
        ),
        (14, 3, 1, 40192)
    );
    assert_eq!(
        nvml.device_by_uuid(uuid.as_str()).unwrap().name().unwrap(),
        mig.name().unwrap()
    );
    assert_eq!(
        gpu.mig_device_by_index(1).unwrap().name().unwrap(),
        "NVIDIA A100-SXM4-80GB MIG 2c.3g.40gb"
    );

    // teardown order is enforced
    assert_eq!(call!(nvml, nvmlGpuInstanceDestroy(gi)), IN_USE);
    assert_eq!(call!(nvml, nvmlComputeInstanceDestroy(one)), SUCCESS);
    assert_eq!(
        call!(nvml, nvmlComputeInstanceDestroy(one)),
        INVALID_ARGUMENT
    );
    assert_eq!(call!(nvml, nvmlComputeInstanceDestroy(two)), SUCCESS);
    assert_eq!(call!(nvml, nvmlGpuInstanceDestroy(gi)), SUCCESS);
    assert!(matches!(
        gpu.mig_device_by_index(0),
        Err(NvmlError::NotFound)
    ));
    assert!(matches!(
        nvml.device_by_uuid(uuid.as_str()),
        Err(NvmlError::NotFound)
    ));
    assert!(
        matches!(mig.uuid(), Err(NvmlError::InvalidArg)),
        "stale MIG handle"
    );
}

fn empty_attributes() -> sys::nvmlDeviceAttributes_t {
    sys::nvmlDeviceAttributes_t {
        multiprocessorCount: 0,
        sharedCopyEngineCount: 0,
        sharedDecoderCount: 0,
        sharedEncoderCount: 0,
        sharedJpegCount: 0,
        sharedOfaCount: 0,
        gpuInstanceSliceCount: 0,
        computeInstanceSliceCount: 0,
        memorySizeMB: 0,
    }
}

#[test]
fn mig_devices_of_the_profile_are_visible() {
    let fake = Fake::bundled("dgx-a100");
    let nvml = fake.nvml();
    let seven = nvml.device_by_index(1).unwrap();
    assert_eq!(seven.mig_device_count().unwrap(), 7);
    let mut uuids = Vec::new();
    for i in 0..7 {
        let mig = seven.mig_device_by_index(i).unwrap();
        assert_eq!(mig.memory_info().unwrap().total, 9728 * 1024 * 1024);
        assert_eq!(mig.name().unwrap(), "NVIDIA A100-SXM4-80GB MIG 1g.10gb");
        uuids.push(mig.uuid().unwrap());
    }
    uuids.sort();
    uuids.dedup();
    assert_eq!(uuids.len(), 7);
    assert!(matches!(
        seven.mig_device_by_index(7),
        Err(NvmlError::InvalidArg)
    ));

    // GPU 2: GI 2 = 3g.40gb at 4 (1c + 2c), GI 3 = 2g.20gb at 0, GI 4 = 1g.20gb
    // at 2 without CI; MIG devices enumerate by GI id, then CI id.
    let mixed = nvml.device_by_index(2).unwrap();
    let names: Vec<String> = (0..3)
        .map(|i| mixed.mig_device_by_index(i).unwrap().name().unwrap())
        .collect();
    assert_eq!(
        names,
        [
            "NVIDIA A100-SXM4-80GB MIG 1c.3g.40gb",
            "NVIDIA A100-SXM4-80GB MIG 2c.3g.40gb",
            "NVIDIA A100-SXM4-80GB MIG 2g.20gb",
        ]
    );
    assert!(matches!(
        mixed.mig_device_by_index(3),
        Err(NvmlError::NotFound)
    ));
    assert_eq!(
        gpu_instances(&nvml, &mixed, 15).len(),
        1,
        "the 1g.20gb GI without CI"
    );
}

#[test]
fn mig_disabled_gpu_refuses_instances_until_enabled() {
    let fake = Fake::bundled("dgx-h100");
    let nvml = fake.nvml();
    let gpu = nvml.device_by_index(0).unwrap();
    assert_eq!(create_gi(&nvml, &gpu, 19, None), Err(NOT_SUPPORTED));
    // Profile facts answer while MIG is off (dynamic MIG publishes them).
    assert_eq!(gpu.profile_info(0).unwrap().id, 19);
    assert_eq!(placements(&nvml, &gpu, 19).unwrap().len(), 7);
    let mut list = vec![std::ptr::null_mut(); 8];
    let mut count: c_uint = 0;
    assert_eq!(
        call!(
            nvml,
            nvmlDeviceGetGpuInstances(handle(&gpu), 19, list.as_mut_ptr(), &raw mut count)
        ),
        NOT_SUPPORTED,
        "instances need MIG mode on"
    );
    assert!(matches!(
        gpu.mig_device_by_index(0),
        Err(NvmlError::NotSupported)
    ));
    assert_eq!(
        gpu.mig_device_count().unwrap(),
        7,
        "capable even while disabled"
    );

    // Hopper: the mode changes at once
    assert_eq!(gpu.set_mig_mode(true).unwrap(), SUCCESS);
    let mode = gpu.mig_mode().unwrap();
    assert_eq!((mode.current, mode.pending), (1, 1));
    let info = gpu
        .profile_info(sys::NVML_GPU_INSTANCE_PROFILE_1_SLICE)
        .unwrap();
    assert_eq!(
        (info.id, info.multiprocessor_count, info.memory_size_mb),
        (19, 16, 9984)
    );
    let full = gpu
        .profile_info(sys::NVML_GPU_INSTANCE_PROFILE_7_SLICE)
        .unwrap();
    assert_eq!(
        (full.id, full.multiprocessor_count, full.copy_engine_count),
        (0, 132, 8)
    );
    assert!(matches!(
        gpu.profile_info(sys::NVML_GPU_INSTANCE_PROFILE_6_SLICE),
        Err(NvmlError::NotSupported)
    ));
    assert!(matches!(gpu.profile_info(99), Err(NvmlError::InvalidArg)));
    let gi = create_gi(&nvml, &gpu, 19, None).unwrap();
    assert!(matches!(gpu.set_mig_mode(false), Err(NvmlError::InUse)));
    assert_eq!(call!(nvml, nvmlGpuInstanceDestroy(gi)), SUCCESS);
    assert_eq!(gpu.set_mig_mode(false).unwrap(), SUCCESS);
    assert_eq!(gpu.mig_mode().unwrap().current, 0);
}

#[test]
fn ampere_mig_mode_change_waits_for_a_reset() {
    let fake = Fake::bundled("pcie-a100-bridged");
    let nvml = fake.nvml();
    let gpu = nvml.device_by_index(0).unwrap();
    assert_eq!(
        gpu.set_mig_mode(true).unwrap(),
        16,
        "NVML_ERROR_RESET_REQUIRED in activationStatus"
    );
    let mode = gpu.mig_mode().unwrap();
    assert_eq!((mode.current, mode.pending), (0, 1));
    assert_eq!(create_gi(&nvml, &gpu, 19, None), Err(NOT_SUPPORTED));
}

#[test]
fn gpus_without_mig_answer_not_supported() {
    let fake = Fake::bundled("t4-inference");
    let nvml = fake.nvml();
    let t4 = nvml.device_by_index(0).unwrap();
    assert_eq!(create_gi(&nvml, &t4, 19, None), Err(NOT_SUPPORTED));
    assert!(matches!(
        t4.set_mig_mode(true),
        Err(NvmlError::NotSupported)
    ));
    assert_eq!(placements(&nvml, &t4, 19), Err(NOT_SUPPORTED));
    let mut n: c_uint = 0;
    assert_eq!(
        call!(
            nvml,
            nvmlDeviceGetGpuInstanceRemainingCapacity(handle(&t4), 19, &raw mut n)
        ),
        NOT_SUPPORTED
    );
    let fake = Fake::bundled("mixed");
    let nvml = fake.nvml();
    let l4 = nvml.device_by_index(3).unwrap();
    assert!(matches!(l4.mig_mode(), Err(NvmlError::NotSupported)));
}

#[test]
fn versioned_profile_info_structs() {
    let fake = Fake::bundled("mixed");
    let nvml = fake.nvml();
    let h100 = nvml.device_by_index(1).unwrap();
    let mut v2: sys::nvmlGpuInstanceProfileInfo_v2_t = empty_v2();
    v2.version = (std::mem::size_of::<sys::nvmlGpuInstanceProfileInfo_v2_t>() as u32) | (2 << 24);
    assert_eq!(
        call!(
            nvml,
            nvmlDeviceGetGpuInstanceProfileInfoV(handle(&h100), 2, &raw mut v2)
        ),
        SUCCESS
    );
    let name = v2
        .name
        .iter()
        .take_while(|c| **c != 0)
        .map(|c| *c as u8 as char)
        .collect::<String>();
    assert_eq!(
        (
            v2.id,
            v2.multiprocessorCount,
            v2.memorySizeMB,
            name.as_str()
        ),
        (9, 60, 40448, "MIG 3g.40gb")
    );
    // v3 through the by-id variant
    let mut v3 = sys::nvmlGpuInstanceProfileInfo_v3_t {
        version: (std::mem::size_of::<sys::nvmlGpuInstanceProfileInfo_v3_t>() as u32) | (3 << 24),
        id: 0,
        sliceCount: 0,
        instanceCount: 0,
        multiprocessorCount: 0,
        copyEngineCount: 0,
        decoderCount: 0,
        encoderCount: 0,
        jpegCount: 0,
        ofaCount: 0,
        memorySizeMB: 0,
        name: [0; 96],
        capabilities: 7,
    };
    assert_eq!(
        call!(
            nvml,
            nvmlDeviceGetGpuInstanceProfileInfoByIdV(handle(&h100), 15, (&raw mut v3).cast())
        ),
        SUCCESS
    );
    assert_eq!(
        (
            v3.sliceCount,
            v3.instanceCount,
            v3.multiprocessorCount,
            v3.capabilities
        ),
        (1, 4, 26, 0)
    );
    let mut bad = empty_v2();
    bad.version = 1;
    assert_eq!(
        call!(
            nvml,
            nvmlDeviceGetGpuInstanceProfileInfoV(handle(&h100), 2, &raw mut bad)
        ),
        ARGUMENT_VERSION_MISMATCH
    );
}

fn empty_v2() -> sys::nvmlGpuInstanceProfileInfo_v2_t {
    sys::nvmlGpuInstanceProfileInfo_v2_t {
        version: 0,
        id: 0,
        isP2pSupported: 0,
        sliceCount: 0,
        instanceCount: 0,
        multiprocessorCount: 0,
        copyEngineCount: 0,
        decoderCount: 0,
        encoderCount: 0,
        jpegCount: 0,
        ofaCount: 0,
        memorySizeMB: 0,
        name: [0; 96],
    }
}
