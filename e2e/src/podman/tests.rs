use std::fs;
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use super::detect::{find_program, is_static_elf, parse_effective_uid};
use super::exec::{Bounded, run_bounded};
use super::image::{
    SETUP_PREFIX, build_rootfs, remove_stale_setups, stale_setup_pid, storage_conf, toml_string,
};
use super::*;

/// A podman whose programs do not exist: anything reaching setup fails.
fn unusable() -> Podman {
    let none = PathBuf::from("/nonexistent/gpu-dra-e2e");
    Podman {
        tools: Tools {
            podman: none.join("podman"),
            runc: none.join("runc"),
            conmon: none.join("conmon"),
            busybox: none.join("busybox"),
            tar: none.join("tar"),
        },
        timeout: DEFAULT_TIMEOUT,
        setup: OnceLock::new(),
    }
}

#[test]
fn qualified_cdi_ids_are_accepted() {
    for id in [
        "k8s.gpu.nvidia.com/claim=0f8e6a1c-3b9d-4e57-a1c2-9d8f7e6b5a43-gpu-0",
        "example.com/tt=d",
        "nvidia.com/gpu=all",
        "vendor_x/class.y=a:b_c.d",
    ] {
        validate_cdi_id(id).unwrap_or_else(|e| panic!("{id}: {e}"));
    }
}

#[test]
fn malformed_and_hostile_cdi_ids_are_refused() {
    for (id, why) in [
        ("", "no '='"),
        ("/dev/sda", "no '='"),
        ("/dev/sda:/dev/xvda:rwm", "no '='"),
        ("--privileged", "no '='"),
        ("vendor.com/class", "no '='"),
        ("vendor.com=x", "no '/' in the kind"),
        ("/class=x", "vendor must have at least 2 characters"),
        ("v/class=x", "vendor must have at least 2 characters"),
        ("vendor.com/=x", "class must have at least 2 characters"),
        // podman 4.3 panics on this one.
        ("a.com/b=c", "class must have at least 2 characters"),
        ("vendor.com/class=", "empty device name"),
        ("-v/class=x", "vendor must start with a letter"),
        ("1vendor/class=x", "vendor must start with a letter"),
        ("../x/class=x", "vendor must start with a letter"),
        ("vendor./class=x", "vendor must end with a letter or digit"),
        ("ven dor/class=x", "vendor may only hold"),
        ("vendor/.class=x", "class must start with a letter"),
        ("vendor/class-=x", "class must end with a letter or digit"),
        ("vendor/cl/ass=x", "class may only hold"),
        ("vendor/class=../../etc", "device name must start and end"),
        ("vendor/class=x-", "device name must start and end"),
        ("vendor/class=x y", "device name may only hold"),
        ("vendor/class=x;rm -rf /;x", "device name may only hold"),
        ("vendor/class=gpu\n0", "device name may only hold"),
        ("vendor/class=gpü0", "device name may only hold"),
    ] {
        let err = validate_cdi_id(id).expect_err(id).to_string();
        assert!(err.contains(why), "{id:?}: {err}");
        assert!(err.contains(&format!("{id:?}")), "{id:?}: {err}");
    }
}

#[test]
fn run_refuses_bad_input_before_touching_podman() {
    let podman = unusable();
    let err = podman.run(&["/dev/sda"], &["true"]).unwrap_err();
    assert!(
        matches!(&err, PodmanError::InvalidCdiId { id, .. } if id == "/dev/sda"),
        "{err}"
    );
    let err = podman.run(&["ab.com/cd=e"], &[]).unwrap_err();
    assert!(matches!(err, PodmanError::EmptyCommand), "{err}");
    // A valid call reaches setup, which names the missing program.
    let err = podman
        .run(&["ab.com/cd=e"], &["true"])
        .unwrap_err()
        .to_string();
    assert!(err.contains("/nonexistent/gpu-dra-e2e/busybox"), "{err}");
}

#[test]
fn unavailable_lists_every_reason() {
    let err = PodmanError::Unavailable {
        reasons: vec!["`podman` not found".into(), "not running as root".into()],
    };
    assert_eq!(
        err.to_string(),
        "podman cannot run here: `podman` not found; not running as root"
    );
}

#[test]
fn effective_uid_is_the_second_uid_field() {
    let status = "Name:\tx\nUid:\t1000\t0\t0\t0\nGid:\t1000\t1000\t1000\t1000\n";
    assert_eq!(parse_effective_uid(status).unwrap(), 0);
    assert_eq!(
        parse_effective_uid("Uid:\t0\t1000\t1000\t1000\n").unwrap(),
        1000
    );
    for (text, why) in [
        ("Name:\tx\n", "no Uid: line"),
        ("Uid:\t0\n", "no effective uid"),
        ("Uid:\t0\tabc\t0\t0\n", "\"abc\" is not a number"),
        ("Uid:\t0\t-1\t0\t0\n", "\"-1\" is not a number"),
    ] {
        let err = parse_effective_uid(text).unwrap_err();
        assert!(err.contains(why), "{text:?}: {err}");
    }
    // This process has one.
    detect::effective_uid().unwrap();
}

/// A 64-bit little-endian ELF header with `types` as its program headers.
fn elf(types: &[u32]) -> Vec<u8> {
    let mut b = vec![0u8; 64];
    b[..4].copy_from_slice(b"\x7fELF");
    b[4] = 2;
    b[5] = 1;
    b[0x20..0x28].copy_from_slice(&64u64.to_le_bytes());
    b[0x36..0x38].copy_from_slice(&56u16.to_le_bytes());
    b[0x38..0x3a].copy_from_slice(&(types.len() as u16).to_le_bytes());
    for t in types {
        let mut ph = vec![0u8; 56];
        ph[..4].copy_from_slice(&t.to_le_bytes());
        b.extend(ph);
    }
    b
}

#[test]
fn static_elf_detection() {
    assert!(is_static_elf(&elf(&[1, 1, 4])).unwrap());
    assert!(!is_static_elf(&elf(&[6, 3, 1])).unwrap());
    assert!(is_static_elf(&elf(&[])).unwrap());
    for (bytes, why) in [
        (b"#!/bin/sh\n".to_vec(), "not an ELF file"),
        (Vec::new(), "not an ELF file"),
        (b"\x7fELF\x01\x01".to_vec(), "not a 64-bit little-endian"),
        (b"\x7fELF\x02\x01\0\0".to_vec(), "truncated ELF header"),
    ] {
        let err = is_static_elf(&bytes).unwrap_err();
        assert!(err.contains(why), "{bytes:?}: {err}");
    }
    // Program headers said to lie past the end of the file.
    let mut cut = elf(&[1, 3]);
    cut.truncate(64 + 56 + 2);
    let err = is_static_elf(&cut).unwrap_err();
    assert!(err.contains("past the end"), "{err}");
    // A hostile offset does not overflow.
    let mut huge = elf(&[1]);
    huge[0x20..0x28].copy_from_slice(&u64::MAX.to_le_bytes());
    assert!(is_static_elf(&huge).is_err());
    let mut tiny = elf(&[1]);
    tiny[0x36..0x38].copy_from_slice(&2u16.to_le_bytes());
    assert!(is_static_elf(&tiny).unwrap_err().contains("2 bytes"));
}

#[test]
fn real_binaries_are_classified() {
    // Debian's /bin/sh (dash) is dynamically linked.
    let sh = fs::read("/bin/sh").unwrap();
    assert!(!is_static_elf(&sh).unwrap());
    assert!(find_program("sh").is_some());
    assert!(find_program("gpu-dra-no-such-program").is_none());
}

#[test]
fn spec_file_is_written_whole_and_removed_on_drop() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("cdi");
    let a = CdiSpecFile::write_in(&dir, "{\"a\":1}").unwrap();
    let b = CdiSpecFile::write_in(&dir, "{\"b\":2}").unwrap();
    assert_ne!(a.path(), b.path());
    assert_eq!(fs::read_to_string(a.path()).unwrap(), "{\"a\":1}");
    assert_eq!(a.path().extension().unwrap(), "json");
    let names: Vec<String> = fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert_eq!(names.len(), 2, "{names:?}");
    assert!(
        names.iter().all(|n| n.starts_with("gpu-dra-e2e-")),
        "{names:?}"
    );
    let a_path = a.path().to_path_buf();
    drop(a);
    assert!(!a_path.exists());
    assert!(b.path().exists());

    // Adopted files are removed too; one already gone is fine.
    let other = dir.join("k8s.gpu.nvidia.com-claim_x.json");
    fs::write(&other, "{}").unwrap();
    drop(CdiSpecFile::adopt(&other));
    assert!(!other.exists());
    drop(CdiSpecFile::adopt(&other));

    // A directory that cannot be made: the error names the path, nothing is left.
    let file = tmp.path().join("file");
    fs::write(&file, "").unwrap();
    let err = CdiSpecFile::write_in(&file.join("cdi"), "{}")
        .unwrap_err()
        .to_string();
    assert!(err.contains("file/cdi"), "{err}");
}

#[test]
fn storage_conf_points_into_the_state_dir() {
    let conf = storage_conf(Path::new("/tmp/gpu-dra-podman-x"));
    assert_eq!(
        conf,
        "[storage]\ndriver = \"vfs\"\ngraphroot = \"/tmp/gpu-dra-podman-x/storage\"\nrunroot = \"/tmp/gpu-dra-podman-x/run\"\n"
    );
}

#[test]
fn toml_strings_are_escaped() {
    assert_eq!(toml_string("/tmp/a b"), "\"/tmp/a b\"");
    assert_eq!(
        toml_string("/tmp/q\"x\\y\nz\u{7f}"),
        "\"/tmp/q\\\"x\\\\y\\u000Az\\u007F\""
    );
}

#[test]
fn setup_dir_names_give_their_pid() {
    assert_eq!(stale_setup_pid("gpu-dra-podman-1234-AbC9x"), Some(1234));
    for name in [
        "gpu-dra-podman-",
        "gpu-dra-podman-1234",
        "gpu-dra-podman-1234-",
        "gpu-dra-podman--x",
        "gpu-dra-podman-+12-x",
        "gpu-dra-podman-99999999999-x",
        "gpu-dra-podman-12a-x",
        "other-1234-x",
    ] {
        assert_eq!(stale_setup_pid(name), None, "{name}");
    }
}

#[test]
fn stale_setups_of_gone_processes_are_removed() {
    // pid_max is at most 2^22: this pid never runs.
    let gone = std::env::temp_dir().join(format!(
        "{SETUP_PREFIX}4294967295-test{}",
        std::process::id()
    ));
    fs::create_dir_all(gone.join("storage/vfs")).unwrap();
    // Ours (this process runs) stays.
    let ours = tempfile::Builder::new()
        .prefix(&format!("{SETUP_PREFIX}{}-", std::process::id()))
        .tempdir()
        .unwrap();
    remove_stale_setups();
    assert!(!gone.exists());
    assert!(ours.path().exists());
}

#[test]
fn rootfs_holds_busybox_and_its_applets() {
    let Some(busybox) = ["/bin/busybox", "/usr/bin/busybox"]
        .iter()
        .map(Path::new)
        .find(|p| p.exists())
    else {
        eprintln!("!!!!!!!! SKIPPED rootfs_holds_busybox_and_its_applets: no busybox installed");
        return;
    };
    let tmp = tempfile::tempdir().unwrap();
    let rootfs = tmp.path().join("rootfs");
    build_rootfs(busybox, &rootfs).unwrap();
    assert_eq!(
        fs::read(rootfs.join("bin/busybox")).unwrap(),
        fs::read(busybox).unwrap()
    );
    for applet in ["sh", "env", "cat", "stat", "ls"] {
        assert_eq!(
            fs::read_link(rootfs.join("bin").join(applet)).unwrap(),
            Path::new("busybox"),
            "{applet}"
        );
    }
    // A directory that exists already as a file: a clear error.
    let bad = tmp.path().join("bad");
    fs::create_dir_all(&bad).unwrap();
    fs::write(bad.join("bin"), "").unwrap();
    let err = build_rootfs(busybox, &bad).unwrap_err().to_string();
    assert!(err.contains("bad/bin"), "{err}");
}

#[test]
fn bounded_commands_capture_and_time_out() {
    let mut cmd = Command::new("sh");
    cmd.args(["-c", "echo out; echo err >&2; exit 3"]);
    let Bounded::Finished(done) = run_bounded(&mut cmd, Duration::from_secs(30)).unwrap() else {
        panic!("timed out");
    };
    assert_eq!(done.status.code(), Some(3));
    assert_eq!(done.stdout, b"out\n");
    assert_eq!(done.stderr, b"err\n");

    let start = Instant::now();
    let mut cmd = Command::new("sleep");
    cmd.arg("30");
    assert!(matches!(
        run_bounded(&mut cmd, Duration::from_millis(100)).unwrap(),
        Bounded::TimedOut
    ));
    assert!(start.elapsed() < Duration::from_secs(20));

    let err = run_bounded(
        &mut Command::new("/nonexistent/gpu-dra-e2e/prog"),
        Duration::from_secs(1),
    )
    .unwrap_err()
    .to_string();
    assert!(
        err.contains("cannot start /nonexistent/gpu-dra-e2e/prog"),
        "{err}"
    );
}

// ---- with a real podman (skipped loudly where it cannot run) ----

#[test]
fn podman_runs_busybox_and_reports_the_exit_status() {
    let Some(podman) =
        Podman::detect_or_skip("podman_runs_busybox_and_reports_the_exit_status").unwrap()
    else {
        return;
    };
    let out = podman
        .run::<&str>(&[], &["sh", "-c", "echo out; echo err >&2; exit 7"])
        .unwrap();
    eprintln!("podman run (no devices): {:?}", out.elapsed);
    assert_eq!(out.status.code(), Some(7), "{out:?}");
    assert_eq!(out.stdout, "out\n");
    assert!(out.stderr.contains("err"), "{out:?}");
    let err = out.into_success().unwrap_err().to_string();
    assert!(err.contains("container failed"), "{err}");

    // Another podman of the process shares the setup (one import).
    let again = Podman::detect().unwrap();
    assert_eq!(podman.state_dir().unwrap(), again.state_dir().unwrap());
    let out = again.run::<&str>(&[], &["cat", "/etc/passwd"]).unwrap();
    assert!(
        out.into_success()
            .unwrap()
            .stdout
            .starts_with("root:x:0:0:")
    );
}

#[test]
fn podman_applies_cdi_spec_edits() {
    let Some(podman) = Podman::detect_or_skip("podman_applies_cdi_spec_edits").unwrap() else {
        return;
    };
    let tmp = tempfile::tempdir().unwrap();
    let lib = tmp.path().join("libdemo.so.1.2");
    fs::write(&lib, "demo library\n").unwrap();
    let kind = format!("e2e.gpu-dra.test/p{}", std::process::id());
    let spec = serde_json::json!({
        "cdiVersion": "0.5.0",
        "kind": kind,
        "devices": [{
            "name": "dev0",
            "containerEdits": {
                "env": ["DEMO_DEVICE=dev0"],
                "deviceNodes": [{"path": "/dev/demo0", "hostPath": "/dev/null"}]
            }
        }],
        "containerEdits": {
            "env": ["DEMO_COMMON=yes"],
            "mounts": [{
                "hostPath": lib.to_str().unwrap(),
                "containerPath": "/usr/lib/demo/libdemo.so.1",
                "options": ["ro", "nosuid", "nodev", "rbind", "rprivate"]
            }]
        }
    });
    let _spec = CdiSpecFile::write(&spec.to_string()).unwrap();
    let out = podman
        .run(
            &[format!("{kind}=dev0")],
            &[
                "sh",
                "-c",
                "echo \"env $DEMO_DEVICE $DEMO_COMMON\"; stat -c 'node %F %t:%T' /dev/demo0; \
                 cat /usr/lib/demo/libdemo.so.1; \
                 if echo x >> /usr/lib/demo/libdemo.so.1; then echo writable; else echo read-only; fi",
            ],
        )
        .unwrap();
    eprintln!("podman run (CDI device): {:?}", out.elapsed);
    let out = out.into_success().unwrap();
    assert_eq!(
        out.stdout, "env dev0 yes\nnode character special file 1:3\ndemo library\nread-only\n",
        "{out:?}"
    );
}

#[test]
fn podman_refuses_an_unknown_cdi_id() {
    let Some(podman) = Podman::detect_or_skip("podman_refuses_an_unknown_cdi_id").unwrap() else {
        return;
    };
    let id = format!("e2e.gpu-dra.test/none{}=dev0", std::process::id());
    let out = podman.run(&[&id], &["true"]).unwrap();
    assert!(!out.success(), "{out:?}");
    assert!(out.stderr.contains(&id), "{out:?}");
}

#[test]
fn podman_run_past_its_deadline_is_killed_and_removed() {
    let Some(podman) =
        Podman::detect_or_skip("podman_run_past_its_deadline_is_killed_and_removed").unwrap()
    else {
        return;
    };
    let podman = podman.with_timeout(Duration::from_secs(2));
    let err = podman.run::<&str>(&[], &["sleep", "60"]).unwrap_err();
    let PodmanError::Timeout { what, .. } = &err else {
        panic!("{err}");
    };
    let name = what.strip_prefix("podman run ").unwrap();
    let mut ps = podman.command().unwrap();
    let ps = ps
        .args(["ps", "--all", "--format", "{{.Names}}"])
        .output()
        .unwrap();
    assert!(ps.status.success(), "{ps:?}");
    let names = String::from_utf8_lossy(&ps.stdout);
    assert!(!names.lines().any(|n| n == name), "{name} left: {names}");
}
