//! `bench` killed from outside (SIGINT, SIGTERM, SIGHUP) stops what it
//! started before it goes: the plugins still running and the stand-in MPS
//! daemons run from their driver roots ([`crate::children`]), then removes
//! its scratch directories, says on one stderr line what it stopped and
//! exits with 128 + the signal's number.

use std::time::Duration;

use anyhow::Context as _;
use tokio::signal::unix::{SignalKind, signal};

use crate::children::{self, Stopped};

/// How long a plugin has to exit on SIGTERM before it gets SIGKILL.
const GRACE: Duration = Duration::from_secs(3);

/// A signal that ends `bench`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Caught {
    Interrupt,
    Terminate,
    Hangup,
}

impl Caught {
    pub fn name(self) -> &'static str {
        match self {
            Self::Interrupt => "SIGINT",
            Self::Terminate => "SIGTERM",
            Self::Hangup => "SIGHUP",
        }
    }

    /// The exit status, as a shell reports a process the signal killed.
    pub fn exit_code(self) -> i32 {
        128 + match self {
            Self::Interrupt => 2,
            Self::Terminate => 15,
            Self::Hangup => 1,
        }
    }
}

/// Installs the handlers now (a signal that comes after this returns is
/// handled) and watches for them on a thread of its own, with its own
/// runtime, whatever the benchmarks keep busy.
pub fn watch() -> anyhow::Result<()> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_io()
        .build()
        .context("starting the signal watcher's runtime")?;
    let (mut int, mut term, mut hup) = {
        let _entered = runtime.enter();
        let listen = |kind: SignalKind, name: &str| {
            signal(kind).with_context(|| format!("listening for {name}"))
        };
        (
            listen(SignalKind::interrupt(), "SIGINT")?,
            listen(SignalKind::terminate(), "SIGTERM")?,
            listen(SignalKind::hangup(), "SIGHUP")?,
        )
    };
    std::thread::Builder::new()
        .name("bench-signals".into())
        .spawn(move || {
            let caught = runtime.block_on(async {
                tokio::select! {
                    _ = int.recv() => Caught::Interrupt,
                    _ = term.recv() => Caught::Terminate,
                    _ = hup.recv() => Caught::Hangup,
                }
            });
            let (plugins, roots) = children::registry().begin_stop();
            let mut stopped = children::stop(&plugins, &roots, GRACE);
            stopped.scratch_removed = children::remove_scratch();
            eprintln!("{}", report(caught, &stopped));
            std::process::exit(caught.exit_code());
        })
        .context("starting the signal watcher")?;
    Ok(())
}

/// The one line said on the way out.
fn report(caught: Caught, stopped: &Stopped) -> String {
    let list = |pids: &[u32]| {
        pids.iter()
            .map(u32::to_string)
            .collect::<Vec<_>>()
            .join(", ")
    };
    let plugins = match stopped.plugins.len() {
        0 => "no plugin was running".to_owned(),
        n => {
            let forced = if stopped.killed.is_empty() {
                String::new()
            } else {
                format!(
                    "; SIGKILL after {} s to {}",
                    GRACE.as_secs(),
                    list(&stopped.killed)
                )
            };
            format!(
                "stopped {n} plugin{} (pid {}{forced})",
                if n == 1 { "" } else { "s" },
                list(&stopped.plugins)
            )
        }
    };
    let daemons = match stopped.daemons {
        1 => "1 stand-in MPS daemon".to_owned(),
        n => format!("{n} stand-in MPS daemons"),
    };
    format!(
        "bench: {}: {plugins}, killed {daemons}, removed {} scratch director{}; exiting with {}",
        caught.name(),
        stopped.scratch_removed,
        if stopped.scratch_removed == 1 {
            "y"
        } else {
            "ies"
        },
        caught.exit_code()
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exit_codes_are_those_of_a_shell() {
        assert_eq!(Caught::Interrupt.exit_code(), 130);
        assert_eq!(Caught::Terminate.exit_code(), 143);
        assert_eq!(Caught::Hangup.exit_code(), 129);
    }

    #[test]
    fn the_report_says_what_was_stopped() {
        assert_eq!(
            report(Caught::Terminate, &Stopped::default()),
            "bench: SIGTERM: no plugin was running, killed 0 stand-in MPS daemons, removed 0 scratch directories; exiting with 143"
        );
        let stopped = Stopped {
            plugins: vec![10, 11],
            killed: vec![11],
            daemons: 1,
            scratch_removed: 1,
        };
        assert_eq!(
            report(Caught::Interrupt, &stopped),
            "bench: SIGINT: stopped 2 plugins (pid 10, 11; SIGKILL after 3 s to 11), killed 1 stand-in MPS daemon, removed 1 scratch directory; exiting with 130"
        );
        let one = Stopped {
            plugins: vec![7],
            ..Stopped::default()
        };
        assert!(report(Caught::Hangup, &one).contains("stopped 1 plugin (pid 7),"));
    }
}
