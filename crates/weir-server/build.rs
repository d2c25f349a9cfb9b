//! Records the commit the binary is built from, for `weir_build_info` (`unknown` outside a git
//! checkout, as in a container build that leaves `.git` out).

use std::process::Command;

fn main() {
    let commit = Command::new("git")
        .args(["rev-parse", "--short=12", "HEAD"])
        .output()
        .ok()
        .filter(|output| output.status.success())
        .and_then(|output| String::from_utf8(output.stdout).ok())
        .map(|commit| commit.trim().to_owned())
        .filter(|commit| !commit.is_empty())
        .unwrap_or_else(|| "unknown".to_owned());
    println!("cargo:rustc-env=WEIR_GIT_COMMIT={commit}");
    // Rebuilt when HEAD moves (a new commit on the branch, or another branch checked out).
    let manifest = std::env::var("CARGO_MANIFEST_DIR").unwrap_or_default();
    let git = std::path::Path::new(&manifest).join("../../.git");
    for path in ["HEAD", "refs/heads"] {
        let path = git.join(path);
        if path.exists() {
            println!("cargo:rerun-if-changed={}", path.display());
        }
    }
}
