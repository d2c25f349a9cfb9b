//! Network namespaces, for tests that cut real links: each node runs in a namespace of its own
//! behind one bridge on the host, so a partition is a link taken down (nobody reaches the node)
//! or routes dropped between two namespaces (the peers lose each other while clients on the
//! host still reach both). Needs root and iproute2's `ip`; CI runs as root and sets
//! `WEIR_REQUIRE_NETNS`, so there a test fails rather than skips.

use std::process::Command;
use std::sync::atomic::{AtomicU32, Ordering};

/// Tells the networks of one test process apart (each takes a subnet and names of its own).
static NEXT: AtomicU32 = AtomicU32::new(0);

/// Nodes in namespaces of their own, joined by a bridge the host is on; everything is removed
/// when dropped (the namespaces' processes must be stopped first: [`Server`]'s drop does it).
///
/// [`Server`]: super::Server
pub struct Network {
    /// Short and unique on this machine: the process id and a count.
    tag: String,
    /// The /24 every address is in: `10.A.B.0`.
    prefix: String,
    nodes: usize,
}

/// Runs `ip` with `args`, or says why it failed.
fn ip(args: &[&str]) -> Result<(), String> {
    let out = Command::new("ip")
        .args(args)
        .output()
        .map_err(|e| format!("running ip: {e}"))?;
    match out.status.success() {
        true => Ok(()),
        false => Err(format!(
            "ip {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        )),
    }
}

impl Network {
    /// `nodes` namespaces behind one bridge; `None` (the test skipped) where they cannot be
    /// made and `WEIR_REQUIRE_NETNS` is not set.
    pub fn create(nodes: usize) -> Option<Network> {
        let count = NEXT.fetch_add(1, Ordering::Relaxed);
        let pid = std::process::id();
        let network = Network {
            tag: format!("{:x}", (pid % 0xfffff) * 16 + count % 16),
            prefix: format!("10.{}.{}", 100 + pid % 100, (pid / 100 + count) % 250),
            nodes,
        };
        match network.build() {
            Ok(()) => Some(network),
            Err(why) if std::env::var_os("WEIR_REQUIRE_NETNS").is_none() => {
                eprintln!("skipped: no network namespaces could be made ({why})");
                None
            }
            Err(why) => panic!("WEIR_REQUIRE_NETNS is set, but no namespaces could be made: {why}"),
        }
    }

    fn bridge(&self) -> String {
        format!("wb{}", self.tag)
    }

    /// The host's end of node `i`'s link (on the bridge).
    fn host_end(&self, i: usize) -> String {
        format!("wh{}{i}", self.tag)
    }

    /// Node `i`'s namespace.
    pub fn namespace(&self, i: usize) -> String {
        format!("weir-{}-{i}", self.tag)
    }

    /// Node `i`'s address.
    pub fn address(&self, i: usize) -> String {
        format!("{}.{}", self.prefix, 11 + i)
    }

    fn build(&self) -> Result<(), String> {
        let bridge = self.bridge();
        ip(&["link", "add", &bridge, "type", "bridge"])?;
        ip(&[
            "addr",
            "add",
            &format!("{}.1/24", self.prefix),
            "dev",
            &bridge,
        ])?;
        ip(&["link", "set", &bridge, "up"])?;
        for i in 0..self.nodes {
            let (namespace, host_end) = (self.namespace(i), self.host_end(i));
            let inside = format!("wn{}{i}", self.tag);
            ip(&["netns", "add", &namespace])?;
            ip(&[
                "link", "add", &host_end, "type", "veth", "peer", "name", &inside,
            ])?;
            ip(&["link", "set", &inside, "netns", &namespace])?;
            ip(&["link", "set", &host_end, "master", &bridge, "up"])?;
            let within = |args: &[&str]| {
                let mut all = vec!["netns", "exec", &namespace, "ip"];
                all.extend_from_slice(args);
                ip(&all)
            };
            within(&[
                "addr",
                "add",
                &format!("{}/24", self.address(i)),
                "dev",
                &inside,
            ])?;
            within(&["link", "set", &inside, "up"])?;
            within(&["link", "set", "lo", "up"])?;
        }
        Ok(())
    }

    /// Takes node `i`'s link down: nobody reaches it, it reaches nobody.
    pub fn cut_link(&self, i: usize) {
        ip(&["link", "set", &self.host_end(i), "down"]).unwrap();
    }

    /// Brings node `i`'s link back up.
    pub fn heal_link(&self, i: usize) {
        ip(&["link", "set", &self.host_end(i), "up"]).unwrap();
    }

    /// Drops every packet between node `i` and every other node, both ways; clients on the
    /// host still reach all of them.
    pub fn cut_between(&self, i: usize) {
        self.routes_between(i, "add");
    }

    /// Undoes [`cut_between`](Self::cut_between).
    pub fn heal_between(&self, i: usize) {
        self.routes_between(i, "del");
    }

    fn routes_between(&self, i: usize, verb: &str) {
        for other in (0..self.nodes).filter(|&o| o != i) {
            for (from, to) in [(i, other), (other, i)] {
                let namespace = self.namespace(from);
                let to = format!("{}/32", self.address(to));
                ip(&[
                    "netns",
                    "exec",
                    &namespace,
                    "ip",
                    "route",
                    verb,
                    "blackhole",
                    &to,
                ])
                .unwrap();
            }
        }
    }
}

impl Drop for Network {
    fn drop(&mut self) {
        for i in 0..self.nodes {
            // Deleting the namespace deletes its end of the link, and so the host's.
            let _ = ip(&["netns", "del", &self.namespace(i)]);
        }
        let _ = ip(&["link", "del", &self.bridge()]);
    }
}
