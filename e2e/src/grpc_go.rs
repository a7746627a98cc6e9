//! A real grpc-go client for the plugin's sockets: `hack/grpc-go-kubelet`,
//! a Go module pinning grpc-go and kubelet's generated API types at the
//! versions of Kubernetes v1.37.2, built here with the machine's Go (1.26
//! or newer) and run with the calls to make.
//!
//! Why: kubelet is a grpc-go client. The kubelet simulator
//! ([`gpu_dra_sim::kubelet`]) is tonic, and the raw HTTP/2 client
//! ([`gpu_dra_sim::kubelet::raw`]) only replays what grpc-go is known to send.
//! This runs grpc-go's own transport (its HTTP/2 framing, HPACK encoder,
//! flow control, `:authority` choice for a Unix socket target) against the
//! plugin, dialling as kubelet 1.37 does: a connection whose first call is
//! to the registration service dials as kubelet's plugin watcher (grpc-go
//! then sends the socket's path, percent-encoded, as `:authority`), any
//! other as its DRA plugin manager (`localhost`); [`GrpcGo::calls`] can set
//! another `:authority`. `hack/grpc-go-kubelet/main.go` says how.
//!
//! ```no_run
//! use gpu_dra_e2e::grpc_go::GrpcGo;
//! // Skips (with a loud message on stderr) where Go 1.26 or the Go module
//! // proxy is missing; fails instead when GPU_DRA_E2E_REQUIRE_GRPC_GO=1
//! // (CI sets it).
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
//! `dra-proto`'s types. The client also decodes every reply and stream
//! message of a kubelet method into kubelet's own generated Go type; one
//! that does not decode comes back as the status kubelet would get (code 13,
//! INTERNAL, "grpc: failed to unmarshal the received message: ...").
//!
//! The client is built once per process, into a cache outside the clone
//! (`$XDG_CACHE_HOME` or `~/.cache`, `gpu-dra-grpc-go/<key>/`) keyed by its
//! sources and the Go release, so a later test run builds nothing.

use std::io::{BufRead as _, BufReader, Read as _, Write as _};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
use std::sync::OnceLock;
use std::time::Duration;

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;

/// When set to `1`, [`GrpcGo::detect_or_skip`] fails instead of skipping.
pub const REQUIRE_ENV: &str = "GPU_DRA_E2E_REQUIRE_GRPC_GO";
/// The client's sources.
const SOURCE_DIR: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../hack/grpc-go-kubelet");
/// The files the client is built from: the inputs of its cache key.
const SOURCES: [&str; 3] = ["go.mod", "go.sum", "main.go"];
/// The oldest Go that builds the client (go.mod's `go` line), as (major,
/// minor).
const GO_MIN: (u32, u32) = (1, 26);
/// Where the machine image puts Go; tried after every `go` on PATH.
const IMAGE_GO: &str = "/usr/local/go/bin/go";
/// `go build`'s flags, also part of the cache key.
const BUILD_FLAGS: [&str; 3] = ["-trimpath", "-buildvcs=false", "-ldflags=-s -w"];
/// The binary's name in its cache folder.
const BINARY: &str = "grpc-go-kubelet";

/// Errors of the grpc-go harness.
#[derive(Clone, Debug, thiserror::Error)]
pub enum GrpcGoError {
    /// The client cannot be built here; every reason is listed.
    #[error("the grpc-go client cannot be built here: {}", reasons.join("; "))]
    Unavailable {
        /// What is missing, each with what to install.
        reasons: Vec<String>,
    },
    /// The client's modules are bad (`go mod download` failed other than
    /// for want of the proxy), `go build` failed, or the cache could not
    /// be written.
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
    /// first), or finds it built in the cache, when Go 1.26 or newer is
    /// here and the Go module proxy answers (or the module cache holds the
    /// client's modules).
    pub fn detect() -> Result<Self, GrpcGoError> {
        static DETECTED: OnceLock<Result<PathBuf, GrpcGoError>> = OnceLock::new();
        DETECTED
            .get_or_init(|| {
                let go = find_go(&go_candidates()).map_err(|reason| GrpcGoError::Unavailable {
                    reasons: vec![reason],
                })?;
                build(&go)
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
    /// given (otherwise grpc-go's own choice for kubelet's dial, which the
    /// first call picks: see the module docs); each call's encoded reply or
    /// gRPC status (code 13 for a reply kubelet's types cannot decode).
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
    /// many calls. It dials at the first call or stream, as kubelet's
    /// plugin watcher when that is to the registration service, else as
    /// kubelet's DRA plugin manager.
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

/// A Go toolchain found by [`find_go`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Go {
    /// The `go` program.
    pub(crate) program: PathBuf,
    /// What `go version` said, e.g. `go version go1.26.8 linux/amd64`.
    version: String,
}

/// The `go` programs to try, in turn: each on PATH, then the machine
/// image's.
pub(crate) fn go_candidates() -> Vec<PathBuf> {
    let mut candidates: Vec<PathBuf> = std::env::var_os("PATH")
        .map(|path| {
            std::env::split_paths(&path)
                .map(|dir| dir.join("go"))
                .collect()
        })
        .unwrap_or_default();
    candidates.push(PathBuf::from(IMAGE_GO));
    candidates
}

/// The first of `candidates` that runs and is Go 1.26 or newer; else why
/// none is, naming each one tried and what to install.
pub(crate) fn find_go(candidates: &[PathBuf]) -> Result<Go, String> {
    let mut tried: Vec<String> = Vec::new();
    let mut seen = std::collections::HashSet::new();
    for program in candidates {
        // Each program once, however many names it has.
        if !program.is_file() || !seen.insert(std::fs::canonicalize(program).ok()) {
            continue;
        }
        let out = Command::new(program)
            .arg("version")
            // Never fetch another toolchain to answer.
            .env("GOTOOLCHAIN", "local")
            .output();
        let version = match out {
            Ok(out) if out.status.success() => {
                String::from_utf8_lossy(&out.stdout).trim().to_owned()
            }
            Ok(out) => {
                tried.push(format!(
                    "`go version` failed ({}) for {}",
                    out.status,
                    program.display()
                ));
                continue;
            }
            Err(e) => {
                tried.push(format!("cannot run {} ({e})", program.display()));
                continue;
            }
        };
        match parse_go_version(&version) {
            Some(v) if v >= GO_MIN => {
                return Ok(Go {
                    program: program.clone(),
                    version,
                });
            }
            _ => tried.push(format!("{version:?} at {}", program.display())),
        }
    }
    let found = if tried.is_empty() {
        "no `go` on PATH or at ".to_owned() + IMAGE_GO
    } else {
        format!("found only {}", tried.join(", "))
    };
    Err(format!(
        "no Go {}.{} or newer ({found}); install Go {}.{} from the machine image at {} \
         (or put one first on PATH); Debian's golang-go is too old",
        GO_MIN.0,
        GO_MIN.1,
        GO_MIN.0,
        GO_MIN.1,
        Path::new(IMAGE_GO)
            .parent()
            .and_then(Path::parent)
            .unwrap_or(Path::new("/"))
            .display()
    ))
}

/// (major, minor) of `go version`'s answer (`go version go1.26.8
/// linux/amd64`, `go version go1.27rc1 linux/arm64`).
fn parse_go_version(answer: &str) -> Option<(u32, u32)> {
    let release = answer.split_whitespace().find_map(|word| {
        word.strip_prefix("go")
            .filter(|r| r.starts_with(|c: char| c.is_ascii_digit()))
    })?;
    let mut parts = release.split('.');
    let major = parts.next()?.parse().ok()?;
    let minor: String = parts
        .next()?
        .chars()
        .take_while(char::is_ascii_digit)
        .collect();
    Some((major, minor.parse().ok()?))
}

/// The cache key of a build: 16 hex digits of a 64-bit FNV-1a hash of the
/// build flags, `go version`'s answer and each source (name, length,
/// content), so that any change to one of them is another key.
fn cache_key(go_version: &str, sources: &[(&str, Vec<u8>)]) -> String {
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    let mut feed = |bytes: &[u8]| {
        // Length first, so that no two different inputs run together.
        for &b in (bytes.len() as u64).to_le_bytes().iter().chain(bytes) {
            hash ^= u64::from(b);
            hash = hash.wrapping_mul(0x0000_0100_0000_01b3);
        }
    };
    for flag in BUILD_FLAGS {
        feed(flag.as_bytes());
    }
    feed(go_version.as_bytes());
    for (name, content) in sources {
        feed(name.as_bytes());
        feed(content);
    }
    format!("{hash:016x}")
}

/// Where built clients are kept: `gpu-dra-grpc-go` in `$XDG_CACHE_HOME`,
/// else in `~/.cache`, else in the temporary folder.
fn cache_root() -> PathBuf {
    user_cache_dir().join("gpu-dra-grpc-go")
}

/// The user's cache folder: `$XDG_CACHE_HOME` when absolute, else
/// `~/.cache`, else the temporary folder.
pub(crate) fn user_cache_dir() -> PathBuf {
    std::env::var_os("XDG_CACHE_HOME")
        .filter(|d| Path::new(d).is_absolute())
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| Path::new(&h).join(".cache")))
        .unwrap_or_else(std::env::temp_dir)
}

/// The client built by `go` from the sources: the cached one when its key
/// is there, else built now into the cache (written under a name of this
/// process, then renamed, so that concurrent test processes never run a
/// half-written binary).
fn build(go: &Go) -> Result<PathBuf, GrpcGoError> {
    let sources = SOURCES
        .iter()
        .map(|name| {
            let path = Path::new(SOURCE_DIR).join(name);
            std::fs::read(&path)
                .map(|content| (*name, content))
                .map_err(|e| GrpcGoError::Build(format!("{}: {e}", path.display())))
        })
        .collect::<Result<Vec<_>, _>>()?;
    let dir = cache_root().join(cache_key(&go.version, &sources));
    let binary = dir.join(BINARY);
    if binary.is_file() {
        return Ok(binary);
    }
    std::fs::create_dir_all(&dir)
        .map_err(|e| GrpcGoError::Build(format!("{}: {e}", dir.display())))?;

    // The modules first: where they cannot be had, the client cannot be
    // built here (a skip), which a compile error never is.
    let out = go_command(go, &["mod", "download"])
        .output()
        .map_err(|e| GrpcGoError::Build(format!("cannot run {}: {e}", go.program.display())))?;
    if !out.status.success() {
        let stderr = String::from_utf8_lossy(&out.stderr).trim().to_owned();
        if is_unreachable(&stderr) {
            let proxy = go_command(go, &["env", "GOPROXY"])
                .output()
                .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_owned())
                .unwrap_or_default();
            return Err(GrpcGoError::Unavailable {
                reasons: vec![format!(
                    "the client's Go modules are not in the module cache and the Go module \
                     proxy (GOPROXY={proxy}) cannot be reached: {stderr}; let this machine \
                     reach the proxy, or run `go mod download` in {SOURCE_DIR} where it can"
                )],
            });
        }
        return Err(GrpcGoError::Build(format!("go mod download: {stderr}")));
    }

    let partial = dir.join(format!("{BINARY}.partial-{}", std::process::id()));
    let mut args = vec!["build"];
    args.extend(BUILD_FLAGS);
    let partial_arg = partial.to_string_lossy().into_owned();
    args.extend(["-o", &partial_arg, "."]);
    let out = go_command(go, &args)
        .output()
        .map_err(|e| GrpcGoError::Build(format!("cannot run {}: {e}", go.program.display())))?;
    if !out.status.success() {
        let _ = std::fs::remove_file(&partial);
        return Err(GrpcGoError::Build(
            String::from_utf8_lossy(&out.stderr).into_owned(),
        ));
    }
    std::fs::rename(&partial, &binary).map_err(|e| {
        let _ = std::fs::remove_file(&partial);
        GrpcGoError::Build(format!(
            "{} -> {}: {e}",
            partial.display(),
            binary.display()
        ))
    })?;
    Ok(binary)
}

/// `go args` in the client's folder, in module mode as its go.mod says
/// (go.sum complete: nothing is added), with this Go only, static.
fn go_command(go: &Go, args: &[&str]) -> Command {
    let mut cmd = Command::new(&go.program);
    cmd.args(args)
        .current_dir(SOURCE_DIR)
        .env("GO111MODULE", "on")
        .env("GOFLAGS", "-mod=readonly")
        .env("GOWORK", "off")
        .env("GOTOOLCHAIN", "local")
        .env("CGO_ENABLED", "0");
    if std::env::var_os("HOME").is_none() {
        // Go keeps its build and module caches under $HOME by default.
        let tmp = std::env::temp_dir();
        if std::env::var_os("GOCACHE").is_none() {
            cmd.env("GOCACHE", tmp.join("gpu-dra-go-cache"));
        }
        if std::env::var_os("GOPATH").is_none() && std::env::var_os("GOMODCACHE").is_none() {
            cmd.env("GOPATH", tmp.join("gpu-dra-gopath"));
        }
    }
    cmd
}

/// Whether `go mod download`'s complaint is that the modules could not be
/// fetched (no network, no proxy), not that something is wrong with them.
pub(crate) fn is_unreachable(stderr: &str) -> bool {
    const SIGNS: [&str; 10] = [
        "dial tcp",
        "no such host",
        "connection refused",
        "connection reset",
        "network is unreachable",
        "i/o timeout",
        "TLS handshake timeout",
        "proxyconnect",
        "GOPROXY=off",
        "module lookup disabled",
    ];
    SIGNS.iter().any(|sign| stderr.contains(sign))
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

    #[test]
    fn go_versions_parse() {
        for (answer, want) in [
            ("go version go1.26.8 linux/amd64", Some((1, 26))),
            ("go version go1.19.8 linux/amd64", Some((1, 19))),
            ("go version go1.27rc1 linux/arm64", Some((1, 27))),
            ("go version go1.26 linux/amd64", Some((1, 26))),
            ("go version devel go1.28-abcdef linux/amd64", Some((1, 28))),
            ("go version", None),
            ("gopher", None),
        ] {
            assert_eq!(parse_go_version(answer), want, "{answer:?}");
        }
    }

    /// A `go` script in `dir/name` whose `go version` says `version` (or
    /// fails, for `None`).
    fn fake_go(dir: &Path, name: &str, version: Option<&str>) -> PathBuf {
        use std::os::unix::fs::PermissionsExt as _;
        let folder = dir.join(name);
        std::fs::create_dir_all(&folder).unwrap();
        let program = folder.join("go");
        let body = match version {
            Some(v) => format!("#!/bin/sh\necho 'go version {v} linux/amd64'\n"),
            None => "#!/bin/sh\nexit 3\n".to_owned(),
        };
        std::fs::write(&program, body).unwrap();
        std::fs::set_permissions(&program, std::fs::Permissions::from_mode(0o755)).unwrap();
        program
    }

    #[test]
    fn the_first_go_of_1_26_or_newer_is_taken_and_else_the_reason_names_what_was_found() {
        let dir = tempfile::tempdir().unwrap();
        let debian = fake_go(dir.path(), "debian", Some("go1.19.8"));
        let broken = fake_go(dir.path(), "broken", None);
        let image = fake_go(dir.path(), "image", Some("go1.26.8"));
        let newer = fake_go(dir.path(), "newer", Some("go1.27.1"));
        let missing = dir.path().join("missing/go");

        let found = find_go(&[
            missing.clone(),
            debian.clone(),
            broken.clone(),
            image.clone(),
            newer,
        ])
        .unwrap();
        assert_eq!(found.program, image);
        assert_eq!(found.version, "go version go1.26.8 linux/amd64");

        let reason = find_go(&[debian.clone(), broken, debian, missing]).unwrap_err();
        assert!(reason.contains("go1.19.8"), "{reason}");
        assert!(reason.contains("exit status: 3"), "{reason}");
        assert!(reason.contains("Go 1.26"), "{reason}");
        assert!(reason.contains("/usr/local/go"), "{reason}");
        // Each program once.
        assert_eq!(reason.matches("go1.19.8").count(), 1, "{reason}");

        let reason = find_go(&[]).unwrap_err();
        assert!(reason.contains("no `go` on PATH"), "{reason}");
    }

    #[test]
    fn the_cache_key_changes_with_every_input() {
        let sources = |m: &[u8], s: &[u8], g: &[u8]| {
            vec![
                ("go.mod", m.to_vec()),
                ("go.sum", s.to_vec()),
                ("main.go", g.to_vec()),
            ]
        };
        let v = "go version go1.26.8 linux/amd64";
        let key = cache_key(v, &sources(b"mod", b"sum", b"main"));
        assert_eq!(key.len(), 16);
        assert!(key.bytes().all(|b| b.is_ascii_hexdigit()), "{key}");
        assert_eq!(key, cache_key(v, &sources(b"mod", b"sum", b"main")));
        let others = [
            cache_key(
                "go version go1.26.9 linux/amd64",
                &sources(b"mod", b"sum", b"main"),
            ),
            cache_key(v, &sources(b"mod2", b"sum", b"main")),
            cache_key(v, &sources(b"mod", b"sum2", b"main")),
            cache_key(v, &sources(b"mod", b"sum", b"main2")),
            // The same bytes, cut elsewhere.
            cache_key(v, &sources(b"mo", b"dsum", b"main")),
        ];
        for other in &others {
            assert_ne!(&key, other);
        }
    }

    #[test]
    fn only_a_fetch_that_could_not_reach_the_proxy_is_unreachable() {
        assert!(is_unreachable(
            "go: google.golang.org/grpc@v1.82.1: Get \"https://proxy.golang.org/...\": dial tcp: lookup proxy.golang.org: no such host"
        ));
        assert!(is_unreachable(
            "go: k8s.io/kubelet@v0.37.2: module lookup disabled by GOPROXY=off"
        ));
        assert!(!is_unreachable(
            "verifying google.golang.org/grpc@v1.82.1: checksum mismatch"
        ));
        assert!(!is_unreachable(
            "go: updates to go.mod needed; to update it:\n\tgo mod tidy"
        ));
    }

    /// The client, or `None` after a skip message.
    fn client(test: &str) -> Option<GrpcGo> {
        GrpcGo::detect_or_skip(test).unwrap()
    }

    #[test]
    fn a_second_build_is_the_cached_binary() {
        let Some(go) = client("a_second_build_is_the_cached_binary") else {
            return;
        };
        assert!(
            go.binary.starts_with(cache_root()),
            "{}",
            go.binary.display()
        );
        let built = std::fs::metadata(&go.binary).unwrap().modified().unwrap();
        let found = find_go(&go_candidates()).unwrap();
        let start = std::time::Instant::now();
        let again = build(&found).unwrap();
        assert_eq!(again, go.binary);
        assert_eq!(
            std::fs::metadata(&again).unwrap().modified().unwrap(),
            built
        );
        assert!(
            start.elapsed() < Duration::from_secs(5),
            "{:?}",
            start.elapsed()
        );
    }

    #[test]
    fn every_kubelet_method_is_checked_with_kubelets_generated_type() {
        let Some(go) = client("every_kubelet_method_is_checked_with_kubelets_generated_type")
        else {
            return;
        };
        let out = Command::new(&go.binary).arg("-types").output().unwrap();
        assert!(out.status.success(), "{out:?}");
        let listed = String::from_utf8(out.stdout).unwrap();
        let dra = "k8s.io/kubelet/pkg/apis/dra";
        let want = [
            format!("/k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin/NodePrepareResources {dra}/v1.NodePrepareResourcesResponse"),
            format!("/k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin/NodeUnprepareResources {dra}/v1.NodeUnprepareResourcesResponse"),
            format!("/k8s.io.kubelet.pkg.apis.dra.v1beta1.DRAPlugin/NodePrepareResources {dra}/v1beta1.NodePrepareResourcesResponse"),
            format!("/k8s.io.kubelet.pkg.apis.dra.v1beta1.DRAPlugin/NodeUnprepareResources {dra}/v1beta1.NodeUnprepareResourcesResponse"),
            "/pluginregistration.Registration/GetInfo k8s.io/kubelet/pkg/apis/pluginregistration/v1.PluginInfo".to_owned(),
            "/pluginregistration.Registration/NotifyRegistrationStatus k8s.io/kubelet/pkg/apis/pluginregistration/v1.RegistrationStatusResponse".to_owned(),
            format!("/v1.DRAResourceHealth/NodeWatchResources {dra}-health/v1.NodeWatchResourcesResponse"),
            format!("/v1alpha1.DRAResourceHealth/NodeWatchResources {dra}-health/v1alpha1.NodeWatchResourcesResponse"),
        ];
        assert_eq!(listed.lines().collect::<Vec<_>>(), want);
    }

    /// A gRPC server on a Unix socket, HTTP/2 by hand (h2 would refuse the
    /// percent-encoded `:authority` of kubelet's registration dial): every
    /// call is answered with one message, `reply(path)`, and status OK;
    /// each call's (`:path`, `:authority`) is recorded.
    struct FakeServer {
        socket: PathBuf,
        calls: std::sync::Arc<std::sync::Mutex<Vec<(String, String)>>>,
        _dir: tempfile::TempDir,
    }

    impl FakeServer {
        fn start(reply: fn(&str) -> Vec<u8>) -> Self {
            let dir = tempfile::tempdir().unwrap();
            let socket = dir.path().join("plugin.sock");
            let listener = std::os::unix::net::UnixListener::bind(&socket).unwrap();
            let calls = std::sync::Arc::default();
            let seen = std::sync::Arc::clone(&calls);
            std::thread::spawn(move || {
                for conn in listener.incoming() {
                    let Ok(conn) = conn else { return };
                    let seen = std::sync::Arc::clone(&seen);
                    std::thread::spawn(move || {
                        let _ = serve(conn, reply, &seen);
                    });
                }
            });
            Self {
                socket,
                calls,
                _dir: dir,
            }
        }

        fn calls(&self) -> Vec<(String, String)> {
            self.calls.lock().unwrap().clone()
        }
    }

    fn frame(out: &mut Vec<u8>, kind: u8, flags: u8, stream: u32, payload: &[u8]) {
        out.extend_from_slice(&(payload.len() as u32).to_be_bytes()[1..]);
        out.extend_from_slice(&[kind, flags]);
        out.extend_from_slice(&stream.to_be_bytes());
        out.extend_from_slice(payload);
    }

    /// A header block of HPACK literals without indexing (short strings).
    fn literals(headers: &[(&str, &str)]) -> Vec<u8> {
        let mut block = Vec::new();
        for (name, value) in headers {
            block.push(0);
            for s in [name, value] {
                block.push(u8::try_from(s.len()).unwrap());
                block.extend_from_slice(s.as_bytes());
            }
        }
        block
    }

    /// One connection of [`FakeServer`], until the client closes it.
    fn serve(
        mut conn: std::os::unix::net::UnixStream,
        reply: fn(&str) -> Vec<u8>,
        seen: &std::sync::Mutex<Vec<(String, String)>>,
    ) -> std::io::Result<()> {
        const HEADERS: u8 = 0x1;
        const SETTINGS: u8 = 0x4;
        const PING: u8 = 0x6;
        const CONTINUATION: u8 = 0x9;
        let mut preface = [0; 24];
        conn.read_exact(&mut preface)?;
        let mut out = Vec::new();
        frame(&mut out, SETTINGS, 0, 0, &[]);
        conn.write_all(&out)?;
        let mut decoder = loona_hpack::Decoder::new();
        let mut block = Vec::new();
        let mut path = String::new();
        loop {
            let mut head = [0; 9];
            conn.read_exact(&mut head)?;
            let len = u32::from_be_bytes([0, head[0], head[1], head[2]]) as usize;
            let (kind, flags) = (head[3], head[4]);
            let stream = u32::from_be_bytes([head[5], head[6], head[7], head[8]]) & 0x7fff_ffff;
            let mut payload = vec![0; len];
            conn.read_exact(&mut payload)?;
            let mut out = Vec::new();
            match kind {
                SETTINGS if flags & 1 == 0 => frame(&mut out, SETTINGS, 1, 0, &[]),
                PING if flags & 1 == 0 => frame(&mut out, PING, 1, 0, &payload),
                HEADERS | CONTINUATION => {
                    // grpc-go sends neither padding nor priorities.
                    block.extend_from_slice(&payload);
                    if flags & 0x4 != 0 {
                        let mut authority = String::new();
                        for (name, value) in decoder.decode(&block).expect("HPACK") {
                            let value = String::from_utf8_lossy(&value).into_owned();
                            match &name[..] {
                                b":path" => path = value,
                                b":authority" => authority = value,
                                _ => {}
                            }
                        }
                        block.clear();
                        seen.lock().unwrap().push((path.clone(), authority));
                    }
                }
                // The request's end: the answer.
                0x0 if flags & 1 != 0 => {
                    let message = reply(&path);
                    let headers =
                        literals(&[(":status", "200"), ("content-type", "application/grpc")]);
                    frame(&mut out, HEADERS, 0x4, stream, &headers);
                    let mut data = vec![0];
                    data.extend_from_slice(&(message.len() as u32).to_be_bytes());
                    data.extend_from_slice(&message);
                    frame(&mut out, 0x0, 0, stream, &data);
                    frame(
                        &mut out,
                        HEADERS,
                        0x4 | 0x1,
                        stream,
                        &literals(&[("grpc-status", "0")]),
                    );
                }
                _ => {}
            }
            conn.write_all(&out)?;
        }
    }

    /// Field 1 (length-delimited) said to be 5 bytes long, 1 given: no
    /// kubelet reply decodes from it.
    const TRUNCATED: &[u8] = &[0x0a, 0x05, 0x01];
    /// PluginInfo's `type` (a proto3 string) as invalid UTF-8.
    const NOT_UTF8: &[u8] = &[0x0a, 0x01, 0xff];

    fn malformed(path: &str) -> Vec<u8> {
        if path.ends_with("/GetInfo") {
            NOT_UTF8.to_vec()
        } else {
            TRUNCATED.to_vec()
        }
    }

    /// The status a kubelet gets for a reply it cannot decode.
    fn undecodable(status: &Status) {
        assert_eq!(status.code, 13, "{status:?}");
        assert!(
            status
                .message
                .starts_with("grpc: failed to unmarshal the received message: "),
            "{status:?}"
        );
    }

    const PREPARE_V1: &str = "/k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin/NodePrepareResources";
    const GET_INFO: &str = "/pluginregistration.Registration/GetInfo";

    #[test]
    fn a_reply_kubelet_cannot_decode_is_an_error_and_an_unknown_methods_passes() {
        let Some(go) =
            client("a_reply_kubelet_cannot_decode_is_an_error_and_an_unknown_methods_passes")
        else {
            return;
        };
        let server = FakeServer::start(malformed);
        let replies = go
            .calls(
                &server.socket,
                None,
                &[
                    (PREPARE_V1, Vec::new()),
                    (
                        "/k8s.io.kubelet.pkg.apis.dra.v1beta1.DRAPlugin/NodeUnprepareResources",
                        Vec::new(),
                    ),
                    ("/example.Unknown/Call", Vec::new()),
                    (GET_INFO, Vec::new()),
                ],
            )
            .unwrap();
        undecodable(replies[0].as_ref().unwrap_err());
        undecodable(replies[1].as_ref().unwrap_err());
        assert_eq!(replies[2], Ok(TRUNCATED.to_vec()));
        undecodable(replies[3].as_ref().unwrap_err());
        assert!(
            replies[3].as_ref().unwrap_err().message.contains("UTF-8"),
            "{:?}",
            replies[3]
        );

        // A health stream message too.
        let mut session = go.connect(&server.socket, None).unwrap();
        for method in [
            "/v1.DRAResourceHealth/NodeWatchResources",
            "/v1alpha1.DRAResourceHealth/NodeWatchResources",
        ] {
            let streamed = session
                .stream(method, &[], 1, Duration::from_secs(10))
                .unwrap();
            assert_eq!(streamed.messages, Vec::<Vec<u8>>::new(), "{method}");
            match &streamed.end {
                StreamEnd::Failed(status) => undecodable(status),
                other => panic!("{method}: {other:?}"),
            }
        }
    }

    #[test]
    fn replies_that_decode_come_back_as_they_came() {
        use dra_proto::dra::v1;
        use prost::Message as _;
        fn good(path: &str) -> Vec<u8> {
            if path == PREPARE_V1 {
                let mut response = v1::NodePrepareResourcesResponse::default();
                response.claims.insert(
                    "uid-1".into(),
                    v1::NodePrepareResourceResponse {
                        devices: vec![v1::Device {
                            pool_name: "node".into(),
                            device_name: "gpu-1".into(),
                            ..Default::default()
                        }],
                        ..Default::default()
                    },
                );
                response.encode_to_vec()
            } else {
                // Empty: every message's defaults.
                Vec::new()
            }
        }
        let Some(go) = client("replies_that_decode_come_back_as_they_came") else {
            return;
        };
        let server = FakeServer::start(good);
        let replies = go
            .calls(
                &server.socket,
                None,
                &[(PREPARE_V1, Vec::new()), (GET_INFO, Vec::new())],
            )
            .unwrap();
        assert_eq!(replies, [Ok(good(PREPARE_V1)), Ok(Vec::new())]);
        let mut session = go.connect(&server.socket, None).unwrap();
        let streamed = session
            .stream(
                "/v1.DRAResourceHealth/NodeWatchResources",
                &[],
                1,
                Duration::from_secs(10),
            )
            .unwrap();
        assert_eq!(
            streamed,
            Streamed {
                messages: vec![Vec::new()],
                end: StreamEnd::Cancelled
            }
        );
    }

    /// grpc-go's escaping of an `:authority` (RFC 3986's allowed characters
    /// pass).
    fn percent_encoded(authority: &str) -> String {
        authority
            .bytes()
            .map(|b| {
                if b.is_ascii_alphanumeric() || b"-_.~!$&'()*+,;=:[]@".contains(&b) {
                    char::from(b).to_string()
                } else {
                    format!("%{b:02X}")
                }
            })
            .collect()
    }

    #[test]
    fn each_socket_is_dialled_with_the_authority_kubelet_sends() {
        let Some(go) = client("each_socket_is_dialled_with_the_authority_kubelet_sends") else {
            return;
        };
        let server = FakeServer::start(|_| Vec::new());
        let socket = server.socket.to_str().unwrap().to_owned();
        // The plugin watcher's dial (the first call registers), then the
        // DRA plugin manager's, then an authority of the caller's.
        go.calls(
            &server.socket,
            None,
            &[(GET_INFO, Vec::new()), (PREPARE_V1, Vec::new())],
        )
        .unwrap();
        go.calls(
            &server.socket,
            None,
            &[(PREPARE_V1, Vec::new()), (GET_INFO, Vec::new())],
        )
        .unwrap();
        go.calls(
            &server.socket,
            Some("example.test"),
            &[(GET_INFO, Vec::new())],
        )
        .unwrap();
        let registration = percent_encoded(&socket);
        assert!(registration.starts_with("%2F"), "{registration}");
        let want: Vec<(String, String)> = [
            (GET_INFO, registration.as_str()),
            (PREPARE_V1, &registration),
            (PREPARE_V1, "localhost"),
            (GET_INFO, "localhost"),
            (GET_INFO, "example.test"),
        ]
        .iter()
        .map(|(p, a)| ((*p).to_owned(), (*a).to_owned()))
        .collect();
        assert_eq!(server.calls(), want);
    }
}
