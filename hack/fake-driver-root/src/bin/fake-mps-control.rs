//! A stand-in for `nvidia-cuda-mps-control`, written for the fake driver
//! root's tests, demo and benchmarks; it is not NVIDIA's program and runs no
//! MPS server.
//!
//! Installed as `<root>/usr/bin/nvidia-cuda-mps-control`, it finds its root
//! three directories above its own file, records every invocation (and every
//! command its daemon processes) in `<root>/var/log/fake-driver/calls.log`,
//! and reads its simulated failures and delays from
//! `<root>/etc/fake-driver/behaviour.conf` (`KEY=value` lines, values quoted
//! as `sh` words, the format `FakeDriverRoot::set_behaviour` writes).
//!
//! - `-d` starts a control daemon in the background and returns: the daemon
//!   writes `nvidia-cuda-mps-control.pid` and `fake-mps-state` into
//!   `CUDA_MPS_PIPE_DIRECTORY`, logs to `CUDA_MPS_LOG_DIRECTORY/control.log`
//!   and listens on the UNIX socket `<pipe>/control`, as the real daemon
//!   does, with the same 107-byte path limit. The daemon runs in a process
//!   group of its own but in its caller's session (std has no `setsid`
//!   without `unsafe`): it outlives its parent and a kill of the caller's
//!   process group, not a hang-up of the caller's terminal. It has no
//!   signal handlers: killed, it leaves its pid file and socket behind, and
//!   the next daemon replaces them.
//! - Without arguments it is the client: each non-empty stdin line is one
//!   command, sent over its own connection.
//!
//! Wire format (private to this stand-in): the client connects, writes the
//! command and a newline (at most 1000 bytes of UTF-8 without NUL) and shuts
//! down its writing side; the daemon answers `<status>\n<output>\n`
//! (`0` accepted, `1` refused; output zero or more lines) and closes the
//! connection. Connections are served one at a time; anything malformed is
//! logged ("Invalid request ignored") and closed without an answer.

#![forbid(unsafe_code)]

// The file names and record layout the library reads back.
#[path = "../layout.rs"]
mod layout;

use std::ffi::{OsStr, OsString};
use std::fs::{self, OpenOptions};
use std::io::{self, BufRead, BufReader, Read, Write};
use std::net::Shutdown;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::os::unix::net::{UnixListener, UnixStream};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode, Stdio};
use std::thread::sleep;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use layout::{BEHAVIOUR_FILE, CALL_LOG, MPS_PID_FILE, MPS_STATE_FILE, RECORDED_ENV};

/// The tool name in call records (whatever name the program was run by).
const TOOL: &str = "nvidia-cuda-mps-control";
/// The internal argument that makes the program the daemon.
const DAEMON_ARG: &str = "--fake-daemon";
const CONTROL: &str = "control";
/// The socket's name until it listens: as long as `control`, so it meets
/// exactly the same path limit.
const CONTROL_TMP: &str = ".ctlnew";
/// Longest command line, in bytes.
const MAX_COMMAND: usize = 1000;
/// Largest answer a client reads.
const MAX_ANSWER: usize = 64 * 1024;
/// How long the daemon waits for a connected client's request.
const REQUEST_WAIT: Duration = Duration::from_secs(1);

const NOT_FOUND: &str = "Cannot find MPS control daemon process";

/// The simulated failures and delays of `behaviour.conf`.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Behaviour {
    start_fail: String,
    start_delay_ms: u32,
    never_ready: bool,
    refuse: String,
    reply_timeout_ms: u32,
    reply_delay_ms: u32,
}

impl Default for Behaviour {
    fn default() -> Self {
        Self {
            start_fail: String::new(),
            start_delay_ms: 0,
            never_ready: false,
            refuse: String::new(),
            reply_timeout_ms: 5000,
            reply_delay_ms: 0,
        }
    }
}

impl Behaviour {
    /// The behaviour a file describes: unknown keys, malformed lines and
    /// unparsable numbers are ignored (the default stays).
    fn parse(text: &[u8]) -> Self {
        let mut b = Self::default();
        for (key, value) in assignments(text) {
            let value = String::from_utf8_lossy(&value).into_owned();
            let number = |old: u32| value.parse().unwrap_or(old);
            match key.as_str() {
                "FAKE_MPS_START_FAIL" => b.start_fail = value,
                "FAKE_MPS_START_DELAY_MS" => b.start_delay_ms = number(b.start_delay_ms),
                "FAKE_MPS_NEVER_READY" => b.never_ready = value == "1",
                "FAKE_MPS_REFUSE" => b.refuse = value,
                "FAKE_MPS_REPLY_TIMEOUT_MS" => b.reply_timeout_ms = number(b.reply_timeout_ms),
                "FAKE_MPS_REPLY_DELAY_MS" => b.reply_delay_ms = number(b.reply_delay_ms),
                _ => {}
            }
        }
        b
    }
}

/// The `KEY=word` assignments of an `sh` file in the subset the crate
/// writes: blank and `#` lines, words of plain characters, `'...'` (may
/// span lines) and `\c`. Anything else makes its line malformed: skipped.
fn assignments(text: &[u8]) -> Vec<Assignment> {
    let mut out = Vec::new();
    let mut at = 0;
    while at < text.len() {
        match assignment(text, at) {
            Ok((found, next)) => {
                out.extend(found);
                at = next;
            }
            Err(bad) => {
                at = text[bad..]
                    .iter()
                    .position(|c| *c == b'\n')
                    .map_or(text.len(), |i| bad + i + 1);
            }
        }
    }
    out
}

/// A variable's name and value.
type Assignment = (String, Vec<u8>);

/// One line from `at`: `Ok((assignment if any, start of the next line))`,
/// or `Err(offset of the fault)`.
fn assignment(text: &[u8], mut at: usize) -> Result<(Option<Assignment>, usize), usize> {
    let byte = |i: usize| text.get(i).copied();
    while matches!(byte(at), Some(b' ' | b'\t')) {
        at += 1;
    }
    match byte(at) {
        None => return Ok((None, at)),
        Some(b'\n') => return Ok((None, at + 1)),
        Some(b'#') => {
            let end = text[at..].iter().position(|c| *c == b'\n');
            return Ok((None, end.map_or(text.len(), |i| at + i + 1)));
        }
        _ => {}
    }
    let start = at;
    while byte(at).is_some_and(|c| c == b'_' || c.is_ascii_alphanumeric()) {
        at += 1;
    }
    if at == start || text[start].is_ascii_digit() || byte(at) != Some(b'=') {
        return Err(at);
    }
    let key = String::from_utf8_lossy(&text[start..at]).into_owned();
    at += 1;
    let mut value = Vec::new();
    loop {
        match byte(at) {
            None => return Ok((Some((key, value)), at)),
            Some(b'\n') => return Ok((Some((key, value)), at + 1)),
            Some(b'\'') => {
                let len = text[at + 1..]
                    .iter()
                    .position(|c| *c == b'\'')
                    .ok_or(text.len())?;
                value.extend_from_slice(&text[at + 1..at + 1 + len]);
                at += len + 2;
            }
            Some(b'\\') => match byte(at + 1) {
                None => return Err(at),
                Some(b'\n') => at += 2,
                Some(c) => {
                    value.push(c);
                    at += 2;
                }
            },
            Some(
                b' ' | b'\t' | b'"' | b'$' | b'`' | b';' | b'&' | b'|' | b'<' | b'>' | b'(' | b')',
            ) => return Err(at),
            Some(c) => {
                value.push(c);
                at += 1;
            }
        }
    }
}

/// Days since 1970-01-01 as a proleptic Gregorian `(year, month, day)`.
/// The test API server (`sim/src/apiserver/meta.rs`) has the same
/// calendar function; this program is compiled alone with plain `rustc`
/// (see `build.rs`), so it can share no crate, and std formats no dates.
fn civil_from_days(days: i64) -> (i64, u32, u32) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let month = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    let year = yoe + era * 400 + i64::from(month <= 2);
    (year, month, day)
}

/// `YYYY-MM-DD HH:MM:SS.mmm` in UTC.
fn timestamp(now: SystemTime) -> String {
    let since = now.duration_since(UNIX_EPOCH).unwrap_or_default();
    let secs = since.as_secs();
    let (year, month, day) = civil_from_days((secs / 86_400) as i64);
    let of_day = secs % 86_400;
    format!(
        "{year:04}-{month:02}-{day:02} {:02}:{:02}:{:02}.{:03}",
        of_day / 3600,
        of_day / 60 % 60,
        of_day % 60,
        since.subsec_millis()
    )
}

/// Whether `s` is a device id the fakes accept (no path or shell specials).
fn valid_id(s: &str) -> bool {
    !s.is_empty() && s.bytes().all(|c| c == b'-' || c.is_ascii_alphanumeric())
}

fn digits(s: &str) -> bool {
    !s.is_empty() && s.bytes().all(|c| c.is_ascii_digit())
}

/// `0` to `100`, with an optional fraction (`12.5`, `100.0`).
fn valid_percentage(s: &str) -> bool {
    let (int, frac) = s.split_once('.').unwrap_or((s, ""));
    digits(int)
        && frac.bytes().all(|c| c.is_ascii_digit())
        && int.parse::<u64>().is_ok_and(|v| v <= 100)
}

/// `<N>M` or `<N>G`.
fn valid_limit(s: &str) -> bool {
    s.strip_suffix(['M', 'G']).is_some_and(digits)
}

/// The last value of `key` (and device `dev`, `-` for none) in a state file.
fn state_get<'a>(state: &'a str, key: &str, dev: &str) -> &'a str {
    let mut value = "";
    for line in state.lines() {
        let mut words = line.splitn(3, ' ');
        if words.next() == Some(key) && words.next() == Some(dev) {
            value = words.next().unwrap_or("").trim();
        }
    }
    value
}

/// What the daemon does with one command.
#[derive(Debug, PartialEq, Eq)]
struct Answer {
    ok: bool,
    output: String,
    /// A line to append to the state file.
    store: Option<String>,
    quit: bool,
}

/// Runs `command` against the daemon's `state` file text; `refuse` is the
/// behaviour's refused first word (empty: none).
fn handle(command: &str, refuse: &str, state: &str) -> Answer {
    let words: Vec<&str> = command.split_ascii_whitespace().collect();
    let (first, args) = words.split_first().map_or(("", &[][..]), |(f, a)| (*f, a));
    let done = |output: &str, store: Option<String>, quit: bool| Answer {
        ok: true,
        output: output.to_owned(),
        store,
        quit,
    };
    let fail = |output: String| Answer {
        ok: false,
        output,
        store: None,
        quit: false,
    };
    if !refuse.is_empty() && first == refuse {
        return fail(format!("Command refused (fake driver behaviour): {first}"));
    }
    match (first, args) {
        ("get_server_list", []) => done("", None, false),
        ("get_server_list", _) => fail("usage: get_server_list".into()),
        ("get_default_active_thread_percentage", _) => {
            let v = state_get(state, "active_thread_percentage", "-");
            done(if v.is_empty() { "100.0" } else { v }, None, false)
        }
        ("set_default_active_thread_percentage", [v]) if valid_percentage(v) => {
            done(v, Some(format!("active_thread_percentage - {v}")), false)
        }
        ("set_default_active_thread_percentage", _) => {
            fail("Invalid value: the percentage must be a number from 0 to 100".into())
        }
        ("get_default_device_pinned_mem_limit", [dev]) if valid_id(dev) => {
            done(state_get(state, "pinned_mem_limit", dev), None, false)
        }
        ("get_default_device_pinned_mem_limit", _) => {
            fail("usage: get_default_device_pinned_mem_limit <dev>".into())
        }
        ("set_default_device_pinned_mem_limit", [dev, v]) if valid_id(dev) && valid_limit(v) => {
            done("", Some(format!("pinned_mem_limit {dev} {v}")), false)
        }
        ("set_default_device_pinned_mem_limit", _) => {
            fail("Invalid arguments: set_default_device_pinned_mem_limit <dev> <N>M|<N>G".into())
        }
        ("quit", []) => done("", None, true),
        ("quit", ["-t", n]) if digits(n) => done("", None, true),
        ("quit", _) => fail("usage: quit [-t <seconds>]".into()),
        _ => fail(format!("Unknown command: {first}")),
    }
}

/// A command line as sent: at most [`MAX_COMMAND`] bytes of UTF-8 without
/// NUL (the call log's separator).
fn command_text(line: &[u8]) -> Option<&str> {
    if line.is_empty() || line.len() > MAX_COMMAND || line.contains(&0) {
        return None;
    }
    std::str::from_utf8(line).ok()
}

/// Reads one line (without its newline) keeping at most `max + 1` bytes, so
/// a longer line shows as longer than `max`; `None` at the end of input.
fn read_line(r: &mut impl BufRead, max: usize) -> io::Result<Option<Vec<u8>>> {
    let mut line = Vec::new();
    let mut any = false;
    loop {
        let buf = match r.fill_buf() {
            Ok(b) => b,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        };
        if buf.is_empty() {
            return Ok(any.then_some(line));
        }
        any = true;
        let newline = buf.iter().position(|c| *c == b'\n');
        let chunk = &buf[..newline.unwrap_or(buf.len())];
        let room = (max + 1).saturating_sub(line.len());
        line.extend_from_slice(&chunk[..chunk.len().min(room)]);
        let used = newline.map_or(buf.len(), |i| i + 1);
        r.consume(used);
        if newline.is_some() {
            return Ok(Some(line));
        }
    }
}

/// The answer's status and output; `None` when it is cut short.
fn parse_answer(answer: &[u8]) -> Option<(bool, String)> {
    let newline = answer.iter().position(|c| *c == b'\n')?;
    let status = std::str::from_utf8(&answer[..newline]).ok()?;
    if !digits(status) {
        return None;
    }
    let output = String::from_utf8_lossy(&answer[newline + 1..]).into_owned();
    Some((status == "0", output))
}

fn append(path: &Path, data: &[u8]) -> io::Result<()> {
    // One write on an O_APPEND file: concurrent writers never interleave.
    OpenOptions::new()
        .append(true)
        .create(true)
        .open(path)?
        .write_all(data)
}

/// The live (not zombie) process a pid file names.
fn live_pid(pid_file: &Path) -> Option<u32> {
    let mut text = String::new();
    fs::File::open(pid_file)
        .ok()?
        .take(64)
        .read_to_string(&mut text)
        .ok()?;
    let pid = text.lines().next()?.trim();
    if !digits(pid) {
        return None;
    }
    let stat = fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let state = stat[stat.rfind(')')? + 1..].trim_start().chars().next()?;
    if state == 'Z' || state == 'X' {
        return None;
    }
    pid.parse().ok()
}

fn remove(path: &Path) {
    let _ = fs::remove_file(path);
}

/// Where this invocation works.
struct Ctx {
    /// The driver root; `None` when this program's path is unknown (no
    /// recording, default behaviour).
    root: Option<PathBuf>,
    pipe: PathBuf,
    log_dir: PathBuf,
}

impl Ctx {
    fn from_env() -> Self {
        let dir = |name: &str, default: &str| {
            std::env::var_os(name)
                .filter(|v| !v.is_empty())
                .map_or_else(|| PathBuf::from(default), PathBuf::from)
        };
        Self {
            root: std::env::current_exe()
                .ok()
                .and_then(|exe| Some(exe.parent()?.parent()?.parent()?.to_path_buf())),
            pipe: dir("CUDA_MPS_PIPE_DIRECTORY", "/tmp/nvidia-mps"),
            log_dir: dir("CUDA_MPS_LOG_DIRECTORY", "/var/log/nvidia-mps"),
        }
    }

    fn behaviour(&self) -> Behaviour {
        self.root
            .as_ref()
            .and_then(|r| fs::read(r.join(BEHAVIOUR_FILE)).ok())
            .map(|text| Behaviour::parse(&text))
            .unwrap_or_default()
    }

    /// Appends one record: NUL-terminated `REC`, kind, field count, fields.
    fn record(&self, kind: &str, fields: &[&[u8]]) {
        let Some(root) = &self.root else { return };
        let count = fields.len().to_string();
        let mut buf = Vec::with_capacity(256);
        for field in [b"REC".as_slice(), kind.as_bytes(), count.as_bytes()]
            .into_iter()
            .chain(fields.iter().copied())
        {
            buf.extend_from_slice(field);
            buf.push(0);
        }
        let _ = append(&root.join(CALL_LOG), &buf);
    }

    fn record_call(&self, args: &[OsString]) {
        let argc = args.len().to_string();
        let env: Vec<Vec<u8>> = RECORDED_ENV
            .iter()
            .map(|name| {
                let mut field = name.as_bytes().to_vec();
                if let Some(value) = std::env::var_os(name) {
                    field.push(b'=');
                    field.extend_from_slice(value.as_bytes());
                }
                field
            })
            .collect();
        let mut fields = vec![TOOL.as_bytes(), argc.as_bytes()];
        fields.extend(args.iter().map(|a| a.as_bytes()));
        fields.extend(env.iter().map(Vec::as_slice));
        self.record("call", &fields);
    }
}

/// `-d`: checks, then starts the daemon in the background and returns.
fn start(ctx: &Ctx, argv0: &OsStr) -> ExitCode {
    let behaviour = ctx.behaviour();
    if !behaviour.start_fail.is_empty() {
        eprintln!("{}", behaviour.start_fail);
        return ExitCode::FAILURE;
    }
    if live_pid(&ctx.pipe.join(MPS_PID_FILE)).is_some() {
        eprintln!("An instance of this daemon is already running");
        return ExitCode::FAILURE;
    }
    for dir in [&ctx.pipe, &ctx.log_dir] {
        if let Err(e) = fs::create_dir_all(dir) {
            eprintln!("{TOOL}: cannot create {}: {e}", dir.display());
            return ExitCode::FAILURE;
        }
    }
    // `/proc/self/exe` is this very program even if its file was replaced
    // since; `arg0` keeps the name the driver recognizes daemons by.
    let spawned = Command::new("/proc/self/exe")
        .arg0(argv0)
        .arg(DAEMON_ARG)
        .process_group(0)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn();
    match spawned {
        Ok(_) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("{TOOL}: cannot start the daemon: {e}");
            ExitCode::FAILURE
        }
    }
}

/// The control daemon (`--fake-daemon`).
struct Daemon<'a> {
    ctx: &'a Ctx,
    pid: u32,
}

impl Daemon<'_> {
    fn path(&self, name: &str) -> PathBuf {
        self.ctx.pipe.join(name)
    }

    fn log(&self, message: &str) {
        let line = format!(
            "[{} Control {:>5}] {message}\n",
            timestamp(SystemTime::now()),
            self.pid
        );
        let _ = append(&self.ctx.log_dir.join("control.log"), line.as_bytes());
    }

    fn remove_files(&self) {
        for name in [CONTROL, MPS_PID_FILE, MPS_STATE_FILE] {
            remove(&self.path(name));
        }
    }

    fn run(&self) -> ExitCode {
        // A dead daemon's endpoint must not be mistaken for this one's.
        remove(&self.path(CONTROL));
        let behaviour = self.ctx.behaviour();
        sleep(Duration::from_millis(behaviour.start_delay_ms.into()));
        // One short write: a reader sees no file, an empty one or the pid.
        if fs::write(self.path(MPS_PID_FILE), format!("{}\n", self.pid)).is_err() {
            return ExitCode::FAILURE;
        }
        let control = self.path(CONTROL);
        self.log(&format!(
            "Starting control daemon using socket {}",
            control.display()
        ));
        self.log(&format!(
            "To connect CUDA applications to this daemon, set env CUDA_MPS_PIPE_DIRECTORY={}",
            self.ctx.pipe.display()
        ));
        let shm = fs::metadata("/dev/shm")
            .map_or_else(|_| "unknown".into(), |m| format!("{}:{}", m.dev(), m.ino()));
        let mut state = format!(
            "daemon_pid - {}\ndev_shm - {shm}\nvisible_devices - ",
            self.pid
        )
        .into_bytes();
        state.extend_from_slice(
            std::env::var_os("CUDA_VISIBLE_DEVICES")
                .unwrap_or_default()
                .as_bytes(),
        );
        state.push(b'\n');
        if fs::write(self.path(MPS_STATE_FILE), state).is_err() {
            return ExitCode::FAILURE;
        }
        if behaviour.never_ready {
            loop {
                sleep(Duration::from_secs(3600));
            }
        }
        let listener = match self.listen() {
            Ok(l) => l,
            Err(e) => {
                self.log(&format!(
                    "Cannot listen on socket {}: {e}",
                    control.display()
                ));
                self.remove_files();
                return ExitCode::FAILURE;
            }
        };
        for conn in listener.incoming() {
            match conn {
                Ok(stream) => {
                    if self.serve(stream) {
                        return ExitCode::SUCCESS;
                    }
                }
                // Out of descriptors and the like: try again shortly.
                Err(_) => sleep(Duration::from_millis(10)),
            }
        }
        ExitCode::FAILURE
    }

    /// Binds under a temporary name, then renames to `control`, so a client
    /// never sees an endpoint nobody listens on yet.
    fn listen(&self) -> io::Result<UnixListener> {
        let tmp = self.path(CONTROL_TMP);
        remove(&tmp);
        let listener = UnixListener::bind(&tmp)?;
        if let Err(e) = fs::rename(&tmp, self.path(CONTROL)) {
            remove(&tmp);
            return Err(e);
        }
        Ok(listener)
    }

    /// Serves one connection; `true` after `quit`.
    fn serve(&self, stream: UnixStream) -> bool {
        let _ = stream.set_read_timeout(Some(REQUEST_WAIT));
        let _ = stream.set_write_timeout(Some(REQUEST_WAIT));
        let line = read_line(&mut BufReader::new(&stream), MAX_COMMAND);
        let Some(raw) = line.ok().flatten() else {
            self.log("Invalid request ignored");
            return false;
        };
        let Some(command) = command_text(&raw) else {
            self.log("Invalid request ignored");
            return false;
        };
        let command = command.trim_matches([' ', '\t']);
        self.log("Accepting connection...");
        self.log("NEW UI");
        self.log(&format!("Cmd:{command}"));
        // Behaviour changes reach a running daemon from its next command.
        let behaviour = self.ctx.behaviour();
        sleep(Duration::from_millis(behaviour.reply_delay_ms.into()));
        let state_file = self.path(MPS_STATE_FILE);
        let state = fs::read(&state_file).unwrap_or_default();
        let answer = handle(command, &behaviour.refuse, &String::from_utf8_lossy(&state));
        if let Some(line) = &answer.store {
            let _ = append(&state_file, format!("{line}\n").as_bytes());
        }
        let status = if answer.ok { "0" } else { "1" };
        self.ctx.record(
            "mps-command",
            &[
                self.ctx.pipe.as_os_str().as_bytes(),
                command.as_bytes(),
                status.as_bytes(),
            ],
        );
        // A client that gave up is no error of the daemon's.
        let _ = (&stream).write_all(format!("{status}\n{}\n", answer.output).as_bytes());
        self.log("UI closed");
        if answer.quit {
            self.log("Exit");
            self.remove_files();
        }
        answer.quit
    }
}

/// Why a client got no answer.
#[derive(Debug)]
enum AskError {
    NotFound,
    TimedOut,
    Exited,
}

/// Sends one command and waits (at most `timeout`) for the answer.
fn ask(control: &Path, command: &str, timeout: Duration) -> Result<(bool, String), AskError> {
    let mut stream = UnixStream::connect(control).map_err(|_| AskError::NotFound)?;
    let deadline = Instant::now() + timeout;
    stream
        .write_all(format!("{command}\n").as_bytes())
        .map_err(|_| AskError::Exited)?;
    let _ = stream.shutdown(Shutdown::Write);
    let mut answer = Vec::new();
    let mut chunk = [0u8; 4096];
    while answer.len() < MAX_ANSWER {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(AskError::TimedOut);
        }
        stream
            .set_read_timeout(Some(left))
            .map_err(|_| AskError::Exited)?;
        match stream.read(&mut chunk) {
            Ok(0) => break,
            Ok(n) => answer.extend_from_slice(&chunk[..n]),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e)
                if matches!(
                    e.kind(),
                    io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
                ) =>
            {
                return Err(AskError::TimedOut);
            }
            // Reset: the daemon died with the connection queued.
            Err(_) => return Err(AskError::Exited),
        }
    }
    parse_answer(&answer).ok_or(AskError::Exited)
}

/// The client: each non-empty stdin line is one command.
fn client(ctx: &Ctx) -> ExitCode {
    let timeout = Duration::from_millis(ctx.behaviour().reply_timeout_ms.max(1).into());
    let pid_file = ctx.pipe.join(MPS_PID_FILE);
    let control = ctx.pipe.join(CONTROL);
    let mut stdin = io::stdin().lock();
    let mut stdout = io::stdout().lock();
    let mut failed = false;
    while let Ok(Some(line)) = read_line(&mut stdin, MAX_COMMAND) {
        if line.is_empty() {
            continue;
        }
        let listening = fs::symlink_metadata(&control).is_ok_and(|m| m.file_type().is_socket());
        if live_pid(&pid_file).is_none() || !listening {
            eprintln!("{NOT_FOUND}");
            return ExitCode::FAILURE;
        }
        if line.len() > MAX_COMMAND {
            eprintln!("Command too long");
            failed = true;
            continue;
        }
        let Some(command) = command_text(&line) else {
            eprintln!("Invalid command: not a line of UTF-8 text");
            failed = true;
            continue;
        };
        let message = match ask(&control, command, timeout) {
            Ok((ok, output)) => {
                for out in output.lines().filter(|l| !l.is_empty()) {
                    let _ = writeln!(stdout, "{out}");
                }
                failed |= !ok;
                continue;
            }
            Err(AskError::NotFound) => NOT_FOUND,
            Err(AskError::TimedOut) => "Timed out waiting for the MPS control daemon",
            Err(AskError::Exited) => "MPS control daemon exited before answering",
        };
        let _ = stdout.flush();
        eprintln!("{message}");
        return ExitCode::FAILURE;
    }
    if failed {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    }
}

fn main() -> ExitCode {
    let args: Vec<OsString> = std::env::args_os().collect();
    let ctx = Ctx::from_env();
    ctx.record_call(args.get(1..).unwrap_or_default());
    let argv0 = args.first().map_or(OsStr::new(TOOL), OsString::as_os_str);
    match args.get(1).and_then(|a| a.to_str()) {
        None | Some("") => client(&ctx),
        Some("-d") => start(&ctx, argv0),
        Some(DAEMON_ARG) => Daemon {
            ctx: &ctx,
            pid: std::process::id(),
        }
        .run(),
        Some(_) => {
            eprintln!("usage: {TOOL} [-d]");
            ExitCode::FAILURE
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn behaviour_file_as_the_crate_writes_it() {
        let conf = b"# written by the fake-driver-root crate\n\
            FAKE_GPUS='GPU-1 GPU-2'\n\
            FAKE_SMI_FAIL_CODE=0\n\
            FAKE_MPS_START_FAIL='it'\\''s $(broken)\n`x` \"q\"'\n\
            FAKE_MPS_START_DELAY_MS=20\n\
            FAKE_MPS_NEVER_READY=1\n\
            FAKE_MPS_REPLY_TIMEOUT_MS=100\n\
            FAKE_MPS_REPLY_DELAY_MS=7\n\
            FAKE_MPS_REFUSE='quit'\n";
        assert_eq!(
            Behaviour::parse(conf),
            Behaviour {
                start_fail: "it's $(broken)\n`x` \"q\"".into(),
                start_delay_ms: 20,
                never_ready: true,
                refuse: "quit".into(),
                reply_timeout_ms: 100,
                reply_delay_ms: 7,
            }
        );
        assert_eq!(Behaviour::parse(b""), Behaviour::default());
        assert_eq!(
            Behaviour::parse(b"FAKE_MPS_START_FAIL=''\\'''\n").start_fail,
            "'"
        );
    }

    #[test]
    fn malformed_behaviour_lines_are_skipped_not_fatal() {
        let conf = b"FAKE_MPS_REFUSE='unterminated\n\
            FAKE_MPS_START_DELAY_MS=5\n";
        // The open quote swallows the rest of the file, as in sh.
        assert_eq!(Behaviour::parse(conf), Behaviour::default());
        let conf = b"FAKE_MPS_REFUSE=$(rm -rf /)\n\
            FAKE_MPS_START_FAIL=a b\n\
            = x\n\
            9KEY=1\n\
            FAKE_MPS_REPLY_DELAY_MS=lots\n\
            FAKE_MPS_REPLY_TIMEOUT_MS=99999999999999\n\
            FAKE_MPS_START_DELAY_MS=3\\\n\
            0\n\
            UNKNOWN='x'\n\
            \xff\xfe\n\
            FAKE_MPS_NEVER_READY=yes\n\
            FAKE_MPS_REPLY_DELAY_MS=\\4";
        assert_eq!(
            Behaviour::parse(conf),
            Behaviour {
                start_delay_ms: 30,
                reply_delay_ms: 4,
                ..Behaviour::default()
            }
        );
        assert_eq!(
            assignments(b"A='x' # c\nB=y\n"),
            vec![("B".into(), b"y".to_vec())]
        );
        assert_eq!(
            assignments(b"  # comment\n\n  A=1\nB=\\"),
            vec![("A".into(), b"1".to_vec())]
        );
    }

    #[test]
    fn civil_dates_and_timestamps() {
        assert_eq!(civil_from_days(0), (1970, 1, 1));
        assert_eq!(civil_from_days(-1), (1969, 12, 31));
        assert_eq!(civil_from_days(11_016), (2000, 2, 29));
        assert_eq!(civil_from_days(11_017), (2000, 3, 1));
        assert_eq!(civil_from_days(20_513), (2026, 3, 1));
        assert_eq!(civil_from_days(47_541), (2100, 3, 1));
        assert_eq!(civil_from_days(47_540), (2100, 2, 28));
        let t = UNIX_EPOCH + Duration::from_millis(1_772_323_199_999);
        assert_eq!(timestamp(t), "2026-02-28 23:59:59.999");
        assert_eq!(timestamp(UNIX_EPOCH), "1970-01-01 00:00:00.000");
        assert_eq!(
            timestamp(UNIX_EPOCH - Duration::from_secs(5)),
            "1970-01-01 00:00:00.000"
        );
    }

    #[test]
    fn commands_are_validated_like_the_real_daemon() {
        let ok = |c: &str| handle(c, "", "");
        assert_eq!(
            ok("  set_default_active_thread_percentage\t40 "),
            Answer {
                ok: true,
                output: "40".into(),
                store: Some("active_thread_percentage - 40".into()),
                quit: false,
            }
        );
        assert_eq!(
            ok("set_default_device_pinned_mem_limit GPU-a 2G").store,
            Some("pinned_mem_limit GPU-a 2G".into())
        );
        assert!(ok("get_server_list").ok);
        assert!(ok("quit").quit);
        assert!(ok("quit -t 10").quit);
        for pct in ["0", "100", "100.0", "12.5", "5.", "007"] {
            assert!(valid_percentage(pct), "{pct}");
        }
        for bad in [
            "set_default_active_thread_percentage 101",
            "set_default_active_thread_percentage -5",
            "set_default_active_thread_percentage 5.5.5",
            "set_default_active_thread_percentage .5",
            "set_default_active_thread_percentage 99999999999999999999999",
            "set_default_active_thread_percentage",
            "set_default_device_pinned_mem_limit GPU-a 10T",
            "set_default_device_pinned_mem_limit GPU-a M",
            "set_default_device_pinned_mem_limit ../x 1M",
            "set_default_device_pinned_mem_limit GPU-a 1M extra",
            "get_default_device_pinned_mem_limit",
            "get_default_device_pinned_mem_limit $(x)",
            "get_server_list *",
            "quit now",
            "quit -t x",
            "start_server -uid 0",
            "",
        ] {
            let a = ok(bad);
            assert!(!a.ok && a.store.is_none() && !a.quit, "{bad}: {a:?}");
        }
        assert_eq!(ok("").output, "Unknown command: ");
        assert_eq!(ok("rm -rf /").output, "Unknown command: rm");
        let refused = handle("quit", "quit", "");
        assert!(!refused.ok && !refused.quit);
        assert_eq!(
            refused.output,
            "Command refused (fake driver behaviour): quit"
        );
    }

    #[test]
    fn getters_read_the_last_value_of_the_state() {
        let state = "daemon_pid - 1\nactive_thread_percentage - 40\n\
                     pinned_mem_limit GPU-a 1M\nactive_thread_percentage - 30\n\
                     pinned_mem_limit GPU-b 2G\npinned_mem_limit GPU-a 3M\n";
        let get = |c: &str| handle(c, "", state).output;
        assert_eq!(get("get_default_active_thread_percentage"), "30");
        assert_eq!(get("get_default_device_pinned_mem_limit GPU-a"), "3M");
        assert_eq!(get("get_default_device_pinned_mem_limit GPU-c"), "");
        assert_eq!(
            handle("get_default_active_thread_percentage", "", "").output,
            "100.0"
        );
    }

    #[test]
    fn requests_and_answers_are_framed() {
        let mut input: &[u8] = b"one\n\ntwo";
        assert_eq!(read_line(&mut input, 10).unwrap(), Some(b"one".to_vec()));
        assert_eq!(read_line(&mut input, 10).unwrap(), Some(Vec::new()));
        assert_eq!(read_line(&mut input, 10).unwrap(), Some(b"two".to_vec()));
        assert_eq!(read_line(&mut input, 10).unwrap(), None);
        let long = [b'x'; 50];
        let mut input = BufReader::with_capacity(8, &long[..]);
        assert_eq!(read_line(&mut input, 10).unwrap().unwrap().len(), 11);

        assert_eq!(command_text(b"quit"), Some("quit"));
        assert_eq!(command_text(&[b'x'; MAX_COMMAND]).map(str::len), Some(1000));
        assert_eq!(command_text(&[b'x'; MAX_COMMAND + 1]), None);
        assert_eq!(command_text(b""), None);
        assert_eq!(command_text(b"quit\0x"), None);
        assert_eq!(command_text(b"\xff\xfe"), None);

        assert_eq!(parse_answer(b"0\n40\n"), Some((true, "40\n".into())));
        assert_eq!(parse_answer(b"1\n\n"), Some((false, "\n".into())));
        assert_eq!(parse_answer(b"0"), None);
        assert_eq!(parse_answer(b""), None);
        assert_eq!(parse_answer(b"ok\n"), None);
    }
}
