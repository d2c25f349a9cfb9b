//! The cluster secret: what proves that a gossip datagram or a node-to-node call comes from a
//! member of this cluster.
//!
//! Without it, anyone who can reach a node's gossip port can join the ring (and own buckets),
//! and anyone who can reach its gRPC port can take or release shared leases. With it:
//!
//! - every member advertises, beside its id and gRPC address, a *proof*: a keyed BLAKE3 hash of
//!   its cluster, id, gRPC address, protocol and role under a key derived from the secret. A
//!   member without the right proof is left out of the ring: nobody asks it for leases and it
//!   owns nothing. Gossip itself stays readable and writable by whoever reaches the port, so a
//!   stranger there can still disturb membership (deny service) — keep gossip on a private
//!   network — but cannot join: a proof copied from a member names that member's own gRPC
//!   address, where calls still reach the member itself.
//! - every node-to-node gRPC call carries a token derived from the secret in its metadata
//!   (`x-weir-cluster-token`); a call without it is `UNAUTHENTICATED`. The secret itself never
//!   crosses the wire, but the token does, in clear text unless the gRPC port is behind TLS:
//!   someone who can read the traffic between nodes can replay it.
//!
//! The two keys are derived with BLAKE3's key derivation, each under its own context string,
//! so knowing one says nothing about the other or about the secret.

use tonic::metadata::{Ascii, MetadataValue};
use tonic::{Request, Status};

/// The fewest characters a cluster secret must have.
pub const MIN_SECRET_CHARS: usize = 16;

/// The metadata key of the node-to-node token.
pub const TOKEN_METADATA: &str = "x-weir-cluster-token";

const PROOF_CONTEXT: &str = "weir cluster 2026-11 member proof";
const GRPC_CONTEXT: &str = "weir cluster 2026-11 node-to-node grpc token";

/// A secret that cannot be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SecretError {
    /// Blank or too short to resist guessing.
    #[error(
        "the cluster secret has {chars} characters besides blanks; it needs at least {MIN_SECRET_CHARS} (e.g. `openssl rand -hex 16`)"
    )]
    TooShort {
        /// Its characters, blanks at either end aside.
        chars: usize,
    },
}

/// The keys derived from a cluster's secret; see the [module docs](self).
#[derive(Clone)]
pub struct ClusterSecret {
    proof_key: [u8; 32],
    token: MetadataValue<Ascii>,
}

impl std::fmt::Debug for ClusterSecret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ClusterSecret(..)")
    }
}

impl ClusterSecret {
    /// The keys of `secret`, which must have at least [`MIN_SECRET_CHARS`] characters besides
    /// blanks at either end.
    pub fn new(secret: &str) -> Result<Self, SecretError> {
        let chars = secret.trim().chars().count();
        if chars < MIN_SECRET_CHARS {
            return Err(SecretError::TooShort { chars });
        }
        let token = blake3::derive_key(GRPC_CONTEXT, secret.as_bytes());
        let token = blake3::Hash::from(token).to_hex();
        Ok(ClusterSecret {
            proof_key: blake3::derive_key(PROOF_CONTEXT, secret.as_bytes()),
            token: MetadataValue::try_from(token.as_str()).expect("hex is valid metadata"),
        })
    }

    /// The proof a member advertises for what it says about itself (`fields`: its cluster,
    /// id, gRPC address, protocol and role, in that order), in hex.
    pub fn prove(&self, fields: &[&str]) -> String {
        self.proof_of(fields).to_hex().to_string()
    }

    /// Whether `proof` is the proof of `fields`.
    pub fn verify(&self, fields: &[&str], proof: &str) -> bool {
        // `Hash` compares in constant time.
        blake3::Hash::from_hex(proof).is_ok_and(|proof| proof == self.proof_of(fields))
    }

    fn proof_of(&self, fields: &[&str]) -> blake3::Hash {
        let mut hasher = blake3::Hasher::new_keyed(&self.proof_key);
        for field in fields {
            // Length-prefixed, so that no two lists of fields hash the same bytes.
            hasher.update(&(field.len() as u64).to_le_bytes());
            hasher.update(field.as_bytes());
        }
        hasher.finalize()
    }

    /// The interceptor a node's cluster service checks calls with.
    pub fn require(&self) -> RequireToken {
        RequireToken(Some(self.token.clone()))
    }

    /// The interceptor a node's calls to others carry the token with.
    pub fn attach(&self) -> AttachToken {
        AttachToken(Some(self.token.clone()))
    }
}

/// A gRPC interceptor that refuses calls without the cluster's token (lets every call through
/// when the cluster has no secret).
#[derive(Debug, Clone, Default)]
pub struct RequireToken(Option<MetadataValue<Ascii>>);

impl tonic::service::Interceptor for RequireToken {
    fn call(&mut self, request: Request<()>) -> Result<Request<()>, Status> {
        let Some(expected) = &self.0 else {
            return Ok(request);
        };
        let given = request.metadata().get(TOKEN_METADATA);
        let matches =
            given.is_some_and(|given| constant_time_eq(given.as_bytes(), expected.as_bytes()));
        if matches {
            Ok(request)
        } else {
            Err(Status::unauthenticated(
                "node-to-node calls need this cluster's secret (`cluster_secret` in [server], or WEIR_CLUSTER_SECRET)",
            ))
        }
    }
}

/// A gRPC interceptor that adds the cluster's token to a call (adds nothing when the cluster
/// has no secret).
#[derive(Debug, Clone, Default)]
pub struct AttachToken(Option<MetadataValue<Ascii>>);

impl tonic::service::Interceptor for AttachToken {
    fn call(&mut self, mut request: Request<()>) -> Result<Request<()>, Status> {
        if let Some(token) = &self.0 {
            request.metadata_mut().insert(TOKEN_METADATA, token.clone());
        }
        Ok(request)
    }
}

/// Compares without an early exit, so the time taken says nothing about where they differ.
fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

#[cfg(test)]
mod tests {
    use tonic::service::Interceptor;

    use super::*;

    fn secret(s: &str) -> ClusterSecret {
        ClusterSecret::new(s).unwrap()
    }

    #[test]
    fn a_short_or_blank_secret_is_refused_naming_the_minimum() {
        let error = ClusterSecret::new("   short   ").unwrap_err();
        assert_eq!(error, SecretError::TooShort { chars: 5 });
        assert!(error.to_string().contains("at least 16"), "{error}");
        assert!(ClusterSecret::new(&" ".repeat(40)).is_err());
        assert!(ClusterSecret::new("0123456789abcdef").is_ok());
    }

    #[test]
    fn a_proof_holds_for_the_same_secret_and_fields_only() {
        let ours = secret("correct horse battery staple");
        let theirs = secret("correct horse battery stapler");
        let fields = ["weir", "n1", "http://10.0.0.1:50051", "1", "true"];
        let proof = ours.prove(&fields);
        assert!(ours.verify(&fields, &proof));
        assert!(!theirs.verify(&fields, &proof), "another secret");
        let moved = ["weir", "n1", "http://10.6.6.6:50051", "1", "true"];
        assert!(!ours.verify(&moved, &proof), "another gRPC address");
        assert!(!ours.verify(
            &["weir", "n1http://10.0.0.1:50051", "", "1", "true"],
            &proof
        ));
        assert!(!ours.verify(&fields, "not hex"));
        assert!(!ours.verify(&fields, ""));
    }

    #[test]
    fn calls_need_the_token_of_the_same_secret() {
        let ours = secret("correct horse battery staple");
        let theirs = secret("correct horse battery stapler");
        let signed = |by: &ClusterSecret| by.attach().call(Request::new(())).unwrap();
        assert!(ours.require().call(signed(&ours)).is_ok());
        let refused = ours.require().call(signed(&theirs)).unwrap_err();
        assert_eq!(refused.code(), tonic::Code::Unauthenticated);
        assert!(ours.require().call(Request::new(())).is_err(), "no token");
        assert!(
            RequireToken::default().call(Request::new(())).is_ok(),
            "without a secret, nothing is checked"
        );
        let plain = AttachToken::default().call(Request::new(())).unwrap();
        assert!(plain.metadata().get(TOKEN_METADATA).is_none());
    }
}
