//! Memory-fraction sharing at the plugin's command line: a malformed
//! `--memory-sharing` stops the plugin with one line. Publication to
//! allocation (the published shares allocated by the project's allocator)
//! is tested in `e2e/tests/memory_sharing.rs`: the plugin does not depend on
//! the analysis crate, not even for its tests.

mod common;

use common::short_dir;

#[tokio::test]
async fn a_malformed_flag_stops_the_plugin_with_one_line() {
    let dir = short_dir();
    let (status, stderr) = common::run_to_exit(&["--memory-sharing", "0,MIG-1234"], dir.path());
    common::assert_one_line_error(status, &stderr, "--memory-sharing");
    assert!(
        stderr.contains("entry 2: \"MIG-1234\" is a MIG device"),
        "{stderr}"
    );
}
