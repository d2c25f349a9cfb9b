//! Entity tags of policies: what a conditional write compares, and what `/metrics` hashes.

use weir::policy::PolicyConfig;

/// A stable tag of a policy's content (FNV-1a over its JSON form).
pub fn etag_of(config: &PolicyConfig) -> String {
    let bytes = serde_json::to_vec(config).unwrap_or_default();
    let hash = bytes.iter().fold(0xcbf2_9ce4_8422_2325_u64, |h, &b| {
        (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3)
    });
    format!("\"{hash:016x}\"")
}
