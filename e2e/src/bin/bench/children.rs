//! The processes `bench` starts that must not outlive it: its plugins,
//! registered as they are spawned and forgotten once their [`Plugin`] is
//! dropped, and the fake driver roots ([`Root`]) the plugins' stand-in MPS
//! daemons run from. When `bench` is killed, [`crate::signals`] takes what
//! is registered ([`Registry::begin_stop`], after which no plugin may be
//! spawned) and [`stop`] ends it.

use std::io;
use std::ops::{Deref, DerefMut};
use std::path::{Path, PathBuf};
use std::process::{Child, Command};
use std::sync::{Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

/// Everything this process started that is registered now.
static REGISTRY: Mutex<Registry> = Mutex::new(Registry::new());

/// The process-wide registry (a panicked holder leaves it usable: its
/// state is a plain list).
pub fn registry() -> MutexGuard<'static, Registry> {
    REGISTRY.lock().unwrap_or_else(PoisonError::into_inner)
}

/// The scratch directories, removed after a signal stopped the children.
static SCRATCH: Mutex<Vec<PathBuf>> = Mutex::new(Vec::new());

/// Registers scratch directories for removal when a signal ends `bench`.
pub fn register_scratch(dirs: &[&Path]) {
    let mut scratch = SCRATCH.lock().unwrap_or_else(PoisonError::into_inner);
    scratch.extend(dirs.iter().map(|d| d.to_path_buf()));
}

/// Removes the registered scratch directories (after [`stop`]); returns
/// how many were there to remove.
pub fn remove_scratch() -> usize {
    let dirs = std::mem::take(&mut *SCRATCH.lock().unwrap_or_else(PoisonError::into_inner));
    dirs.iter()
        .filter(|d| std::fs::remove_dir_all(d).is_ok())
        .count()
}

/// Whether a signal is stopping the bench: then the main thread waits for
/// the exit rather than report the failures the stop causes.
pub fn stopping() -> bool {
    registry().stopping
}

/// One spawned plugin: its pid and the program it was started as
/// (`argv[0]`), to recognise it before signalling it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    pub pid: u32,
    pub program: PathBuf,
}

/// Plugins and driver roots that are live, and whether `bench` is
/// stopping (then it spawns nothing more).
#[derive(Debug, Default)]
pub struct Registry {
    plugins: Vec<Entry>,
    roots: Vec<PathBuf>,
    stopping: bool,
}

impl Registry {
    pub const fn new() -> Self {
        Self {
            plugins: Vec::new(),
            roots: Vec::new(),
            stopping: false,
        }
    }

    /// Spawns `cmd` and registers the child, under the registry's lock so
    /// that a stop either sees the child or refuses to start it.
    pub fn spawn(&mut self, cmd: &mut Command) -> io::Result<Child> {
        if self.stopping {
            return Err(io::Error::other(
                "bench is stopping on a signal: no plugin is started",
            ));
        }
        let child = cmd.spawn()?;
        self.plugins.push(Entry {
            pid: child.id(),
            program: PathBuf::from(cmd.get_program()),
        });
        Ok(child)
    }

    /// Forgets the plugin `pid` (it was stopped and reaped).
    pub fn forget(&mut self, pid: u32) {
        self.plugins.retain(|e| e.pid != pid);
    }

    /// Registers a driver root whose processes are stopped with the plugins.
    pub fn add_root(&mut self, root: PathBuf) {
        self.roots.push(root);
    }

    /// Forgets one registration of `root`.
    pub fn remove_root(&mut self, root: &Path) {
        if let Some(i) = self.roots.iter().position(|r| r == root) {
            self.roots.remove(i);
        }
    }

    /// The registered plugins, oldest first.
    #[cfg(test)]
    pub fn plugins(&self) -> &[Entry] {
        &self.plugins
    }

    /// The registered driver roots.
    #[cfg(test)]
    pub fn roots(&self) -> &[PathBuf] {
        &self.roots
    }

    /// Starts stopping: refuses every later spawn and hands over what is
    /// registered (the registry is left empty).
    pub fn begin_stop(&mut self) -> (Vec<Entry>, Vec<PathBuf>) {
        self.stopping = true;
        (
            std::mem::take(&mut self.plugins),
            std::mem::take(&mut self.roots),
        )
    }
}

/// A plugin child registered in the process-wide registry: a [`Child`]
/// that is forgotten when dropped (after the owner killed and reaped it).
#[derive(Debug)]
pub struct Plugin {
    child: Child,
}

/// Spawns a plugin with `cmd` and registers it.
pub fn spawn_plugin(cmd: &mut Command) -> io::Result<Plugin> {
    let child = registry().spawn(cmd)?;
    Ok(Plugin { child })
}

impl Deref for Plugin {
    type Target = Child;
    fn deref(&self) -> &Child {
        &self.child
    }
}

impl DerefMut for Plugin {
    fn deref_mut(&mut self) -> &mut Child {
        &mut self.child
    }
}

impl Drop for Plugin {
    fn drop(&mut self) {
        registry().forget(self.child.id());
    }
}

/// A fake driver root registered in the process-wide registry for as long
/// as this lives: the stand-in daemons started from it are stopped with the
/// plugins.
#[derive(Debug)]
pub struct Root {
    path: PathBuf,
}

impl Root {
    pub fn register(path: &Path) -> Self {
        registry().add_root(path.to_path_buf());
        Self {
            path: path.to_path_buf(),
        }
    }
}

impl Drop for Root {
    fn drop(&mut self) {
        registry().remove_root(&self.path);
    }
}

/// What [`stop`] did.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Stopped {
    /// Live plugins that were sent SIGTERM.
    pub plugins: Vec<u32>,
    /// Those of them still alive after the grace period, sent SIGKILL.
    pub killed: Vec<u32>,
    /// Processes started from the driver roots (stand-in MPS daemons),
    /// killed after the plugins.
    pub daemons: usize,
    /// Scratch directories removed afterwards (set by the caller).
    pub scratch_removed: usize,
}

/// Stops `plugins` that are still running as children of this process
/// (SIGTERM, then SIGKILL for those alive after `grace`), then kills what
/// runs from `roots`. A pid that is gone, a zombie, or now another
/// process is left alone.
pub fn stop(plugins: &[Entry], roots: &[PathBuf], grace: Duration) -> Stopped {
    let me = std::process::id();
    let live: Vec<u32> = plugins
        .iter()
        .filter(|e| is_our_child(e, me))
        .map(|e| e.pid)
        .collect();
    for pid in &live {
        // As `Node::stop` does: the plugin gets the signal a kubelet
        // node's runtime sends.
        fake_driver_root::terminate(*pid);
    }
    let deadline = Instant::now() + grace;
    while live.iter().any(|p| fake_driver_root::is_alive(*p)) && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    let killed: Vec<u32> = live
        .iter()
        .copied()
        .filter(|p| fake_driver_root::is_alive(*p) && fake_driver_root::kill(*p))
        .collect();
    let daemons = roots.iter().map(|r| fake_driver_root::kill_under(r)).sum();
    Stopped {
        plugins: live,
        killed,
        daemons,
        scratch_removed: 0,
    }
}

/// Whether `e` is a live (not zombie) child of process `me` running as
/// `e.program`.
fn is_our_child(e: &Entry, me: u32) -> bool {
    fake_driver_root::is_alive(e.pid)
        && fake_driver_root::parent_id(e.pid) == Some(me)
        && fake_driver_root::cmdline(e.pid)
            .and_then(|args| args.into_iter().next())
            .is_some_and(|arg0| Path::new(&arg0) == e.program)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sleeper() -> Command {
        let mut cmd = Command::new("sleep");
        cmd.arg("30");
        cmd
    }

    #[test]
    fn registered_scratch_directories_are_removed_once() {
        let base = tempfile::tempdir().unwrap();
        let outer = base.path().join("bench-1");
        let inner = outer.join("volatile");
        std::fs::create_dir_all(&inner).unwrap();
        std::fs::write(inner.join("state"), b"x").unwrap();
        register_scratch(&[&inner, &outer]);
        assert_eq!(remove_scratch(), 2);
        assert!(!outer.exists());
        // Nothing left registered: a second call removes nothing.
        assert_eq!(remove_scratch(), 0);
    }

    #[test]
    fn spawned_plugins_are_registered_until_forgotten() {
        let mut registry = Registry::new();
        let mut a = registry.spawn(&mut sleeper()).unwrap();
        let mut b = registry.spawn(&mut sleeper()).unwrap();
        let pids: Vec<u32> = registry.plugins().iter().map(|e| e.pid).collect();
        assert_eq!(pids, [a.id(), b.id()]);
        assert_eq!(registry.plugins()[0].program, Path::new("sleep"));
        registry.forget(a.id());
        assert_eq!(registry.plugins().len(), 1);
        assert_eq!(registry.plugins()[0].pid, b.id());
        registry.forget(a.id());
        assert_eq!(registry.plugins().len(), 1, "forgetting twice is harmless");
        for c in [&mut a, &mut b] {
            c.kill().unwrap();
            c.wait().unwrap();
        }
    }

    #[test]
    fn roots_are_counted_per_registration() {
        let mut registry = Registry::new();
        let root = PathBuf::from("/nonexistent/root");
        registry.add_root(root.clone());
        registry.add_root(root.clone());
        registry.remove_root(&root);
        assert_eq!(registry.roots(), std::slice::from_ref(&root));
        registry.remove_root(&root);
        registry.remove_root(&root);
        assert!(registry.roots().is_empty());
    }

    #[test]
    fn a_stopping_registry_hands_everything_over_and_spawns_nothing() {
        let mut registry = Registry::new();
        let mut child = registry.spawn(&mut sleeper()).unwrap();
        registry.add_root(PathBuf::from("/nonexistent/root"));
        let (plugins, roots) = registry.begin_stop();
        assert_eq!(plugins.len(), 1);
        assert_eq!(plugins[0].pid, child.id());
        assert_eq!(roots, [PathBuf::from("/nonexistent/root")]);
        assert!(registry.plugins().is_empty() && registry.roots().is_empty());
        let err = registry.spawn(&mut sleeper()).unwrap_err();
        assert!(err.to_string().contains("stopping"), "{err}");
        assert!(registry.plugins().is_empty(), "nothing was spawned");
        child.kill().unwrap();
        child.wait().unwrap();
    }

    #[test]
    fn stop_terminates_live_children_and_skips_the_rest() {
        let mut registry = Registry::new();
        let mut live = registry.spawn(&mut sleeper()).unwrap();
        let mut reaped = registry.spawn(&mut sleeper()).unwrap();
        reaped.kill().unwrap();
        reaped.wait().unwrap();
        let (mut plugins, _) = registry.begin_stop();
        // Not our child: init. Our child under another program name.
        plugins.push(Entry {
            pid: 1,
            program: PathBuf::from("sleep"),
        });
        plugins.push(Entry {
            pid: live.id(),
            program: PathBuf::from("/not/the/program"),
        });
        let empty_root = tempfile::tempdir().unwrap();
        let stopped = stop(
            &plugins,
            &[empty_root.path().to_path_buf()],
            Duration::from_secs(5),
        );
        assert_eq!(
            stopped,
            Stopped {
                plugins: vec![live.id()],
                killed: Vec::new(),
                daemons: 0,
                scratch_removed: 0,
            }
        );
        let status = live.wait().unwrap();
        assert_eq!(
            std::os::unix::process::ExitStatusExt::signal(&status),
            Some(15),
            "SIGTERM ended it"
        );
    }

    #[test]
    fn stop_kills_what_runs_from_the_driver_roots() {
        let root = tempfile::tempdir().unwrap();
        // Runs with a path under the root on its command line, and (unlike
        // a shell loop) forks no copies of itself.
        let file = root.path().join("daemon.log");
        std::fs::write(&file, "").unwrap();
        let mut daemon = Command::new("tail")
            .arg("-f")
            .arg(&file)
            .stdout(std::process::Stdio::null())
            .spawn()
            .unwrap();
        let deadline = Instant::now() + Duration::from_secs(10);
        while fake_driver_root::processes_under(root.path()) != [daemon.id()] {
            assert!(Instant::now() < deadline, "the daemon never showed up");
            std::thread::sleep(Duration::from_millis(10));
        }
        let stopped = stop(&[], &[root.path().to_path_buf()], Duration::ZERO);
        assert_eq!(stopped.daemons, 1);
        assert!(stopped.plugins.is_empty());
        let status = daemon.wait().unwrap();
        assert_eq!(
            std::os::unix::process::ExitStatusExt::signal(&status),
            Some(9)
        );
    }

    #[test]
    fn stop_kills_what_ignores_sigterm() {
        let mut registry = Registry::new();
        let mut stubborn = registry
            .spawn(Command::new("sh").args(["-c", "trap '' TERM; while :; do sleep 0.05; done"]))
            .unwrap();
        // Wait until the shell ignores SIGTERM (bit 15 of SigIgn).
        let deadline = Instant::now() + Duration::from_secs(10);
        while !ignores_term(stubborn.id()) {
            assert!(Instant::now() < deadline, "the shell never trapped SIGTERM");
            std::thread::sleep(Duration::from_millis(10));
        }
        let (plugins, _) = registry.begin_stop();
        let stopped = stop(&plugins, &[], Duration::from_millis(300));
        assert_eq!(stopped.plugins, [stubborn.id()]);
        assert_eq!(stopped.killed, [stubborn.id()]);
        let status = stubborn.wait().unwrap();
        assert_eq!(
            std::os::unix::process::ExitStatusExt::signal(&status),
            Some(9)
        );
    }

    fn ignores_term(pid: u32) -> bool {
        std::fs::read_to_string(format!("/proc/{pid}/status"))
            .ok()
            .and_then(|s| {
                let mask = s.lines().find_map(|l| l.strip_prefix("SigIgn:"))?;
                u64::from_str_radix(mask.trim(), 16).ok()
            })
            .is_some_and(|mask| mask & (1 << 14) != 0)
    }

    #[test]
    fn the_process_wide_guards_register_and_forget() {
        let mut plugin = spawn_plugin(&mut sleeper()).unwrap();
        let pid = plugin.id();
        assert!(registry().plugins().iter().any(|e| e.pid == pid));
        plugin.kill().unwrap();
        plugin.wait().unwrap();
        drop(plugin);
        assert!(!registry().plugins().iter().any(|e| e.pid == pid));

        let dir = tempfile::tempdir().unwrap();
        let root = Root::register(dir.path());
        assert!(registry().roots().iter().any(|r| r == dir.path()));
        drop(root);
        assert!(!registry().roots().iter().any(|r| r == dir.path()));
    }
}
