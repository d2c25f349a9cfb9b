//! Compiles Weir's own API (`proto/weir/v1/weir.proto`) and Envoy's rate limit and rate limit
//! quota services (`proto/envoy/…`, trimmed; see `proto/envoy/README.md`) with the `protoc` that ships inside
//! the `protoc-bin-vendored` crate, so a fresh machine builds with cargo alone.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let protoc = protoc_bin_vendored::protoc_bin_path()?;
    let well_known = protoc_bin_vendored::include_path()?;
    let well_known = well_known
        .to_str()
        .ok_or("the vendored protoc's include path is not UTF-8")?;
    let includes = ["proto", well_known];

    let mut config = prost_build::Config::new();
    config.protoc_executable(&protoc);
    // Malformed requests are INVALID_ARGUMENT, not INTERNAL: see src/codec.rs.
    tonic_prost_build::configure()
        .codec_path("crate::codec::WeirCodec")
        .compile_with_config(config, &["proto/weir/v1/weir.proto"], &includes)?;

    let mut config = prost_build::Config::new();
    config.protoc_executable(&protoc);
    tonic_prost_build::configure()
        .codec_path("crate::codec::WeirCodec")
        .compile_with_config(
            config,
            // One call for both: they share `envoy.type.v3`, whose generated file each call
            // would otherwise write over.
            &[
                "proto/envoy/service/ratelimit/v3/rls.proto",
                "proto/envoy/service/rate_limit_quota/v3/rlqs.proto",
            ],
            &includes,
        )?;
    println!("cargo:rerun-if-changed=proto");
    Ok(())
}
