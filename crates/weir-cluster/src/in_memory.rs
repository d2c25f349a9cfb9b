//! Every node's [`Owner`] (its pool behind the ownership fence) in one process, for tests and
//! simulation: a [`Transport`] that can make a node unreachable, to test what happens when an
//! owner crashes or is partitioned away.

use std::collections::{BTreeSet, HashMap};
use std::sync::{Arc, Mutex};

use crate::messages::{BoxFuture, TransportError};
use crate::owner::Owner;
use crate::transport::{Message, Reply, Transport, one_by_one};

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
    fn send(&self, owner: &str, message: Message) -> BoxFuture<'_, Result<Reply, TransportError>> {
        let batch = matches!(
            message,
            Message::AcquireBatch(_) | Message::ReleaseBatch(_) | Message::DecideBatch(_)
        );
        if batch {
            return one_by_one(self, owner, message);
        }
        let name = owner.to_owned();
        let owner = self.owner(owner);
        Box::pin(async move {
            let owner = owner?;
            Ok(match message {
                Message::Acquire(request) => Reply::Grant(owner.grant(&request)?),
                Message::Release { bucket, lease } => {
                    owner.release(&bucket, lease);
                    Reply::Done
                }
                Message::Adopt(adoption) => Reply::Adopted(owner.adopt(
                    &adoption.bucket,
                    &adoption.holder,
                    adoption.expires_at,
                    adoption.units,
                    adoption.lent,
                )?),
                Message::GiveBack {
                    bucket,
                    lease,
                    units,
                } => {
                    owner.give_back(&bucket, lease, units);
                    Reply::Done
                }
                Message::MovedAway {
                    bucket,
                    lease,
                    idle,
                } => {
                    owner.moved_away(&bucket, lease, idle);
                    Reply::Done
                }
                Message::Renew(renewal) => Reply::Renewed(owner.renew(
                    &renewal.bucket,
                    renewal.lease,
                    renewal.ttl,
                    renewal.now,
                    renewal.fenced,
                )),
                // Rate buckets and the census are the server's: an in-memory network of pools
                // has no one to answer them, so the asker goes on as it does without an owner.
                Message::Decide(_)
                | Message::HandOver(_)
                | Message::Report(_)
                | Message::Census { .. }
                | Message::AcquireBatch(_)
                | Message::ReleaseBatch(_)
                | Message::DecideBatch(_) => {
                    return Err(TransportError::Unreachable(name));
                }
            })
        })
    }
}
