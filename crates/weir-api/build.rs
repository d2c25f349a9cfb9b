//! Compiles `proto/weir/v1/weir.proto` with the `protoc` that ships inside the
//! `protoc-bin-vendored` crate, so a fresh machine builds with cargo alone.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut config = prost_build::Config::new();
    config.protoc_executable(protoc_bin_vendored::protoc_bin_path()?);
    // Malformed requests are INVALID_ARGUMENT, not INTERNAL: see src/codec.rs.
    tonic_prost_build::configure()
        .codec_path("crate::codec::WeirCodec")
        .compile_with_config(config, &["proto/weir/v1/weir.proto"], &["proto"])?;
    Ok(())
}
