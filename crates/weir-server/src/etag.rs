//! Entity tags of policies: what a conditional write compares, and what `/metrics` hashes; and
//! the version of a whole policy set, which cluster members compare.

use weir::SystemClock;
use weir::policy::{PolicyConfig, PolicySet};

/// FNV-1a's offset basis: the hash of nothing.
const FNV_BASIS: u64 = 0xcbf2_9ce4_8422_2325;

/// `hash` carried on over `bytes` (FNV-1a).
fn fnv(hash: u64, bytes: impl IntoIterator<Item = u8>) -> u64 {
    bytes.into_iter().fold(hash, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3)
    })
}

/// A stable tag of a policy's content (FNV-1a over its JSON form).
pub fn etag_of(config: &PolicyConfig) -> String {
    let bytes = serde_json::to_vec(config).unwrap_or_default();
    format!("\"{:016x}\"", fnv(FNV_BASIS, bytes))
}

/// The version of the policies in force: a hash of them all, by name and entity tag — the same
/// on every node that runs the same policies, different as soon as one differs
/// (`weir_config_info{hash}`, and what cluster members compare).
pub fn version_of(policies: &PolicySet<SystemClock>) -> String {
    let mut tagged: Vec<(String, String)> = policies
        .policies()
        .iter()
        .map(|p| {
            let config = p.config();
            let etag = etag_of(&config);
            (config.name, etag)
        })
        .collect();
    tagged.sort();
    let bytes = tagged
        .iter()
        .flat_map(|(name, etag)| name.bytes().chain([0]).chain(etag.bytes()).chain([0]));
    format!("{:016x}", fnv(FNV_BASIS, bytes))
}
