//! A small disk that fills for real: a tmpfs mounted for a test (as root; CI runs as root and
//! sets `WEIR_REQUIRE_TMPFS`, so there a test fails rather than skips).

use std::path::{Path, PathBuf};
use std::process::Command;

/// A policy `day`, ten a day per key, its buckets kept across restarts and written every 200 ms:
/// a node on a small disk has kept buckets to write.
pub const KEPT_DAY: &str = r#"
[server]
durable_flush = "200ms"

[[policy]]
name = "day"
on_exhausted = "reject"
token_bucket = { rate = 0.000115740740, burst = 10 }
"#;

/// A 4 MiB tmpfs mounted on `at` (unmounted when dropped); `None` (the test skipped) where
/// none can be mounted and `WEIR_REQUIRE_TMPFS` is not set.
pub fn small_disk(at: &Path) -> Option<Tmpfs> {
    match Tmpfs::mount(at, "4m") {
        Ok(tmpfs) => Some(tmpfs),
        Err(why) if std::env::var_os("WEIR_REQUIRE_TMPFS").is_none() => {
            eprintln!("skipped: no tmpfs could be mounted ({why})");
            None
        }
        Err(why) => panic!("WEIR_REQUIRE_TMPFS is set, but no tmpfs could be mounted: {why}"),
    }
}

/// A tmpfs of `size` mounted on `at`, unmounted when dropped.
pub struct Tmpfs {
    at: PathBuf,
}

impl Tmpfs {
    /// Mounts it, or says why it could not (not root, no `mount`).
    pub fn mount(at: &Path, size: &str) -> Result<Tmpfs, String> {
        std::fs::create_dir_all(at).unwrap();
        let out = Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={size}"), "tmpfs"])
            .arg(at)
            .output()
            .map_err(|e| format!("running mount: {e}"))?;
        match out.status.success() {
            true => Ok(Tmpfs { at: at.to_owned() }),
            false => Err(String::from_utf8_lossy(&out.stderr).into_owned()),
        }
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg("-l").arg(&self.at).status();
    }
}

/// Fills the file system of `dir` with `dir/filler` until it has no room.
pub fn fill(dir: &Path) {
    use std::io::Write;
    let mut filler = std::fs::File::create(dir.join("filler")).unwrap();
    let chunk = vec![0xa5u8; 64 << 10];
    while filler.write_all(&chunk).is_ok() {}
    let _ = filler.sync_all();
}
