//! Checks of the absolute host paths the flags take (paths the container
//! runtime, or two pods, reach the same file by), shared by the plugin's
//! flags and the MPS daemon host's.

use std::path::{Component, Path, PathBuf};

/// `s` as a path, if it is absolute (else an error saying `why` it must
/// be) and has no `..`.
pub(crate) fn absolute_without_dotdot<'s>(s: &'s str, why: &str) -> Result<&'s Path, String> {
    let path = Path::new(s);
    if !path.is_absolute() {
        return Err(format!("{s:?} is not an absolute path ({why})"));
    }
    if path.components().any(|c| c == Component::ParentDir) {
        return Err(format!("{s:?} contains `..`; give the path itself"));
    }
    Ok(path)
}

/// An absolute path without `..` that fits a UNIX socket's `sun_path`.
pub(crate) fn parse_socket_path(s: &str) -> Result<PathBuf, String> {
    let path = absolute_without_dotdot(s, "both pods reach the socket by this path")?;
    if s.ends_with('/') || path.file_name().is_none() {
        return Err(format!("{s:?} names a directory, not a socket"));
    }
    crate::sockets::check_path_len(path).map_err(|e| e.to_string())?;
    Ok(path.to_path_buf())
}
