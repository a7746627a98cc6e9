//! Bad input on the way to the first pool: no NVML, a library that is not
//! NVML, a malformed fake-NVML profile, NVML refusing to initialise, and no
//! usable Kubernetes configuration. Each is one `error:` line naming the
//! problem, exit status 1, no panic, and nothing left behind (no sockets,
//! no slices).

mod common;

use std::path::Path;
use std::process::ExitStatus;

use common::{NODE, TestEnv, assert_one_line_error, run_bare, short_dir};

/// The plugin's own flags for `dir`, plus `extra`.
fn args<'a>(dir: &'a Path, extra: &[&'a str]) -> Vec<String> {
    let mut v: Vec<String> = [
        "--node-name",
        NODE,
        "--kubelet-registrar-dir",
        dir.join("reg").to_str().unwrap(),
        "--kubelet-plugins-dir",
        dir.join("plugins").to_str().unwrap(),
    ]
    .iter()
    .map(|s| (*s).to_owned())
    .collect();
    v.extend(extra.iter().map(|s| (*s).to_owned()));
    v
}

fn run(dir: &Path, extra: &[&str], envs: &[(&str, &str)]) -> (ExitStatus, String) {
    let all = args(dir, extra);
    let all: Vec<&str> = all.iter().map(String::as_str).collect();
    run_bare(&all, envs, dir)
}

/// Exit status 1, one error line with `needle`, nothing created.
fn assert_clean_failure(dir: &Path, status: ExitStatus, stderr: &str, needle: &str) {
    assert_eq!(status.code(), Some(1), "{stderr}");
    assert_one_line_error(status, stderr, needle);
    assert!(!dir.join("reg").exists(), "registration directory created");
    assert!(!dir.join("plugins").exists(), "plugins directory created");
}

#[test]
fn no_nvml_library_is_a_clear_error() {
    let dir = short_dir();
    let env = TestEnv::new(dir.path());
    let missing = dir.path().join("nowhere/libnvidia-ml.so.1");
    let kubeconfig = env.kubeconfig.to_str().unwrap();
    let (status, stderr) = run(
        dir.path(),
        &[
            "--nvml-lib",
            missing.to_str().unwrap(),
            "--kubeconfig",
            kubeconfig,
        ],
        &[],
    );
    assert_clean_failure(
        dir.path(),
        status,
        &stderr,
        &format!("cannot initialise NVML from {}", missing.display()),
    );
    assert!(stderr.contains("cannot be loaded"), "{stderr}");
    assert!(env.slices(NODE).is_empty());
}

#[test]
fn a_file_that_is_not_nvml_is_a_clear_error() {
    let dir = short_dir();
    let env = TestEnv::new(dir.path());
    let kubeconfig = env.kubeconfig.to_str().unwrap();
    // Not a shared object at all, and a shared object without NVML in it.
    let text = dir.path().join("libnvidia-ml.so.1");
    std::fs::write(&text, "#!/bin/sh\necho not a library\n").unwrap();
    let libc = [
        "/lib/x86_64-linux-gnu/libm.so.6",
        "/usr/lib/x86_64-linux-gnu/libm.so.6",
    ]
    .into_iter()
    .find(|p| Path::new(p).exists());
    for (lib, needle) in [(text.to_str().unwrap(), "cannot be loaded")]
        .into_iter()
        .chain(libc.map(|l| (l, "lacks NVML's entry points")))
    {
        let (status, stderr) = run(
            dir.path(),
            &["--nvml-lib", lib, "--kubeconfig", kubeconfig],
            &[],
        );
        assert_clean_failure(
            dir.path(),
            status,
            &stderr,
            &format!("cannot initialise NVML from {lib}"),
        );
        assert!(stderr.contains(needle), "{lib}: {stderr}");
    }
}

#[test]
fn a_malformed_profile_fails_nvml_init_with_a_message_naming_the_problem() {
    let good =
        std::fs::read_to_string(nvidia_ml::fixture::bundled_profile("t4-inference")).unwrap();
    for (broken, problem) in [
        (
            good.replacen(
                "GPU-3f98e277-4cbd-47ad-9c90-a9587403e430",
                "GPU-not-a-uuid",
                1,
            ),
            "GPU-not-a-uuid",
        ),
        (good.replacen("minor: 1\n", "minor: 0\n", 1), "minor"),
        ("gpus: [{{{".to_owned(), "profile"),
        (good.replacen("model: T4", "model: T5000", 1), "T5000"),
    ] {
        let dir = short_dir();
        let env = TestEnv::builder(dir.path()).yaml(&broken).build();
        let (status, stderr) = run(dir.path(), &env_args(&env), &[]);
        // The plugin's one error line names the library, NVML's code and the
        // fake library's own explanation (from `mockNvmlLastError`), which
        // names the problem.
        assert_clean_failure(
            dir.path(),
            status,
            &stderr,
            &format!("cannot initialise NVML from {}", env.library.display()),
        );
        let error_line = stderr.lines().last().unwrap();
        assert!(
            error_line
                .contains("internal driver error occurred: nvmlInit failed (UNKNOWN): profile "),
            "{error_line}"
        );
        assert!(
            error_line.contains(problem),
            "{problem:?} not in {error_line}"
        );
        // The same explanation the library printed on its own line.
        let mock_line = stderr
            .lines()
            .find(|l| l.starts_with("mock-nvml: nvmlInit failed"))
            .unwrap_or_else(|| panic!("no mock message: {stderr}"));
        let explanation = mock_line.strip_prefix("mock-nvml: ").unwrap();
        assert!(
            error_line.ends_with(explanation),
            "{explanation:?} not at the end of {error_line}"
        );
        assert!(env.slices(NODE).is_empty());
    }
}

fn env_args(env: &TestEnv) -> Vec<&str> {
    vec![
        "--nvml-lib",
        env.library.to_str().unwrap(),
        "--sysfs-root",
        env.sysfs.to_str().unwrap(),
        "--kubeconfig",
        env.kubeconfig.to_str().unwrap(),
    ]
}

#[test]
fn nvml_refusing_to_initialise_is_a_clear_error() {
    let dir = short_dir();
    let yaml = format!(
        "fail: {{nvmlInit: DRIVER_NOT_LOADED}}\n{}",
        std::fs::read_to_string(nvidia_ml::fixture::bundled_profile("t4-inference")).unwrap()
    );
    let env = TestEnv::builder(dir.path()).yaml(&yaml).build();
    let (status, stderr) = run(dir.path(), &env_args(&env), &[]);
    assert_clean_failure(
        dir.path(),
        status,
        &stderr,
        "the NVIDIA kernel driver is not loaded",
    );
}

#[test]
fn no_kubeconfig_outside_a_cluster_is_a_clear_error() {
    let dir = short_dir();
    let env = TestEnv::new(dir.path());
    let home = dir.path().join("home");
    std::fs::create_dir(&home).unwrap();
    let (status, stderr) = run(
        dir.path(),
        &[
            "--nvml-lib",
            env.library.to_str().unwrap(),
            "--sysfs-root",
            env.sysfs.to_str().unwrap(),
        ],
        // An empty home: no ~/.kube/config. No KUBERNETES_SERVICE_HOST.
        &[("HOME", home.to_str().unwrap())],
    );
    assert_clean_failure(
        dir.path(),
        status,
        &stderr,
        "no Kubernetes API configuration: pass --kubeconfig (or KUBECONFIG), or run in a cluster",
    );
    assert!(stderr.contains("in-cluster"), "{stderr}");
}

#[test]
fn a_missing_or_malformed_kubeconfig_is_a_clear_error() {
    let dir = short_dir();
    let env = TestEnv::new(dir.path());
    let missing = dir.path().join("no-such-kubeconfig");
    let garbage = dir.path().join("garbage-kubeconfig");
    std::fs::write(&garbage, "clusters: [[[\n").unwrap();
    let no_server = dir.path().join("no-server-kubeconfig");
    std::fs::write(
        &no_server,
        "apiVersion: v1\nkind: Config\nclusters: [{name: c, cluster: {}}]\ncontexts: [{name: x, context: {cluster: c, user: u}}]\ncurrent-context: x\nusers: [{name: u, user: {}}]\n",
    )
    .unwrap();
    for (path, detail) in [
        (&missing, "No such file"),
        (&garbage, "yaml"),
        (&no_server, "cluster url"),
    ] {
        let (status, stderr) = run(
            dir.path(),
            &[
                "--nvml-lib",
                env.library.to_str().unwrap(),
                "--sysfs-root",
                env.sysfs.to_str().unwrap(),
                "--kubeconfig",
                path.to_str().unwrap(),
            ],
            &[],
        );
        assert_clean_failure(
            dir.path(),
            status,
            &stderr,
            &format!("cannot use kubeconfig {}", path.display()),
        );
        let last = stderr.lines().last().unwrap().to_lowercase();
        assert!(
            last.contains(&detail.to_lowercase()),
            "{detail:?} not in {last}"
        );
    }
}
