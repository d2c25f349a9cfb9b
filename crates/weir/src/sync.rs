//! The atomic word every lock-free limiter state is built on.
//!
//! Normally the standard library's. Built with `--cfg loom`, it is loom's, so that the models in
//! `loom_models.rs` can explore every interleaving of decisions, reservations, give-backs and
//! reshapes over the very code that runs in production (`.ci/run` runs them).

#[cfg(loom)]
pub(crate) use loom::sync::atomic::AtomicU64;
#[cfg(not(loom))]
pub(crate) use std::sync::atomic::AtomicU64;
