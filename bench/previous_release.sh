#!/usr/bin/env bash
# Builds the previous release's `weir` beside this checkout's, for the rolling upgrade's test
# (`WEIR_PREVIOUS_RELEASE`), and prints its binary's path. The release is named in
# `bench/previous_release` by its tag and its commit (the commit serves a clone that carries no
# tags); exit status 3 when neither is in this clone's history.
#
# It is built in a git worktree into this checkout's target directory, so the dependencies,
# locked alike, compile once for both releases and only the previous release's own crates build
# again (their path differs, and so do their artifacts). Its binary is copied out and the
# shared `debug/weir` removed: this checkout's next build puts its own back. Run it before
# building this checkout's tests, as `.ci/run` does. Kept once built, by commit.
set -euo pipefail
cd "$(dirname "$0")/.."
read -r tag commit <bench/previous_release
rev=$(git rev-parse -q --verify "$tag^{commit}" 2>/dev/null ||
  git rev-parse -q --verify "$commit^{commit}" 2>/dev/null) || {
  echo "neither $tag nor $commit is in this clone's history" >&2
  exit 3
}
target=$(cargo metadata --format-version 1 --no-deps |
  grep -o '"target_directory":"[^"]*"' | cut -d'"' -f4)
out="$target/previous-release"
if [ -x "$out/weir" ] && [ "$(cat "$out/commit" 2>/dev/null)" = "$rev" ]; then
  echo "$out/weir"
  exit 0
fi
mkdir -p "$out"
rm -rf "$out/src"
git worktree prune
git worktree add --quiet --detach "$out/src" "$rev"
trap 'git worktree remove --force "$out/src" 2>/dev/null || rm -rf "$out/src"' EXIT
(cd "$out/src" && CARGO_TARGET_DIR="$target" cargo build --quiet --locked --bin weir >&2)
cp "$target/debug/weir" "$out/weir"
rm -f "$target/debug/weir"
echo "$rev" >"$out/commit"
echo "$out/weir"
