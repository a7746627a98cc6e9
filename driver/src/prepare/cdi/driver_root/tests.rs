use std::os::unix::fs::symlink;

use super::*;

const V: &str = "580.95.05";

/// A driver root laid out like a Debian/Ubuntu host with merged /usr.
fn fake_root() -> tempfile::TempDir {
    let tmp = tempfile::tempdir().unwrap();
    let r = tmp.path();
    let lib = r.join("usr/lib/x86_64-linux-gnu");
    fs::create_dir_all(&lib).unwrap();
    fs::create_dir_all(r.join("usr/bin")).unwrap();
    symlink("usr/lib", r.join("lib")).unwrap();
    symlink("usr/bin", r.join("bin")).unwrap();
    for name in [
        "libcuda.so",
        "libnvidia-ml.so",
        "libnvidia-ptxjitcompiler.so",
    ] {
        fs::write(lib.join(format!("{name}.{V}")), b"elf").unwrap();
        symlink(format!("{name}.{V}"), lib.join(format!("{name}.1"))).unwrap();
    }
    // The unversioned dev link is not mounted (the hook creates it).
    symlink("libcuda.so.1", lib.join("libcuda.so")).unwrap();
    fs::write(r.join("usr/bin/nvidia-smi"), b"bin").unwrap();
    // An absolute link, meant relative to the driver root.
    fs::write(r.join("usr/bin/nvidia-debugdump.real"), b"bin").unwrap();
    symlink(
        "/usr/bin/nvidia-debugdump.real",
        r.join("usr/bin/nvidia-debugdump"),
    )
    .unwrap();
    let fw = r.join(format!("usr/lib/firmware/nvidia/{V}"));
    fs::create_dir_all(&fw).unwrap();
    fs::write(fw.join("gsp_ga10x.bin"), b"fw").unwrap();
    fs::write(fw.join("README"), b"x").unwrap();
    tmp
}

fn paths(files: &DriverFiles, kind: DriverFileKind) -> Vec<(&str, &str)> {
    files
        .files
        .iter()
        .filter(|f| f.kind == kind)
        .map(|f| (f.container_path.as_str(), f.host_path.as_str()))
        .collect()
}

#[test]
fn finds_versioned_libs_links_binaries_and_firmware_with_host_paths() {
    let tmp = fake_root();
    let root = HostRoot::new(tmp.path(), "/run/nvidia/driver");
    let files = discover(&root).unwrap();
    let d = "/usr/lib/x86_64-linux-gnu";
    let h = "/run/nvidia/driver/usr/lib/x86_64-linux-gnu";
    let libs = paths(&files, DriverFileKind::Library);
    let expected: Vec<(String, String)> = [
        "libcuda.so",
        "libnvidia-ml.so",
        "libnvidia-ptxjitcompiler.so",
    ]
    .iter()
    .flat_map(|n| {
        [
            (format!("{d}/{n}.1"), format!("{h}/{n}.{V}")),
            (format!("{d}/{n}.{V}"), format!("{h}/{n}.{V}")),
        ]
    })
    .collect();
    let libs_owned: Vec<(String, String)> = libs
        .iter()
        .map(|(a, b)| ((*a).to_owned(), (*b).to_owned()))
        .collect();
    assert_eq!(libs_owned, expected);
    assert_eq!(
        paths(&files, DriverFileKind::Binary),
        [
            (
                "/usr/bin/nvidia-smi",
                "/run/nvidia/driver/usr/bin/nvidia-smi"
            ),
            (
                "/usr/bin/nvidia-debugdump",
                "/run/nvidia/driver/usr/bin/nvidia-debugdump.real"
            ),
        ]
    );
    let fw = format!("/usr/lib/firmware/nvidia/{V}/gsp_ga10x.bin");
    let fw_host = format!("/run/nvidia/driver{fw}");
    assert_eq!(
        paths(&files, DriverFileKind::Firmware),
        [(fw.as_str(), fw_host.as_str())]
    );
    assert_eq!(files.version.as_deref(), Some(V));
    assert_eq!(files.cdi_hook, None);
    assert_eq!(files.library_dirs(), [d]);
}

#[test]
fn the_hook_is_found_when_present() {
    let tmp = fake_root();
    fs::write(tmp.path().join(CDI_HOOK), b"hook").unwrap();
    let files = discover(&HostRoot::same(tmp.path())).unwrap();
    assert_eq!(
        files.cdi_hook.as_deref(),
        Some(tmp.path().join(CDI_HOOK).to_str().unwrap())
    );
}

#[test]
fn missing_required_library_is_a_precise_error() {
    let tmp = fake_root();
    let lib = tmp.path().join("usr/lib/x86_64-linux-gnu");
    fs::remove_file(lib.join(format!("libnvidia-ml.so.{V}"))).unwrap();
    // The soname link dangles now: it must not count as found.
    let err = discover(&HostRoot::same(tmp.path())).unwrap_err();
    let msg = err.to_string();
    assert!(
        matches!(&err, CdiError::RequiredLibraryMissing { pattern, .. } if pattern == "libnvidia-ml.so.*"),
        "{msg}"
    );
    assert!(msg.contains("usr/lib64"), "lists the searched dirs: {msg}");
    assert!(msg.contains(tmp.path().to_str().unwrap()), "{msg}");
}

#[test]
fn missing_optional_files_are_omitted() {
    let tmp = fake_root();
    let r = tmp.path();
    let lib = r.join("usr/lib/x86_64-linux-gnu");
    fs::remove_file(lib.join(format!("libnvidia-ptxjitcompiler.so.{V}"))).unwrap();
    fs::remove_file(lib.join("libnvidia-ptxjitcompiler.so.1")).unwrap();
    fs::remove_file(r.join("usr/bin/nvidia-smi")).unwrap();
    fs::remove_dir_all(r.join("usr/lib/firmware")).unwrap();
    let files = discover(&HostRoot::same(r)).unwrap();
    assert!(files.find("libnvidia-ptxjitcompiler.so.1").is_none());
    assert!(files.find("nvidia-smi").is_none());
    assert!(paths(&files, DriverFileKind::Firmware).is_empty());
    assert!(files.find("libcuda.so.1").is_some());
    assert_eq!(files.files.len(), 5, "{:?}", files.files);
}

/// `..` at the root stays at the root, as for a process whose root it is:
/// a link that climbs too far names a file in the root, never one outside.
#[test]
fn a_symlink_climbing_above_the_root_stays_in_it() {
    let tmp = fake_root();
    let r = tmp.path();
    let lib = r.join("usr/lib/x86_64-linux-gnu");
    fs::write(lib.join(format!("libnvidia-cfg.so.{V}")), b"elf").unwrap();
    symlink(
        format!("../../../../../../../usr/lib/x86_64-linux-gnu/libnvidia-cfg.so.{V}"),
        lib.join("libnvidia-cfg.so.1"),
    )
    .unwrap();
    // Outside the root: this one names `<root>/etc/passwd`, which the root
    // does not have, so it is a dangling link and left out.
    symlink(
        "../../../../../../../etc/passwd",
        lib.join("libnvidia-gpucomp.so.1"),
    )
    .unwrap();
    assert_eq!(
        resolve_in_root(
            r,
            Path::new("usr/lib/x86_64-linux-gnu/libnvidia-gpucomp.so.1")
        )
        .unwrap(),
        Path::new("etc/passwd")
    );
    let files = discover(&HostRoot::same(r)).unwrap();
    let cfg = files
        .find("libnvidia-cfg.so.1")
        .expect("the climbing link is mounted");
    assert_eq!(
        Path::new(&cfg.host_path),
        lib.join(format!("libnvidia-cfg.so.{V}"))
    );
    assert!(files.find("libnvidia-gpucomp.so.1").is_none());
    assert!(
        files
            .files
            .iter()
            .all(|f| Path::new(&f.host_path).starts_with(r))
    );
}

#[test]
fn symlink_loops_are_refused() {
    let tmp = fake_root();
    let lib = tmp.path().join("usr/lib/x86_64-linux-gnu");
    symlink("libnvidia-cfg.so.2", lib.join("libnvidia-cfg.so.1")).unwrap();
    symlink("libnvidia-cfg.so.1", lib.join("libnvidia-cfg.so.2")).unwrap();
    let err = discover(&HostRoot::same(tmp.path())).unwrap_err();
    assert!(matches!(err, CdiError::SymlinkLoop { .. }), "{err}");
}

#[test]
fn resolution_stays_in_the_root() {
    let tmp = fake_root();
    let r = tmp.path();
    assert_eq!(
        resolve_in_root(r, Path::new("lib/x86_64-linux-gnu/libcuda.so")).unwrap(),
        Path::new(&format!("usr/lib/x86_64-linux-gnu/libcuda.so.{V}"))
    );
    // Absolute and `..` targets that stay inside are fine.
    symlink("/usr/bin/../lib/x86_64-linux-gnu", r.join("libdir")).unwrap();
    assert_eq!(
        resolve_in_root(r, Path::new("libdir")).unwrap(),
        Path::new("usr/lib/x86_64-linux-gnu")
    );
    // `..` at the root is the root.
    assert_eq!(
        resolve_in_root(r, Path::new("../x")).unwrap(),
        Path::new("x")
    );
    assert_eq!(
        resolve_in_root(r, Path::new("does/not/exist")).unwrap(),
        Path::new("does/not/exist")
    );
}

#[test]
fn a_missing_driver_root_reports_the_required_library() {
    let tmp = tempfile::tempdir().unwrap();
    let err = discover(&HostRoot::same(tmp.path().join("none"))).unwrap_err();
    assert!(
        matches!(&err, CdiError::RequiredLibraryMissing { pattern, .. } if pattern == "libcuda.so.*"),
        "{err}"
    );
}
