//! Reading the small files claim preparation depends on (the checkpoint and
//! its ledger, an MPS daemon's settings record, the driver's capability
//! files and `/proc/devices`) with a size cap, so that a damaged or hostile
//! file is refused by its size instead of being read into memory whole.

use std::fs::OpenOptions;
use std::io::{self, ErrorKind, Read};
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;

/// What reading a file with a cap found.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Capped {
    /// The file does not exist.
    Missing,
    /// The file has this many bytes (or at least this many, if it grew
    /// while it was read), more than the cap: nothing of it was kept.
    TooLarge(u64),
    /// The whole file.
    Bytes(Vec<u8>),
}

/// Reads `path` whole if it has at most `max` bytes. A file over the cap by
/// its size is refused without reading it; one that grows past the cap
/// while it is read is refused after `max + 1` bytes. Anything but a
/// regular file (a directory, a FIFO, a device) is an error: it is opened
/// without blocking, so a FIFO put in a file's place cannot hang the read.
pub(crate) fn read_capped(path: &Path, max: u64) -> io::Result<Capped> {
    let file = match OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK)
        .open(path)
    {
        Ok(file) => file,
        Err(e) if e.kind() == ErrorKind::NotFound => return Ok(Capped::Missing),
        Err(e) => return Err(e),
    };
    let meta = file.metadata()?;
    if !meta.is_file() {
        return Err(io::Error::new(
            ErrorKind::InvalidInput,
            "not a regular file",
        ));
    }
    let len = meta.len();
    if len > max {
        return Ok(Capped::TooLarge(len));
    }
    // `len` is at most `max`, so no hostile size reaches the allocation
    // (files in `/proc` say 0 and are read as they come).
    let mut bytes = Vec::with_capacity(usize::try_from(len).unwrap_or(0));
    file.take(max.saturating_add(1)).read_to_end(&mut bytes)?;
    if bytes.len() as u64 > max {
        return Ok(Capped::TooLarge(bytes.len() as u64));
    }
    Ok(Capped::Bytes(bytes))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_file_at_the_cap_is_read_and_one_byte_more_is_refused_by_its_size() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("f");
        std::fs::write(&path, b"12345").unwrap();
        assert_eq!(
            read_capped(&path, 5).unwrap(),
            Capped::Bytes(b"12345".to_vec())
        );
        assert_eq!(read_capped(&path, 4).unwrap(), Capped::TooLarge(5));
    }

    #[test]
    fn a_missing_file_is_missing_and_a_directory_is_an_error() {
        let dir = tempfile::tempdir().unwrap();
        assert_eq!(
            read_capped(&dir.path().join("none"), 10).unwrap(),
            Capped::Missing
        );
        let err = read_capped(dir.path(), 1 << 20).unwrap_err();
        assert_eq!(err.to_string(), "not a regular file");
    }

    #[test]
    fn a_fifo_in_a_files_place_is_an_error_not_a_hang() {
        use rustix::fs::{CWD, FileType, Mode, mknodat};
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("fifo");
        mknodat(CWD, &path, FileType::Fifo, Mode::RWXU, 0).unwrap();
        // On a thread, so that a read that blocks fails the test instead of
        // hanging it.
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || tx.send(read_capped(&path, 1 << 20).map_err(|e| e.to_string())));
        let read = rx
            .recv_timeout(std::time::Duration::from_secs(10))
            .expect("the read of a FIFO blocked");
        assert_eq!(read, Err("not a regular file".to_owned()));
    }

    #[test]
    fn a_file_whose_size_says_nothing_is_capped_while_it_is_read() {
        // `/proc` files report size 0 and have content.
        let path = Path::new("/proc/self/status");
        match read_capped(path, 16).unwrap() {
            Capped::TooLarge(n) => assert_eq!(n, 17),
            other => panic!("expected TooLarge, got {other:?}"),
        }
        let Capped::Bytes(all) = read_capped(path, 1 << 20).unwrap() else {
            panic!("expected the whole file");
        };
        assert!(all.starts_with(b"Name:"));
    }
}
