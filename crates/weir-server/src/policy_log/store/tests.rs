//! The log store and the state machine run through openraft's own conformance suite: the
//! cases every storage of the library must pass (log state, reads, truncation, purging,
//! votes, membership, snapshots), each on a fresh database in a temporary directory.

use openraft::StorageError;
use openraft::testing::{StoreBuilder, Suite};

use super::Store;
use crate::policy_log::PolicyRaft;
use crate::policy_log::machine::Machine;

struct OnDisk;

impl StoreBuilder<PolicyRaft, Store, Machine, tempfile::TempDir> for OnDisk {
    async fn build(&self) -> Result<(tempfile::TempDir, Store, Machine), StorageError<u64>> {
        let dir = tempfile::tempdir().expect("a temporary directory");
        let store = Store::open(dir.path()).expect("the database opens");
        let machine = Machine::open(store.clone()).expect("the state machine opens");
        Ok((dir, store, machine))
    }
}

#[test]
fn the_store_passes_openraft_s_own_suite() {
    Suite::test_all(OnDisk).unwrap();
}

#[test]
fn what_was_written_is_there_after_a_reopen() {
    use openraft::storage::RaftLogStorage;
    use openraft::{CommittedLeaderId, LogId, Vote};

    let dir = tempfile::tempdir().unwrap();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap();
    runtime.block_on(async {
        let mut store = Store::open(dir.path()).unwrap();
        store.save_vote(&Vote::new(3, 7)).await.unwrap();
        let committed = LogId::new(CommittedLeaderId::new(3, 7), 12);
        store.save_committed(Some(committed)).await.unwrap();
        drop(store);
        // Reopened, as after a crash: the vote and the commit point are as written.
        let mut store = Store::open(dir.path()).unwrap();
        assert_eq!(store.read_vote().await.unwrap(), Some(Vote::new(3, 7)));
        assert_eq!(store.read_committed().await.unwrap(), Some(committed));
    });
}
