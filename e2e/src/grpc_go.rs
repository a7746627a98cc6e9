//! A real grpc-go client for the plugin's sockets: `hack/grpc-go-kubelet`,
//! built here with the Go toolchain and Debian's grpc-go sources
//! (`golang-go`, `golang-google-grpc-dev`), then run with the calls to make.
//!
//! Why: kubelet is a grpc-go client. The kubelet simulator
//! ([`crate::kubelet`]) is tonic, and the raw HTTP/2 client
//! ([`crate::kubelet::raw`]) only replays what grpc-go is known to send.
//! This runs grpc-go's own transport (its HTTP/2 framing, HPACK encoder,
//! flow control, `:authority` choice for a Unix socket target) against the
//! plugin. Debian 12's grpc-go is 1.33, so by default it sends the socket's
//! path as `:authority`, as older kubelets did; [`GrpcGo::calls`] can set
//! kubelet's present `localhost` instead.
//!
//! ```no_run
//! use gpu_dra_e2e::grpc_go::GrpcGo;
//! // Skips (with a loud message on stderr) where Go or grpc-go is missing;
//! // fails instead when GPU_DRA_E2E_REQUIRE_GRPC_GO=1 (CI sets it).
//! let Some(go) = GrpcGo::detect_or_skip("my_test").unwrap() else { return };
//! let socket = std::path::Path::new("/var/lib/kubelet/plugins/x/dra.sock");
//! let replies = go
//!     .calls(socket, None, &[("/pluginregistration.Registration/GetInfo", vec![])])
//!     .unwrap();
//! ```
//!
//! [`Session::stream`] reads a server stream (kubelet's device health
//! watch) on the same connection as the calls.
//!
//! Messages stay bytes here: callers encode and decode them with
//! `dra-proto`'s types.

use std::io::{BufRead as _, BufReader, Read as _, Write as _};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
use std::sync::OnceLock;
use std::time::Duration;

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;

/// When set to `1`, [`GrpcGo::detect_or_skip`] fails instead of skipping.
pub const REQUIRE_ENV: &str = "GPU_DRA_E2E_REQUIRE_GRPC_GO";
/// Where Debian's Go packages put their sources (GOPATH mode).
const DEBIAN_GOPATH: &str = "/usr/share/gocode";
/// The client's sources.
const SOURCE_DIR: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../hack/grpc-go-kubelet");

/// Errors of the grpc-go harness.
#[derive(Clone, Debug, thiserror::Error)]
pub enum GrpcGoError {
    /// The client cannot be built here; every reason is listed.
    #[error("the grpc-go client cannot be built here: {}", reasons.join("; "))]
    Unavailable {
        /// What is missing, each with what to install.
        reasons: Vec<String>,
    },
    /// `go build` failed.
    #[error("go build of {SOURCE_DIR} failed: {0}")]
    Build(String),
    /// The client could not be run, or broke off.
    #[error("grpc-go client: {0}")]
    Client(String),
}

/// A gRPC error the client got back.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Status {
    /// The gRPC status code (0–16).
    pub code: u32,
    /// Its message.
    pub message: String,
}

/// The built client.
#[derive(Clone, Debug)]
pub struct GrpcGo {
    binary: PathBuf,
}

impl GrpcGo {
    /// Builds the client (once per process: later calls answer from the
    /// first) when Go and grpc-go's sources are here.
    pub fn detect() -> Result<Self, GrpcGoError> {
        static DETECTED: OnceLock<Result<PathBuf, GrpcGoError>> = OnceLock::new();
        DETECTED
            .get_or_init(|| {
                let mut reasons = Vec::new();
                if Command::new("go")
                    .arg("version")
                    .output()
                    .map_or(true, |o| !o.status.success())
                {
                    reasons.push("no `go` program (Debian package golang-go)".to_owned());
                }
                let grpc = Path::new(DEBIAN_GOPATH).join("src/google.golang.org/grpc");
                if !grpc.is_dir() {
                    reasons.push(format!(
                        "no grpc-go sources in {} (Debian package golang-google-grpc-dev)",
                        grpc.display()
                    ));
                }
                if !reasons.is_empty() {
                    return Err(GrpcGoError::Unavailable { reasons });
                }
                build().map_err(GrpcGoError::Build)
            })
            .clone()
            .map(|binary| Self { binary })
    }

    /// For tests: `Ok(Some(client))` when it builds; `Ok(None)` after a
    /// loud skip message on stderr naming `test` and what is missing; the
    /// error instead of a skip when [`REQUIRE_ENV`] is `1`. A failed build
    /// is always an error.
    pub fn detect_or_skip(test: &str) -> Result<Option<Self>, GrpcGoError> {
        match Self::detect() {
            Ok(go) => Ok(Some(go)),
            Err(err @ GrpcGoError::Unavailable { .. }) => {
                crate::skip_unless_required(test, REQUIRE_ENV, err)
            }
            Err(err) => Err(err),
        }
    }

    /// Makes `calls` (full method name, encoded request) in turn over one
    /// connection to `socket`, sending `authority` as `:authority` when
    /// given (grpc-go's own choice otherwise); each call's encoded reply or
    /// gRPC status.
    pub fn calls(
        &self,
        socket: &Path,
        authority: Option<&str>,
        calls: &[(&str, Vec<u8>)],
    ) -> Result<Vec<Result<Vec<u8>, Status>>, GrpcGoError> {
        let mut session = self.connect(socket, authority)?;
        calls
            .iter()
            .map(|(method, request)| session.call(method, request))
            .collect()
    }

    /// A client process holding one grpc-go `ClientConn` to `socket` for
    /// calls made one at a time, as kubelet keeps one per plugin across
    /// many calls.
    pub fn connect(&self, socket: &Path, authority: Option<&str>) -> Result<Session, GrpcGoError> {
        let mut cmd = Command::new(&self.binary);
        if let Some(authority) = authority {
            cmd.arg(format!("-authority={authority}"));
        }
        let mut child = cmd
            .arg(socket)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(|e| {
                GrpcGoError::Client(format!("cannot run {}: {e}", self.binary.display()))
            })?;
        let stdin = child.stdin.take().expect("piped");
        let stdout = BufReader::new(child.stdout.take().expect("piped"));
        Ok(Session {
            child,
            stdin: Some(stdin),
            stdout,
        })
    }
}

/// A running client: one connection, calls in turn ([`GrpcGo::connect`]).
/// Dropping it closes its input, which ends it.
#[derive(Debug)]
pub struct Session {
    child: Child,
    stdin: Option<ChildStdin>,
    stdout: BufReader<ChildStdout>,
}

impl Session {
    /// Calls `method` with the encoded `request`; the encoded reply or the
    /// gRPC status. An error when the client has gone (its stderr says why).
    pub fn call(
        &mut self,
        method: &str,
        request: &[u8],
    ) -> Result<Result<Vec<u8>, Status>, GrpcGoError> {
        let answer = self.exchange(&format!("{method} {}", STANDARD.encode(request)))?;
        parse_reply(&answer)
    }

    /// Opens a server stream of `method` with the encoded `request` on
    /// this connection and reads `messages` messages within `deadline`,
    /// as kubelet watches device health; the client cancels the stream
    /// once they have come.
    pub fn stream(
        &mut self,
        method: &str,
        request: &[u8],
        messages: usize,
        deadline: Duration,
    ) -> Result<Streamed, GrpcGoError> {
        let ms = deadline.as_millis().max(1);
        let mut line = self.exchange(&format!(
            "stream {messages} {ms} {method} {}",
            STANDARD.encode(request)
        ))?;
        let mut got = Vec::new();
        loop {
            match parse_stream_line(&line)? {
                Ok(message) => got.push(message),
                Err(end) => {
                    return Ok(Streamed { messages: got, end });
                }
            }
            line = self.read_line()?;
        }
    }

    /// Sends one input line; the first output line after it.
    fn exchange(&mut self, line: &str) -> Result<String, GrpcGoError> {
        let stdin = self.stdin.as_mut().expect("open until drop");
        let sent = stdin
            .write_all(format!("{line}\n").as_bytes())
            .and_then(|()| stdin.flush());
        match sent {
            Ok(()) => self.read_line(),
            Err(_) => Err(GrpcGoError::Client(self.ended())),
        }
    }

    /// The next output line, without its newline.
    fn read_line(&mut self) -> Result<String, GrpcGoError> {
        let mut answer = String::new();
        match self.stdout.read_line(&mut answer) {
            Ok(n) if n > 0 => Ok(answer.trim_end_matches('\n').to_owned()),
            // Gone: what it said on the way out.
            _ => Err(GrpcGoError::Client(self.ended())),
        }
    }

    /// The client's exit status and stderr, once it has ended.
    fn ended(&mut self) -> String {
        drop(self.stdin.take());
        let mut stderr = String::new();
        if let Some(mut e) = self.child.stderr.take() {
            let _ = e.read_to_string(&mut stderr);
        }
        let status = self.child.wait().map(|s| s.to_string());
        format!("{}: {stderr}", status.unwrap_or_else(|e| e.to_string()))
    }
}

/// What a server stream gave ([`Session::stream`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Streamed {
    /// The messages, encoded, in the order they came.
    pub messages: Vec<Vec<u8>>,
    /// How the stream ended.
    pub end: StreamEnd,
}

/// How a server stream read by [`Session::stream`] ended.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum StreamEnd {
    /// The messages asked for came, and the client cancelled the stream.
    Cancelled,
    /// The server ended the stream, with status OK, before they all came.
    Eof,
    /// The stream failed, or its deadline passed (code 4) before they all
    /// came.
    Failed(Status),
}

impl Drop for Session {
    fn drop(&mut self) {
        drop(self.stdin.take());
        if self.child.try_wait().ok().flatten().is_none() {
            // Ends at the end of its input; killed should it hang on a call.
            let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
            while self.child.try_wait().ok().flatten().is_none() {
                if std::time::Instant::now() > deadline {
                    let _ = self.child.kill();
                    let _ = self.child.wait();
                    break;
                }
                std::thread::sleep(std::time::Duration::from_millis(5));
            }
        }
    }
}

/// One output line: `ok <base64>` or `err <code> <message>`.
fn parse_reply(line: &str) -> Result<Result<Vec<u8>, Status>, GrpcGoError> {
    let bad = || GrpcGoError::Client(format!("unexpected output line {line:?}"));
    match line.split_once(' ') {
        Some(("ok", encoded)) => STANDARD.decode(encoded).map(Ok).map_err(|_| bad()),
        Some(("err", rest)) => {
            let (code, message) = rest.split_once(' ').unwrap_or((rest, ""));
            let code = code.parse().map_err(|_| bad())?;
            Ok(Err(Status {
                code,
                message: message.to_owned(),
            }))
        }
        // An empty reply whose trailing space was trimmed.
        None if line == "ok" => Ok(Ok(Vec::new())),
        _ => Err(bad()),
    }
}

/// One output line of a stream: a message, or how the stream ended.
fn parse_stream_line(line: &str) -> Result<Result<Vec<u8>, StreamEnd>, GrpcGoError> {
    let bad = || GrpcGoError::Client(format!("unexpected output line {line:?}"));
    match line.split_once(' ') {
        Some(("msg", encoded)) => STANDARD.decode(encoded).map(Ok).map_err(|_| bad()),
        // An empty message whose trailing space was trimmed.
        None if line == "msg" => Ok(Ok(Vec::new())),
        None if line == "end" => Ok(Err(StreamEnd::Cancelled)),
        None if line == "eof" => Ok(Err(StreamEnd::Eof)),
        _ => match parse_reply(line)? {
            Err(status) => Ok(Err(StreamEnd::Failed(status))),
            Ok(_) => Err(bad()),
        },
    }
}

/// Builds the client; its path, or the compiler's output. One binary per
/// process (`<tmp>/gpu-dra-grpc-go/grpc-go-kubelet-<pid>`, about 10 MB),
/// so concurrent test processes never run a binary another is writing;
/// those of processes that are gone are removed first. Go's build cache
/// makes every build after the first quick.
fn build() -> Result<PathBuf, String> {
    let dir = std::env::temp_dir().join("gpu-dra-grpc-go");
    std::fs::create_dir_all(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    remove_binaries_of_gone_processes(&dir);
    let binary = dir.join(format!("{BINARY_PREFIX}{}", std::process::id()));
    let mut cmd = Command::new("go");
    cmd.arg("build")
        .arg("-o")
        .arg(&binary)
        .arg(".")
        .current_dir(SOURCE_DIR)
        // GOPATH mode on Debian's packaged sources: nothing is downloaded.
        .env("GO111MODULE", "off")
        .env("GOPATH", DEBIAN_GOPATH)
        .env("GOFLAGS", "")
        .env("CGO_ENABLED", "0");
    if std::env::var_os("GOCACHE").is_none() && std::env::var_os("HOME").is_none() {
        cmd.env("GOCACHE", std::env::temp_dir().join("gpu-dra-go-cache"));
    }
    let out = cmd.output().map_err(|e| format!("cannot run go: {e}"))?;
    if !out.status.success() {
        return Err(String::from_utf8_lossy(&out.stderr).into_owned());
    }
    Ok(binary)
}

/// The name of a built client, before its process's pid.
const BINARY_PREFIX: &str = "grpc-go-kubelet-";

/// Removes the clients in `dir` whose process (the pid in their name) is
/// gone.
fn remove_binaries_of_gone_processes(dir: &Path) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for entry in entries.flatten() {
        let name = entry.file_name();
        let Some(pid) = name
            .to_str()
            .and_then(|n| n.strip_prefix(BINARY_PREFIX))
            .and_then(|p| p.parse::<u32>().ok())
        else {
            continue;
        };
        if !Path::new(&format!("/proc/{pid}")).exists() {
            let _ = std::fs::remove_file(entry.path());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn output_lines_parse_and_garbage_is_an_error() {
        assert_eq!(parse_reply("ok AQI=").unwrap(), Ok(vec![1, 2]));
        assert_eq!(parse_reply("ok").unwrap(), Ok(vec![]));
        assert_eq!(
            parse_reply("err 14 connection refused").unwrap(),
            Err(Status {
                code: 14,
                message: "connection refused".into()
            })
        );
        assert_eq!(
            parse_reply("err 5").unwrap(),
            Err(Status {
                code: 5,
                message: String::new()
            })
        );
        for bad in ["", "ok !!!", "err x y", "what"] {
            assert!(parse_reply(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn stream_lines_parse_and_garbage_is_an_error() {
        assert_eq!(parse_stream_line("msg AQI=").unwrap(), Ok(vec![1, 2]));
        assert_eq!(parse_stream_line("msg").unwrap(), Ok(vec![]));
        assert_eq!(parse_stream_line("end").unwrap(), Err(StreamEnd::Cancelled));
        assert_eq!(parse_stream_line("eof").unwrap(), Err(StreamEnd::Eof));
        assert_eq!(
            parse_stream_line("err 4 context deadline exceeded").unwrap(),
            Err(StreamEnd::Failed(Status {
                code: 4,
                message: "context deadline exceeded".into()
            }))
        );
        for bad in ["", "ok AQI=", "msg !!!", "end now", "err x", "what"] {
            assert!(parse_stream_line(bad).is_err(), "{bad:?}");
        }
    }
}
