//! `gpu-dra-controller`: the cluster-wide half of the driver (admission
//! webhook, claim lifecycle, ResourceSlice garbage collection). Built in the
//! controller issue; until then it only parses its flags.

use clap::Parser;

/// Flags of the controller.
#[derive(Debug, Parser)]
#[command(version, about = "GPU DRA controller (webhook and claim lifecycle)")]
struct Args {
    /// Path of a kubeconfig; in-cluster configuration when unset.
    #[arg(long, env = "KUBECONFIG")]
    kubeconfig: Option<std::path::PathBuf>,
}

fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    anyhow::bail!(
        "gpu-dra-controller is not implemented yet (kubeconfig: {:?})",
        args.kubeconfig
    )
}
