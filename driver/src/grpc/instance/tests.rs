use std::os::unix::net::UnixListener as StdListener;

use super::*;

#[test]
fn tags_are_eight_hex_digits_and_differ() {
    let a = new_tag();
    let b = new_tag();
    assert!(is_tag(&a), "{a}");
    assert!(is_tag(&b), "{b}");
    assert_ne!(a, b);
    for bad in [
        "",
        "0123456",
        "012345678",
        "0123456G",
        "ABCDEF12",
        "../../x",
    ] {
        assert!(!is_tag(bad), "{bad:?}");
    }
}

#[test]
fn names_with_and_without_a_tag() {
    assert_eq!(dra_socket_name(None), "dra.sock");
    assert_eq!(dra_socket_name(Some("0a1b2c3d")), "dra-0a1b2c3d.sock");
    assert_eq!(
        registration_socket_name("gpu.nvidia.com", None),
        "gpu.nvidia.com-reg.sock"
    );
    assert_eq!(
        registration_socket_name("gpu.nvidia.com", Some("0a1b2c3d")),
        "gpu.nvidia.com-0a1b2c3d-reg.sock"
    );
}

#[test]
fn only_well_formed_tagged_names_carry_a_tag() {
    assert_eq!(tag_of("dra-0a1b2c3d.sock"), Some("0a1b2c3d"));
    assert_eq!(tag_of("dra-0a1b2c3d.sock.lock"), Some("0a1b2c3d"));
    for other in [
        "dra.sock",
        "dra.sock.lock",
        "dra-.sock",
        "dra-0A1B2C3D.sock",
        "dra-0a1b2c3d0.sock",
        "dra-0a1b2c3d.sock.new",
        ".dra-0a1b2c3d.sock.new",
        "serving.sock",
        "dra-../../etc.sock",
    ] {
        assert_eq!(tag_of(other), None, "{other}");
    }
}

#[test]
fn a_long_driver_name_does_not_fit_with_a_tag() {
    let config = |driver: &str, tag: Option<&str>| {
        crate::grpc::Config::new(
            driver,
            "/var/lib/kubelet/plugins_registry",
            "/var/lib/kubelet/plugins",
        )
        .with_instance(tag.map(str::to_owned))
    };
    assert!(config("gpu.nvidia.com", Some("0a1b2c3d")).fits());
    // 34 bytes of directory, the name, 18 bytes of `-<tag>-reg.sock`: 107.
    let longest = format!("{}.example.com", "a".repeat(55 - ".example.com".len()));
    assert_eq!(longest.len(), 55);
    assert!(config(&longest, Some("0a1b2c3d")).fits());
    let longer = format!("a{longest}");
    assert!(!config(&longer, Some("0a1b2c3d")).fits());
    assert!(config(&longer, None).fits());
}

#[test]
fn forward_targets_never_include_the_own_socket() {
    let dir = Path::new("/p/gpu.nvidia.com");
    assert_eq!(
        forward_targets(dir, &dir.join("dra-0a1b2c3d.sock")),
        [dir.join("serving.sock"), dir.join("dra.sock")]
    );
    assert_eq!(
        forward_targets(dir, &dir.join("dra.sock")),
        [dir.join("serving.sock")]
    );
}

#[test]
fn the_serving_link_is_replaced_atomically_and_removed_only_by_its_target() {
    let dir = tempfile::tempdir().unwrap();
    let a = dir.path().join("dra-aaaaaaaa.sock");
    let b = dir.path().join("dra-bbbbbbbb.sock");
    point_serving_link(dir.path(), &a).unwrap();
    point_serving_link(dir.path(), &b).unwrap();
    let link = dir.path().join(SERVING_LINK);
    assert_eq!(std::fs::read_link(&link).unwrap(), b);
    assert!(!dir.path().join(".serving.sock.new").exists());
    remove_serving_link(dir.path(), &a);
    assert_eq!(
        std::fs::read_link(&link).unwrap(),
        b,
        "a's removal left b's link"
    );
    remove_serving_link(dir.path(), &b);
    assert!(std::fs::symlink_metadata(&link).is_err());
}

#[tokio::test]
async fn only_instances_that_are_gone_are_cleared() {
    let dir = tempfile::Builder::new()
        .prefix("g")
        .tempdir_in("/tmp")
        .unwrap();
    let dra = dir.path().join("plugins");
    let reg = dir.path().join("reg");
    std::fs::create_dir_all(&dra).unwrap();
    std::fs::create_dir_all(&reg).unwrap();
    let driver = "gpu.nvidia.com";
    let files = |tag: &str| {
        let sock = dra.join(dra_socket_name(Some(tag)));
        (
            sock.clone(),
            reg.join(registration_socket_name(driver, Some(tag))),
            sockets::lock_path(&sock),
        )
    };
    // Live, with its lock held: kept.
    let (live_dra, live_reg, live_lock) = files("11111111");
    let _live = (
        StdListener::bind(&live_dra).unwrap(),
        StdListener::bind(&live_reg).unwrap(),
        sockets::SocketLock::acquire(&live_dra).unwrap(),
    );
    // Dead, lock file free: removed.
    let (dead_dra, dead_reg, dead_lock) = files("22222222");
    drop(StdListener::bind(&dead_dra).unwrap());
    drop(StdListener::bind(&dead_reg).unwrap());
    std::fs::write(&dead_lock, b"").unwrap();
    // No lock file, nobody listening: removed by the connect probe.
    let (bare_dra, bare_reg, _) = files("33333333");
    drop(StdListener::bind(&bare_dra).unwrap());
    drop(StdListener::bind(&bare_reg).unwrap());
    // No lock file but listening: kept.
    let (alive_dra, _, _) = files("44444444");
    let _alive = StdListener::bind(&alive_dra).unwrap();
    // A regular file with a tagged name: never removed.
    let (plain, _, _) = files("55555555");
    std::fs::write(&plain, b"not a socket").unwrap();
    // Our own, even with a free lock: left alone.
    let (own_dra, _, own_lock) = files("66666666");
    drop(StdListener::bind(&own_dra).unwrap());
    std::fs::write(&own_lock, b"").unwrap();

    let removed = clear_dead(&dra, &reg, driver, Some("66666666")).await;
    assert_eq!(removed, ["22222222", "33333333"]);
    for gone in [&dead_dra, &dead_reg, &dead_lock, &bare_dra, &bare_reg] {
        assert!(!gone.exists(), "{} is left", gone.display());
    }
    for kept in [
        &live_dra, &live_reg, &live_lock, &alive_dra, &plain, &own_dra, &own_lock,
    ] {
        assert!(kept.exists(), "{} was removed", kept.display());
    }
}

#[tokio::test]
async fn a_missing_directory_clears_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("nope");
    assert!(
        clear_dead(&missing, &missing, "gpu.nvidia.com", None)
            .await
            .is_empty()
    );
}
