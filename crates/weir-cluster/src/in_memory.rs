//! Every node's [`Owner`] (its pool behind the ownership fence) in one process, for tests and
//! simulation: a [`Transport`] that can make a node unreachable, to test what happens when an
//! owner crashes or is partitioned away.

use std::collections::{BTreeSet, HashMap};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use weir::Nanos;

use crate::messages::{BoxFuture, LeaseRequest, TransportError};
use crate::owner::Owner;
use crate::pool::Grant;
use crate::transport::Transport;

/// Every node's owner side in one process, with unreachable nodes.
#[derive(Debug, Default)]
pub struct InMemory {
    owners: Mutex<HashMap<String, Arc<Owner>>>,
    down: Mutex<BTreeSet<String>>,
}

impl InMemory {
    /// An empty network.
    pub fn new() -> Self {
        InMemory::default()
    }

    /// Adds a node's owner side.
    pub fn add(&self, node: &str, owner: Arc<Owner>) {
        self.owners
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(node.to_owned(), owner);
    }

    /// Makes a node unreachable (`down = true`) or reachable again.
    pub fn set_down(&self, node: &str, down: bool) {
        let mut set = self.down.lock().unwrap_or_else(|p| p.into_inner());
        if down {
            set.insert(node.to_owned());
        } else {
            set.remove(node);
        }
    }

    fn owner(&self, node: &str) -> Result<Arc<Owner>, TransportError> {
        if self
            .down
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .contains(node)
        {
            return Err(TransportError::Unreachable(node.to_owned()));
        }
        self.owners
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(node)
            .cloned()
            .ok_or_else(|| TransportError::Unreachable(node.to_owned()))
    }
}

impl Transport for InMemory {
    fn acquire(
        &self,
        owner: &str,
        request: LeaseRequest,
    ) -> BoxFuture<'_, Result<Grant, TransportError>> {
        let owner = self.owner(owner);
        Box::pin(async move { owner?.grant(&request) })
    }

    fn release(
        &self,
        owner: &str,
        bucket: &str,
        lease: u64,
    ) -> BoxFuture<'_, Result<(), TransportError>> {
        let owner = self.owner(owner);
        let bucket = bucket.to_owned();
        Box::pin(async move {
            owner?.release(&bucket, lease);
            Ok(())
        })
    }

    fn adopt(
        &self,
        owner: &str,
        bucket: &str,
        holder: &str,
        expires_at: Nanos,
        units: u64,
        lent: bool,
    ) -> BoxFuture<'_, Result<u64, TransportError>> {
        let owner = self.owner(owner);
        let (bucket, holder) = (bucket.to_owned(), holder.to_owned());
        Box::pin(async move { owner?.adopt(&bucket, &holder, expires_at, units, lent) })
    }

    fn give_back(
        &self,
        owner: &str,
        bucket: &str,
        lease: u64,
        units: u64,
    ) -> BoxFuture<'_, Result<(), TransportError>> {
        let owner = self.owner(owner);
        let bucket = bucket.to_owned();
        Box::pin(async move {
            owner?.give_back(&bucket, lease, units);
            Ok(())
        })
    }

    fn renew(
        &self,
        owner: &str,
        bucket: &str,
        lease: u64,
        ttl: Duration,
        now: Nanos,
        fenced: bool,
    ) -> BoxFuture<'_, Result<bool, TransportError>> {
        let owner = self.owner(owner);
        let bucket = bucket.to_owned();
        Box::pin(async move { Ok(owner?.renew(&bucket, lease, ttl, now, fenced)) })
    }
}
