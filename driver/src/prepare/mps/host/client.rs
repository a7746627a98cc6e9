//! The plugin's side: one start request to the host, after checking that
//! the host listens in the plugin's own PID namespace.

use std::fs;
use std::io::{self, Read, Write};
use std::os::unix::net::UnixStream as StdUnixStream;
use std::path::Path;
use std::time::Duration;

use super::HostError;
use super::protocol::{MAX_MESSAGE, Outcome, Reply, StartRequest, pid_namespace};

/// Extra time the plugin gives the host beyond the request's own timeout.
pub(super) const REPLY_SLACK: Duration = Duration::from_secs(5);

/// The PID namespace of the process listening at the other end of
/// `stream`: the kernel names it by its pid in this process's namespace, 0
/// when it cannot be seen from here (`Ok(None)`), and `/proc/<pid>/ns/pid`
/// names its namespace.
fn listener_pid_namespace(stream: &StdUnixStream) -> io::Result<Option<String>> {
    use nix::sys::socket::{getsockopt, sockopt::PeerCredentials};
    let pid = getsockopt(stream, PeerCredentials)
        .map_err(io::Error::from)?
        .pid();
    if pid <= 0 {
        return Ok(None);
    }
    let link = fs::read_link(format!("/proc/{pid}/ns/pid"))?;
    Ok(Some(link.to_string_lossy().into_owned()))
}

/// Asks the host at `socket` to run `request`; returns how `-d` ended.
/// Blocking (the plugin calls it on its blocking pool, as it runs `-d`
/// itself otherwise).
pub fn request_start(socket: &Path, request: &StartRequest) -> Result<Outcome, HostError> {
    let io_err = |op: &'static str| {
        move |source: io::Error| HostError::Io {
            path: socket.to_owned(),
            op,
            source,
        }
    };
    let mut stream = StdUnixStream::connect(socket).map_err(|source| HostError::Unreachable {
        path: socket.to_owned(),
        source,
    })?;
    let own = pid_namespace().map_err(io_err("read this process's /proc/self/ns/pid"))?;
    let other = |host: String| HostError::OtherPidNamespace {
        path: socket.to_owned(),
        host,
        plugin: own.clone(),
    };
    match listener_pid_namespace(&stream) {
        Ok(Some(host)) if host == own => {}
        Ok(Some(host)) => return Err(other(host)),
        Ok(None) => return Err(other("one the plugin cannot see".into())),
        // The listener named has gone while its socket lives on (another
        // process holds it): the reply's namespace decides.
        Err(e) => {
            tracing::debug!(path = %socket.display(), error = %e, "cannot read the MPS daemon host's PID namespace before the request");
        }
    }
    let wait = request.timeout() + REPLY_SLACK;
    stream
        .set_read_timeout(Some(wait))
        .and_then(|()| stream.set_write_timeout(Some(wait)))
        .map_err(io_err("set timeouts"))?;
    let mut line = serde_json::to_vec(request).map_err(|e| HostError::Encode {
        path: socket.to_owned(),
        reason: e.to_string(),
    })?;
    line.push(b'\n');
    stream.write_all(&line).map_err(io_err("send request"))?;
    stream
        .shutdown(std::net::Shutdown::Write)
        .map_err(io_err("send request"))?;
    let mut answer = Vec::new();
    (&mut stream)
        .take(MAX_MESSAGE)
        .read_to_end(&mut answer)
        .map_err(|source| match source.kind() {
            // What an expired read timeout reads as.
            io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut => HostError::NoReply {
                path: socket.to_owned(),
                waited: wait,
            },
            _ => io_err("read reply")(source),
        })?;
    let reply: Reply = serde_json::from_slice(&answer).map_err(|e| HostError::BadReply {
        path: socket.to_owned(),
        reason: if answer.is_empty() {
            "nothing (the host closed the connection)".into()
        } else {
            e.to_string()
        },
    })?;
    if reply.pid_namespace != own {
        return Err(other(reply.pid_namespace));
    }
    Ok(reply.outcome)
}
