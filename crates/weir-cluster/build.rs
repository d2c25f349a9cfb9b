//! Compiles the node-to-node protocol with the vendored `protoc` (no system protoc needed).

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut config = prost_build::Config::new();
    config.protoc_executable(protoc_bin_vendored::protoc_bin_path()?);
    tonic_prost_build::configure().compile_with_config(
        config,
        &["proto/weir/cluster/v1/cluster.proto"],
        &["proto"],
    )?;
    Ok(())
}
