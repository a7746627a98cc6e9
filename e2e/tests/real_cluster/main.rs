//! The driver on a real Kubernetes: `hack/cluster/up --with-driver` once, then
//! every test against the real kube-apiserver, kube-scheduler, kubelet and
//! containerd, each in its own namespace, then `hack/cluster/down`.
//!
//! A custom harness (libtest-mimic, same output and flags as the built-in
//! one) because the cluster is brought up once before the tests and taken
//! down after them. Tests run one at a time: some restart the plugin.
//!
//! When the cluster cannot run here (not root, binaries not built by
//! `hack/cluster/build`), every test is reported ignored after a loud
//! message, unless `GPU_DRA_E2E_REQUIRE_CLUSTER=1` (set by `.ci/run`), which
//! makes it a failure. `GPU_DRA_E2E_KEEP_CLUSTER=1` leaves the cluster up.

mod apiserver;
mod bench;
mod claims;
mod extended;
mod harness;
mod health;
mod metadata;
mod restarts;
mod security;
mod simulate;
mod vfio;
mod webhook;

use std::process::ExitCode;

use harness::Cluster;
use libtest_mimic::{Arguments, Failed, Trial};

/// A test: runs against the cluster, `Err` with what went wrong.
type Test = fn(&Cluster) -> Result<(), Failed>;
/// A test of the harness itself, without a cluster.
type Offline = fn() -> Result<(), Failed>;

fn tests() -> Vec<(&'static str, Test)> {
    let mut all: Vec<(&'static str, Test)> = Vec::new();
    all.extend(claims::TESTS);
    all.extend(extended::TESTS);
    all.extend(health::TESTS);
    all.extend(metadata::TESTS);
    all.extend(restarts::TESTS);
    all.extend(webhook::TESTS);
    all.extend(security::TESTS);
    all.extend(simulate::TESTS);
    all.extend(apiserver::TESTS);
    all.extend(vfio::TESTS);
    all
}

fn offline() -> Vec<(&'static str, Offline)> {
    let mut all: Vec<(&'static str, Offline)> = Vec::new();
    all.extend(harness::OFFLINE);
    all.extend(claims::OFFLINE);
    all
}

/// A trial of `test` on the cluster; whatever its outcome, its namespaces
/// are deleted after it, so the next one starts with every device free.
fn on_cluster(name: &'static str, test: Test, c: &Cluster) -> Trial {
    let c = c.clone();
    Trial::test(name, move || {
        let outcome = test(&c);
        let cleaned = c.delete_test_namespaces();
        outcome?;
        Ok(cleaned?)
    })
}

fn main() -> ExitCode {
    let mut args = Arguments::from_args();
    if args.test_threads.is_none() {
        args.test_threads = Some(1);
    }
    let benches = args.ignored || args.include_ignored;
    let wanted = tests()
        .into_iter()
        .filter(|_| !args.ignored)
        .chain(bench::BENCHES.into_iter().filter(|_| benches))
        .filter(|(name, _)| {
            args.filter.as_ref().is_none_or(|f| {
                if args.exact {
                    name == f
                } else {
                    name.contains(f.as_str())
                }
            })
        })
        .count();
    let cluster = if args.list || wanted == 0 {
        None
    } else {
        match Cluster::up_or_skip("real_cluster") {
            Ok(c) => c,
            Err(e) => {
                eprintln!("real_cluster: {e}");
                return ExitCode::FAILURE;
            }
        }
    };
    let mut trials: Vec<Trial> = offline()
        .into_iter()
        .map(|(name, test)| Trial::test(name, test))
        .collect();
    trials.extend(tests().into_iter().map(|(name, test)| match &cluster {
        Some(c) => on_cluster(name, test, c),
        None => Trial::test(name, || Ok(())).with_ignored_flag(true),
    }));
    // Benchmarks: ignored unless asked for (`-- --ignored bench::`).
    trials.extend(bench::BENCHES.into_iter().map(|(name, test)| {
        match &cluster {
            Some(c) => on_cluster(name, test, c),
            None => Trial::test(name, || Err("no cluster to measure".into())),
        }
        .with_ignored_flag(true)
    }));
    let conclusion = libtest_mimic::run(&args, trials);
    if let Some(c) = &cluster
        && let Err(e) = c.down()
    {
        eprintln!("real_cluster: {e}");
        return ExitCode::FAILURE;
    }
    conclusion.exit_code()
}
