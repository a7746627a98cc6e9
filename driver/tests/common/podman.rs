//! Setup shared by the tests in which podman runs a container with the CDI
//! ids the plugin returned: an environment whose plugin writes its specs
//! into the one CDI directory Debian's podman 4.3 reads, a driver name of
//! the test's own (so the plugin's startup sweep of unreferenced specs only
//! sees that test's files), the kubelet connection, and the prepared ids.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;

use gpu_dra_e2e::podman::CdiSpecFile;
use gpu_dra_sim::kubelet::{Claim, KubeletSim, PrepareResult};

use super::{Plugin, TestEnv};

/// The CDI directory podman reads.
pub const CDI_ROOT: &str = "/var/run/cdi";

/// A driver name of this test process's own, `e2e<pid>.<what>.example.com`;
/// its CDI vendor is `k8s.<driver>`.
pub fn driver_name(what: &str) -> String {
    format!("e2e{}.{what}.example.com", std::process::id())
}

/// An environment on bundled machine `profile` whose CDI specs go to
/// [`CDI_ROOT`].
pub fn env(dir: &Path, profile: &str) -> Arc<TestEnv> {
    Arc::new(
        TestEnv::builder(dir)
            .bundled(profile)
            .cdi_root(Path::new(CDI_ROOT))
            .build(),
    )
}

/// A kubelet simulator registered with `plugin` (run as `driver`) and a
/// client of its test API server.
pub async fn connect(
    plugin: &Plugin,
    driver: &str,
) -> (gpu_dra_sim::kubelet::Plugin, kube::Client) {
    let kubelet = KubeletSim::new()
        .register(&plugin.reg_dir.join(format!("{driver}-reg.sock")))
        .await
        .unwrap();
    let config = kube::Config::new(plugin.env.api.url().parse().unwrap());
    (kubelet, kube::Client::try_from(config).unwrap())
}

/// `claim`'s spec file under [`CDI_ROOT`], removed when dropped (also when
/// an assertion fails).
pub fn spec_of(driver: &str, claim: &Claim) -> CdiSpecFile {
    CdiSpecFile::adopt(format!("{CDI_ROOT}/k8s.{driver}-claim_{}.json", claim.uid))
}

/// The CDI ids the plugin returned for `claim`; fails the test (with the
/// plugin's log) when its prepare failed.
pub fn cdi_ids(
    answers: &BTreeMap<String, PrepareResult>,
    claim: &Claim,
    plugin: &Plugin,
) -> Vec<String> {
    let answer = &answers[&claim.uid];
    assert!(
        answer.error.is_none(),
        "{:?}\n{}",
        answer.error,
        plugin.stderr()
    );
    answer
        .devices
        .iter()
        .flat_map(|d| d.cdi_device_ids.clone())
        .collect()
}
