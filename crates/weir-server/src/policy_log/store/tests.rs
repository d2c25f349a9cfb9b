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

/// Opens `bytes` as `raft.redb`: it loads, or the error names the file — never a panic.
fn opened_or_named(bytes: &[u8], what: &str) -> bool {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join(super::FILE), bytes).unwrap();
    match Store::open(dir.path()) {
        Ok(_) => true,
        Err(error) => {
            let text = error.to_string();
            assert!(
                text.contains(super::FILE),
                "{what}: the error names the file: {text}"
            );
            false
        }
    }
}

#[test]
fn a_damaged_log_is_refused_by_name_never_a_panic_or_a_fresh_start() {
    let dir = tempfile::tempdir().unwrap();
    {
        let store = Store::open(dir.path()).unwrap();
        for i in 0..200u32 {
            store.write(&format!("record-{i}"), &vec![i; 40]).unwrap();
        }
    }
    let whole = std::fs::read(dir.path().join(super::FILE)).unwrap();
    assert!(opened_or_named(&whole, "whole"));
    assert!(
        !opened_or_named(&[], "empty"),
        "0 bytes is damage, not a new log"
    );
    for (what, bytes) in crate::data_file::damaged_copies(&whole) {
        opened_or_named(&bytes, &what);
    }
}

#[test]
fn a_log_of_a_newer_format_is_refused_by_name_and_left_as_it_is() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join(super::FILE);
    {
        let store = Store::open(dir.path()).unwrap();
        store.write("record", &[1, 2, 3]).unwrap();
    }
    let record = |format| {
        let db = redb::Database::create(&path).unwrap();
        crate::data_file::record_format(&db, format);
    };
    record(super::FORMAT + 1);
    let text = Store::open(dir.path()).unwrap_err().to_string();
    assert!(text.contains(super::FILE), "{text}");
    assert!(text.contains("was written by a newer Weir"), "{text}");
    // Nothing was lost by the refusal.
    record(super::FORMAT);
    let store = Store::open(dir.path()).unwrap();
    assert_eq!(
        store.read::<Vec<u32>>("record").unwrap(),
        Some(vec![1, 2, 3])
    );
}
