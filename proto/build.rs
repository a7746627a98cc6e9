//! Generates the tonic client and server code for the kubelet protocols.
//! protoc comes from `protoc-bin-vendored`, so a fresh machine needs nothing
//! but cargo.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let protos = [
        "proto/dra_v1.proto",
        "proto/dra_v1beta1.proto",
        "proto/pluginregistration.proto",
        "proto/health_v1alpha1.proto",
        "proto/health_v1.proto",
    ];
    for p in &protos {
        println!("cargo:rerun-if-changed={p}");
    }
    let mut cfg = tonic_prost_build::Config::new();
    cfg.protoc_executable(protoc_bin_vendored::protoc_bin_path()?);
    tonic_prost_build::configure()
        .build_client(true)
        .build_server(true)
        .compile_with_config(cfg, &protos, &["proto"])?;
    Ok(())
}
