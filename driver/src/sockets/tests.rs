use std::os::unix::fs::PermissionsExt;
use std::path::Path;

use super::*;

fn short_tempdir() -> tempfile::TempDir {
    tempfile::Builder::new()
        .prefix("s")
        .tempdir_in("/tmp")
        .unwrap()
}

fn mode(p: &Path) -> u32 {
    std::fs::metadata(p).unwrap().permissions().mode() & 0o7777
}

#[test]
fn path_length_limit_is_107_bytes() {
    let ok = format!("/{}", "a".repeat(106));
    assert_eq!(ok.len(), 107);
    check_path_len(Path::new(&ok)).unwrap();
    let long = format!("/{}", "a".repeat(107));
    let err = check_path_len(Path::new(&long)).unwrap_err();
    assert!(
        matches!(
            err,
            Error::SocketPathTooLong {
                len: 108,
                max: 107,
                ..
            }
        ),
        "{err}"
    );
    assert!(err.to_string().contains("108 bytes long"), "{err}");
}

#[test]
fn ensure_dir_creates_missing_ancestors_with_0750() {
    let t = short_tempdir();
    let deep = t.path().join("a/b/c");
    ensure_dir(&deep).unwrap();
    for d in ["a", "a/b", "a/b/c"] {
        assert_eq!(mode(&t.path().join(d)), 0o750, "{d}");
    }
    // Existing directories keep their mode.
    std::fs::set_permissions(t.path().join("a"), std::fs::Permissions::from_mode(0o755)).unwrap();
    ensure_dir(&deep).unwrap();
    assert_eq!(mode(&t.path().join("a")), 0o755);
}

#[test]
fn ensure_dir_refuses_a_file_in_the_way() {
    let t = short_tempdir();
    std::fs::write(t.path().join("f"), b"x").unwrap();
    let err = ensure_dir(&t.path().join("f/sub")).unwrap_err();
    assert!(matches!(err, Error::NotADirectory { .. }), "{err}");
}

#[test]
fn lock_is_exclusive_and_released_on_drop() {
    let t = short_tempdir();
    let sock = t.path().join("x.sock");
    let first = SocketLock::acquire(&sock).unwrap();
    assert_eq!(first.path(), t.path().join("x.sock.lock"));
    let err = SocketLock::acquire(&sock).unwrap_err();
    assert!(matches!(err, Error::Locked { .. }), "{err}");
    drop(first);
    crate::test_support::once_released(
        || SocketLock::acquire(&sock),
        |e| matches!(e, Error::Locked { .. }),
    )
    .unwrap();
}

#[tokio::test]
async fn clear_stale_removes_dead_sockets_and_refuses_live_ones() {
    let t = short_tempdir();
    let path = t.path().join("x.sock");
    // Nothing there.
    clear_stale(&path).await.unwrap();

    // A live listener is refused and left alone.
    let live = bind(&path).unwrap();
    let err = clear_stale(&path).await.unwrap_err();
    assert!(matches!(err, Error::SocketInUse { .. }), "{err}");
    assert!(path.exists());

    // Closed listener: the file stays behind, stale; it gets removed.
    drop(live);
    assert!(path.exists());
    clear_stale(&path).await.unwrap();
    assert!(!path.exists());
}

#[tokio::test]
async fn clear_stale_refuses_regular_files_and_symlinks() {
    let t = short_tempdir();
    let file = t.path().join("f.sock");
    std::fs::write(&file, b"precious").unwrap();
    let err = clear_stale(&file).await.unwrap_err();
    assert!(matches!(err, Error::NotASocket { .. }), "{err}");
    assert_eq!(std::fs::read(&file).unwrap(), b"precious");

    let link = t.path().join("l.sock");
    std::os::unix::fs::symlink(&file, &link).unwrap();
    let err = clear_stale(&link).await.unwrap_err();
    assert!(matches!(err, Error::NotASocket { .. }), "{err}");
    assert!(link.exists());
}

#[tokio::test]
async fn bind_sets_mode_0600() {
    let t = short_tempdir();
    let path = t.path().join("x.sock");
    let _l = bind(&path).unwrap();
    assert_eq!(mode(&path), 0o600);
}

#[tokio::test]
async fn bind_renames_the_listening_socket_into_place_and_leaves_no_staging_name() {
    let t = short_tempdir();
    let path = t.path().join("x-reg.sock");
    let staging = staging_path(&path).unwrap();
    assert_eq!(staging, t.path().join(".x-reg.sock.new"));
    // A crashed run's staging socket is in the way first.
    drop(std::os::unix::net::UnixListener::bind(&staging).unwrap());
    let listener = bind(&path).unwrap();
    assert!(!staging.exists());
    assert_eq!(mode(&path), 0o600);
    // The socket at `path` is the listening one.
    let _client = UnixStream::connect(&path).await.unwrap();
    let (_conn, _) = listener.accept().await.unwrap();
    let names: Vec<_> = std::fs::read_dir(t.path())
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(names, ["x-reg.sock"]);
}

#[tokio::test]
async fn a_socket_that_cannot_be_moved_into_place_leaves_nothing() {
    let t = short_tempdir();
    // A non-empty directory at the socket's path: the rename fails.
    let path = t.path().join("x.sock");
    std::fs::create_dir(&path).unwrap();
    std::fs::write(path.join("f"), b"").unwrap();
    let err = bind(&path).unwrap_err();
    assert!(matches!(err, Error::Place { .. }), "{err}");
    assert!(err.to_string().contains(".x.sock.new"), "{err}");
    assert!(!staging_path(&path).unwrap().exists());
    assert!(path.join("f").exists());
}

#[tokio::test]
async fn a_staging_name_too_long_for_a_socket_binds_at_the_path_itself() {
    let t = short_tempdir();
    // A directory whose child `a` makes a 107-byte path: `.a.new` would
    // make 112.
    let base = t.path().as_os_str().len();
    let dir = t.path().join("d".repeat(MAX_SOCKET_PATH - base - 3));
    std::fs::create_dir(&dir).unwrap();
    let path = dir.join("a");
    assert_eq!(path.as_os_str().len(), MAX_SOCKET_PATH);
    let listener = bind(&path).unwrap();
    assert_eq!(mode(&path), 0o600);
    let _client = UnixStream::connect(&path).await.unwrap();
    let (_conn, _) = listener.accept().await.unwrap();
}

#[test]
fn absolute_joins_relative_paths_with_the_cwd() {
    let p = absolute(Path::new("rel/dir")).unwrap();
    assert!(p.is_absolute());
    assert!(p.ends_with("rel/dir"));
}
