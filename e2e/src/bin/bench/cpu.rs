//! Where a benchmark window's CPU time went: the plugin, this bench process
//! (the test API server and the kubelet simulator run in it) and the rest
//! of the machine (the stand-in MPS programs, kernel threads), read from
//! `/proc` before and after the window.
//!
//! Process times are `utime + stime` of `/proc/<pid>/stat` (the kernel
//! makes their sum the exact CPU time of the whole process, exited threads
//! included, and cuts it to clock ticks: each reading is at most one tick
//! short). The machine's time is the busy part of the `cpu` line of
//! `/proc/stat` (ticks counted where each tick lands, so a window of a few
//! ticks is only right on average over many windows). Report means over
//! many windows, not single ones.

use std::time::Duration;

use anyhow::Context as _;

use crate::table::ms;

/// CPU times read at one moment, in milliseconds since boot or start.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Reading {
    /// The plugin process.
    pub plugin: f64,
    /// This bench process.
    pub bench: f64,
    /// Every CPU of the machine, busy (not idle, not waiting for I/O).
    pub machine: f64,
}

/// CPU time spent between two readings, in milliseconds.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Spent {
    pub plugin: f64,
    pub bench: f64,
    pub machine: f64,
}

impl Spent {
    /// What neither the plugin nor this process used: other processes
    /// (the plugin's MPS stand-ins) and the kernel's own threads. Never
    /// below zero (the machine's count is sampled, see the module docs).
    pub fn rest(&self) -> f64 {
        (self.machine - self.plugin - self.bench).max(0.0)
    }

    /// The sum of `windows`, divided by their number (zero for none).
    pub fn mean(windows: &[Spent]) -> Spent {
        if windows.is_empty() {
            return Spent::default();
        }
        let n = windows.len() as f64;
        let sum = |f: fn(&Spent) -> f64| windows.iter().map(f).sum::<f64>() / n;
        Spent {
            plugin: sum(|s| s.plugin),
            bench: sum(|s| s.bench),
            machine: sum(|s| s.machine),
        }
    }
}

impl Reading {
    /// Reads the times of process `plugin`, of this process and of the
    /// machine.
    pub fn take(plugin: u32) -> anyhow::Result<Self> {
        let tick = tick();
        let read = |path: String| {
            std::fs::read_to_string(&path).with_context(|| format!("reading {path}"))
        };
        let process = |pid: String| -> anyhow::Result<f64> {
            let path = format!("/proc/{pid}/stat");
            let ticks = fake_driver_root::stat_cpu_ticks(&read(path.clone())?)
                .with_context(|| format!("{path}: no utime and stime"))?;
            Ok(ticks as f64 * ms(tick))
        };
        let machine = busy_ticks(&read("/proc/stat".to_owned())?)
            .context("/proc/stat: no cpu line")? as f64
            * ms(tick);
        Ok(Self {
            plugin: process(plugin.to_string())?,
            bench: process("self".to_owned())?,
            machine,
        })
    }

    /// What was spent from `earlier` to this reading.
    pub fn since(&self, earlier: &Reading) -> Spent {
        Spent {
            plugin: self.plugin - earlier.plugin,
            bench: self.bench - earlier.bench,
            machine: self.machine - earlier.machine,
        }
    }
}

/// One clock tick (`sysconf(_SC_CLK_TCK)`), the unit of `/proc` times.
fn tick() -> Duration {
    let per_second = u32::try_from(rustix::param::clock_ticks_per_second())
        .ok()
        .filter(|&t| t > 0)
        .unwrap_or(100);
    Duration::from_secs(1) / per_second
}

/// Busy ticks of all CPUs from a `/proc/stat` text: the `cpu` line's
/// user, nice, system, irq, softirq and steal (not idle, not iowait; guest
/// time is already counted in user).
fn busy_ticks(stat: &str) -> Option<u64> {
    let line = stat.lines().find(|l| l.starts_with("cpu "))?;
    let v: Vec<u64> = line
        .split_whitespace()
        .skip(1)
        .map(str::parse)
        .collect::<Result<_, _>>()
        .ok()?;
    // user nice system idle iowait irq softirq steal [guest guest_nice]
    let at = |i: usize| v.get(i).copied();
    Some(at(0)? + at(1)? + at(2)? + at(5)? + at(6)? + at(7).unwrap_or(0))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn process_times_are_counted_after_the_command_name() {
        // A command name with spaces and a ')' of its own.
        let stat = "42 (a) b (c)) S 1 42 42 0 -1 4194560 100 0 0 0 7 5 0 0 20 0 3 0 99 1000 200";
        assert_eq!(fake_driver_root::stat_cpu_ticks(stat), Some(12));
        assert_eq!(fake_driver_root::stat_cpu_ticks("42 (x) S 1 2"), None);
        assert_eq!(fake_driver_root::stat_cpu_ticks("no parenthesis"), None);
        let mine = std::fs::read_to_string("/proc/self/stat").unwrap();
        assert!(fake_driver_root::stat_cpu_ticks(&mine).is_some(), "{mine}");
    }

    #[test]
    fn machine_busy_time_leaves_out_idle_and_iowait() {
        let stat = "cpu  10 1 5 1000 300 2 3 4 0 0\ncpu0 5 0 2 500 150 1 1 2 0 0\nintr 1\n";
        assert_eq!(busy_ticks(stat), Some(10 + 1 + 5 + 2 + 3 + 4));
        // Old kernels stop after softirq.
        assert_eq!(busy_ticks("cpu  1 2 3 4 5 6 7\n"), Some(1 + 2 + 3 + 6 + 7));
        assert_eq!(busy_ticks("cpu  1 2 x\n"), None);
        assert_eq!(busy_ticks("intr 1\n"), None);
        let real = std::fs::read_to_string("/proc/stat").unwrap();
        assert!(busy_ticks(&real).is_some());
    }

    #[test]
    fn a_busy_loop_shows_in_this_process_and_the_machine() {
        let me = std::process::id();
        let before = Reading::take(me).unwrap();
        // Spin until this process has used 200 ms more (other tests may
        // share the CPUs, so wall time says little); a reader stuck on one
        // value never gets there.
        let deadline = std::time::Instant::now() + Duration::from_secs(20);
        let mut x = 0u64;
        let spent = loop {
            for _ in 0..100_000 {
                x = std::hint::black_box(x.wrapping_mul(31).wrapping_add(7));
            }
            let spent = Reading::take(me).unwrap().since(&before);
            if spent.bench >= 200.0 || std::time::Instant::now() > deadline {
                break spent;
            }
        };
        assert!(spent.bench >= 200.0, "{spent:?}");
        // The same process read twice, a tick or two apart at most.
        assert!((spent.plugin - spent.bench).abs() <= 20.0, "{spent:?}");
        // The machine's ticks are sampled: most of them, not all.
        assert!(spent.machine >= 100.0, "{spent:?}");
    }

    #[test]
    fn means_and_the_rest() {
        let a = Spent {
            plugin: 10.0,
            bench: 5.0,
            machine: 30.0,
        };
        let b = Spent {
            plugin: 20.0,
            bench: 15.0,
            machine: 30.0,
        };
        let m = Spent::mean(&[a, b]);
        assert_eq!((m.plugin, m.bench, m.machine), (15.0, 10.0, 30.0));
        assert!((m.rest() - 5.0).abs() < 1e-9, "{m:?}");
        assert!(
            b.rest().abs() < 1e-9,
            "a sampled machine count below the parts"
        );
        assert_eq!(Spent::mean(&[]), Spent::default());
    }
}
