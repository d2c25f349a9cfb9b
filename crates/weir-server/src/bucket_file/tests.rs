use super::*;

fn bucket(policy: &str, kind: Option<&str>, key: &str, whole_at: u64) -> KeptBucket {
    KeptBucket {
        policy: policy.to_owned(),
        kind: kind.map(str::to_owned),
        key: key.to_owned(),
        whole_at,
        used: 7,
        remaining: 3,
    }
}

fn sorted(mut buckets: Vec<KeptBucket>) -> Vec<KeptBucket> {
    buckets.sort_by(|a, b| (&a.policy, &a.kind, &a.key).cmp(&(&b.policy, &b.kind, &b.key)));
    buckets
}

#[test]
fn buckets_written_are_read_back_after_the_file_is_opened_again() {
    let dir = tempfile::tempdir().unwrap();
    let written = vec![
        bucket("day", None, "tenant-a", 100),
        bucket("day", Some("bulk"), "tenant-a", 200),
        // A key may hold any character, the separator of a joined key included.
        bucket("day", None, "a\0b", 300),
    ];
    {
        let file = BucketFile::open(dir.path()).unwrap();
        file.write(Changes {
            buckets: &written,
            ..Changes::default()
        })
        .unwrap();
    }
    let file = BucketFile::open(dir.path()).unwrap();
    assert_eq!(sorted(file.read_all().unwrap()), sorted(written));
}

#[test]
fn a_write_replaces_a_bucket_and_removes_the_whole_ones() {
    let dir = tempfile::tempdir().unwrap();
    let file = BucketFile::open(dir.path()).unwrap();
    let cell = |key: &[u8], whole_at| KeptCell {
        key: key.to_vec(),
        whole_at,
        interval: 10,
        tolerance: 160,
    };
    file.write(Changes {
        buckets: &[bucket("day", None, "a", 100), bucket("day", None, "b", 200)],
        cells: &[cell(b"x", 100), cell(b"\xff not text", 200)],
        whole_by: None,
    })
    .unwrap();
    let mut again = bucket("day", None, "b", 300);
    again.remaining = 1;
    // `a` and `x` are whole by 150; `b` written again.
    file.write(Changes {
        buckets: std::slice::from_ref(&again),
        cells: &[],
        whole_by: Some(150),
    })
    .unwrap();
    assert_eq!(file.read_all().unwrap(), [again]);
    assert_eq!(file.read_cells().unwrap(), [cell(b"\xff not text", 200)]);
}

/// A file backend whose writes fail with "no space left on device" while `full` is set, as a
/// full disk does.
#[derive(Debug)]
struct FillingDisk {
    file: redb::backends::FileBackend,
    full: std::sync::Arc<std::sync::atomic::AtomicBool>,
}

impl FillingDisk {
    fn check(&self) -> Result<(), std::io::Error> {
        match self.full.load(Ordering::Relaxed) {
            true => Err(std::io::Error::from(std::io::ErrorKind::StorageFull)),
            false => Ok(()),
        }
    }
}

impl redb::StorageBackend for FillingDisk {
    fn len(&self) -> Result<u64, std::io::Error> {
        self.file.len()
    }
    fn read(&self, offset: u64, len: usize) -> Result<Vec<u8>, std::io::Error> {
        self.file.read(offset, len)
    }
    fn set_len(&self, len: u64) -> Result<(), std::io::Error> {
        self.check()?;
        self.file.set_len(len)
    }
    fn sync_data(&self, eventual: bool) -> Result<(), std::io::Error> {
        self.check()?;
        self.file.sync_data(eventual)
    }
    fn write(&self, offset: u64, data: &[u8]) -> Result<(), std::io::Error> {
        self.check()?;
        self.file.write(offset, data)
    }
}

/// The bucket file in `dir` on a disk that fills while `full` is set.
fn on_filling_disk(dir: &Path, full: &std::sync::Arc<std::sync::atomic::AtomicBool>) -> BucketFile {
    let path = dir.join(FILE);
    let (at, full) = (path.clone(), std::sync::Arc::clone(full));
    let open = move || {
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(&at)?;
        let disk = FillingDisk {
            file: redb::backends::FileBackend::new(file)?,
            full: std::sync::Arc::clone(&full),
        };
        Database::builder().create_with_backend(disk)
    };
    BucketFile::open_with(path, Box::new(open)).unwrap()
}

#[test]
fn a_write_after_the_disk_was_full_and_has_room_again_succeeds_without_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let full = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let file = on_filling_disk(dir.path(), &full);
    let write = |buckets: &[KeptBucket]| {
        file.write(Changes {
            buckets,
            ..Changes::default()
        })
    };
    write(&[bucket("day", None, "before", 100)]).unwrap();

    full.store(true, Ordering::Relaxed);
    assert!(write(&[bucket("day", None, "while-full", 200)]).is_err());
    assert!(write(&[bucket("day", None, "while-full", 200)]).is_err());

    // Room again: redb alone would refuse every write until the database is opened again.
    full.store(false, Ordering::Relaxed);
    write(&[bucket("day", None, "after", 300)]).unwrap();
    assert!(file.reopened.load(Ordering::Relaxed) >= 1);
    drop(file);

    let file = BucketFile::open(dir.path()).unwrap();
    let keys: Vec<String> = sorted(file.read_all().unwrap())
        .into_iter()
        .map(|b| b.key)
        .collect();
    assert_eq!(keys, ["after", "before"], "the failed writes wrote nothing");
}

/// A bucket file of a few hundred records, as bytes.
fn a_written_file() -> Vec<u8> {
    let dir = tempfile::tempdir().unwrap();
    {
        let file = BucketFile::open(dir.path()).unwrap();
        let buckets: Vec<KeptBucket> = (0..300)
            .map(|i| bucket("day", None, &format!("tenant-{i}"), 1_000 + i))
            .collect();
        file.write(Changes {
            buckets: &buckets,
            ..Changes::default()
        })
        .unwrap();
    }
    std::fs::read(dir.path().join(FILE)).unwrap()
}

/// Opens `bytes` as the bucket file and reads it as a start does: it loads, or the error
/// names the file — never a panic.
fn opened_or_named(bytes: &[u8], what: &str) -> Option<usize> {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join(FILE), bytes).unwrap();
    let read = BucketFile::open(dir.path()).and_then(|file| {
        file.read_cells()?;
        file.read_all()
    });
    match read {
        Ok(buckets) => Some(buckets.len()),
        Err(error) => {
            let text = error.to_string();
            assert!(
                text.contains(FILE),
                "{what}: the error names the file: {text}"
            );
            None
        }
    }
}

#[test]
fn a_damaged_bucket_file_is_refused_by_name_never_a_panic_or_a_fresh_start() {
    let whole = a_written_file();
    assert_eq!(opened_or_named(&whole, "whole"), Some(300));
    assert_eq!(
        opened_or_named(&[], "empty"),
        None,
        "0 bytes is damage, not a new file"
    );
    for (what, bytes) in crate::data_file::damaged_copies(&whole) {
        opened_or_named(&bytes, &what);
    }
}

#[test]
fn a_bucket_file_of_a_newer_format_is_refused_by_name_and_left_as_it_is() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join(FILE), a_written_file()).unwrap();
    let record = |format| {
        let db = redb::Database::create(dir.path().join(FILE)).unwrap();
        crate::data_file::record_format(&db, format);
    };
    record(FORMAT + 1);
    let text = BucketFile::open(dir.path()).unwrap_err().to_string();
    assert!(text.contains(FILE), "{text}");
    assert!(text.contains("was written by a newer Weir"), "{text}");
    // Nothing was lost by the refusal: back at this build's format, every bucket is there.
    record(FORMAT);
    let file = BucketFile::open(dir.path()).unwrap();
    assert_eq!(file.read_all().unwrap().len(), 300);
}
