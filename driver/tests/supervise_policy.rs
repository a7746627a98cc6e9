//! The supervisor's restart policy with small programs in its place
//! (`/bin/sh` scripts that count their runs): crashes are restarted with
//! growing delays until the policy gives up, a clean exit and exit 2 end
//! supervision (a clean exit the supervisor did not ask for is a crash
//! under the MPS host's policy), a killed program is a crash, SIGTERM to
//! the supervisor is passed on and its status returned. One test function:
//! the supervisor reaps every child of this process (`waitpid(-1)`), so
//! nothing else may run beside it.

use std::ffi::OsString;
use std::fs;
use std::path::Path;
use std::time::{Duration, Instant};

use gpu_kubelet_plugin::supervise::{self, Policy};

fn policy() -> Policy {
    Policy {
        first_delay: Duration::from_millis(10),
        max_delay: Duration::from_millis(40),
        healthy_after: Duration::from_secs(30),
        max_quick_failures: 3,
        restart_clean_exits: false,
    }
}

/// The MPS daemon host's: a clean exit not asked for is restarted.
fn host_policy() -> Policy {
    Policy {
        restart_clean_exits: true,
        ..policy()
    }
}

/// Supervises `sh -c script` (run count appended to `<dir>/runs`) under
/// [`policy`]; returns the supervisor's status and how many runs there were.
fn supervise(dir: &Path, script: &str) -> (u8, usize) {
    supervise_under(&policy(), dir, script)
}

/// [`supervise`] under `policy`.
fn supervise_under(policy: &Policy, dir: &Path, script: &str) -> (u8, usize) {
    let runs = dir.join("runs");
    let _ = fs::remove_file(&runs);
    let script = format!("echo run >> '{}'; {script}", runs.display());
    let args: Vec<OsString> = ["-c", &script].map(OsString::from).to_vec();
    let code = supervise::run("script", Path::new("/bin/sh"), &args, policy).unwrap();
    let count = fs::read_to_string(&runs)
        .unwrap_or_default()
        .lines()
        .count();
    (code, count)
}

#[test]
fn restarts_crashes_until_the_policy_gives_up_and_passes_signals_on() {
    let dir = tempfile::tempdir().unwrap();

    // A crash (exit 1): started again three times, then given up with its status.
    let begun = Instant::now();
    assert_eq!(supervise(dir.path(), "exit 1"), (1, 4));
    // Delays 10 + 20 + 40 ms were waited.
    assert!(begun.elapsed() >= Duration::from_millis(70));

    // Killed by a signal: a crash too, ended with 128 + signal.
    assert_eq!(supervise(dir.path(), "kill -9 $$"), (137, 4));

    // A clean exit and a flag error end supervision at once.
    assert_eq!(supervise(dir.path(), "exit 0"), (0, 1));
    assert_eq!(supervise(dir.path(), "exit 2"), (2, 1));
    // Under the host's policy a clean exit is restarted like a crash; a
    // flag error is still final.
    assert_eq!(
        supervise_under(&host_policy(), dir.path(), "exit 0"),
        (0, 4)
    );
    assert_eq!(
        supervise_under(&host_policy(), dir.path(), "exit 2"),
        (2, 1)
    );

    // A crash once, then a clean run: restarted once.
    let flag = dir.path().join("crashed-once");
    let script = format!(
        "if [ -e '{f}' ]; then exit 0; fi; : > '{f}'; exit 5",
        f = flag.display()
    );
    assert_eq!(supervise(dir.path(), &script), (0, 2));

    // SIGTERM to the supervisor reaches the program, whose status it
    // returns; a clean exit on it is final under the host's policy too.
    for (policy, status) in [(policy(), 7), (host_policy(), 0)] {
        let ready = dir.path().join("ready");
        let _ = fs::remove_file(&ready);
        let script = format!(
            "trap 'exit {status}' TERM; : > '{}'; while :; do sleep 0.02; done",
            ready.display()
        );
        let sender = {
            let ready = ready.clone();
            std::thread::spawn(move || {
                let deadline = Instant::now() + Duration::from_secs(10);
                while !ready.exists() {
                    assert!(Instant::now() < deadline, "the program never started");
                    std::thread::sleep(Duration::from_millis(10));
                }
                rustix::process::kill_process(
                    rustix::process::getpid(),
                    rustix::process::Signal::TERM,
                )
                .unwrap();
            })
        };
        assert_eq!(supervise_under(&policy, dir.path(), &script), (status, 1));
        sender.join().unwrap();
    }
}
