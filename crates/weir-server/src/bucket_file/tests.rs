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
