//! Membership by gossip: two nodes on loopback find each other through a seed, and one notices
//! when the other stops.

use std::time::Duration;

use tokio::sync::watch;
use weir::{Clock, TokioClock};
use weir_cluster::membership::{GossipMembership, GossipSettings, Membership, NodeInfo};
use weir_cluster::protocol::Speaks;
use weir_cluster::quorum::Quorum;
use weir_cluster::secret::ClusterSecret;

/// A free UDP port on loopback (bound and released; the gossip socket takes it right after).
fn free_udp_addr() -> std::net::SocketAddr {
    let socket = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
    socket.local_addr().unwrap()
}

fn settings(id: &str, gossip: std::net::SocketAddr, seeds: Vec<String>) -> GossipSettings {
    GossipSettings {
        node_id: id.into(),
        cluster_id: "weir-test".into(),
        gossip,
        seeds,
        grpc: format!("http://{id}.invalid:50051"),
        speaks: Speaks::only(1),
        owner: true,
        interval: Duration::from_millis(50),
        secret: None,
    }
}

/// Waits (event-driven, bounded) until the member list satisfies `done`.
async fn until(
    watch: &mut watch::Receiver<Vec<NodeInfo>>,
    done: impl Fn(&[NodeInfo]) -> bool,
) -> Vec<NodeInfo> {
    tokio::time::timeout(Duration::from_secs(60), async {
        loop {
            let members = watch.borrow_and_update().clone();
            if done(&members) {
                return members;
            }
            watch.changed().await.expect("membership alive");
        }
    })
    .await
    .expect("membership converged in time")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nodes_join_through_a_seed_and_a_stopped_node_is_dropped() {
    let a_addr = free_udp_addr();
    let a = GossipMembership::start(settings("a", a_addr, vec![]))
        .await
        .unwrap();
    let b = GossipMembership::start(settings("b", free_udp_addr(), vec![a_addr.to_string()]))
        .await
        .unwrap();
    let mut a_view = a.watch();
    let mut b_view = b.watch();
    let members = until(&mut a_view, |m| m.len() == 2).await;
    let ids: Vec<&str> = members.iter().map(|m| m.id.as_str()).collect();
    assert_eq!(ids, ["a", "b"]);
    assert_eq!(members[1].grpc, "http://b.invalid:50051");
    assert!(members.iter().all(|m| m.owner && m.protocol == 1));
    until(&mut b_view, |m| m.len() == 2).await;

    b.stop().await;
    let members = until(&mut a_view, |m| m.len() == 1).await;
    assert_eq!(members[0].id, "a");
    a.stop().await;
}

/// A rolling upgrade's mixed window over real gossip: a member of the next release (speaking 3
/// to 4) alone speaks 4; joined by one of the previous release (3 alone), it speaks 3 — proved
/// again with the cluster's secret, so the previous release admits it — and both see each other
/// at 3; once the previous release's member is gone, it speaks 4 again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_mixed_cluster_speaks_the_version_every_member_speaks() {
    let secret = ClusterSecret::new("the secret of a cluster being upgraded").unwrap();
    let release = |id: &str, gossip, seeds, speaks| GossipSettings {
        speaks,
        secret: Some(secret.clone()),
        ..settings(id, gossip, seeds)
    };
    let a_addr = free_udp_addr();
    let next = Speaks {
        oldest: 3,
        newest: 4,
    };
    let a = GossipMembership::start(release("a", a_addr, vec![], next))
        .await
        .unwrap();
    let mut a_view = a.watch();
    let speaking =
        |members: &[NodeInfo], id: &str| members.iter().find(|m| m.id == id).map(|m| m.protocol);
    until(&mut a_view, |m| speaking(m, "a") == Some(4)).await;

    let b = GossipMembership::start(release(
        "b",
        free_udp_addr(),
        vec![a_addr.to_string()],
        Speaks::only(3),
    ))
    .await
    .unwrap();
    let mut b_view = b.watch();
    let members = until(&mut a_view, |m| {
        speaking(m, "a") == Some(3) && speaking(m, "b") == Some(3)
    })
    .await;
    assert_eq!(members.iter().find(|m| m.id == "a").unwrap().newest, 4);
    // The previous release admits it (its proof covers the version it speaks now) and places
    // it on its ring.
    until(&mut b_view, |m| speaking(m, "a") == Some(3)).await;

    b.stop().await;
    until(&mut a_view, |m| m.len() == 1 && speaking(m, "a") == Some(4)).await;
    a.stop().await;
}

/// With a cluster secret, only members that prove they know it are members: one with another
/// secret and one with none gossip with the others, and are left out of their membership.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_members_that_know_the_secret_join() {
    let ours = ClusterSecret::new("a secret of the weir cluster").unwrap();
    let theirs = ClusterSecret::new("another secret, another one").unwrap();
    let with = |id: &str, seeds: Vec<String>, secret: Option<&ClusterSecret>| GossipSettings {
        secret: secret.cloned(),
        ..settings(id, free_udp_addr(), seeds)
    };
    let a_addr = free_udp_addr();
    let a = GossipMembership::start(GossipSettings {
        secret: Some(ours.clone()),
        ..settings("a", a_addr, vec![])
    })
    .await
    .unwrap();
    let seeds = vec![a_addr.to_string()];
    let b = GossipMembership::start(with("b", seeds.clone(), Some(&ours)))
        .await
        .unwrap();
    let stranger = GossipMembership::start(with("c", seeds.clone(), Some(&theirs)))
        .await
        .unwrap();
    let open = GossipMembership::start(with("d", seeds, None))
        .await
        .unwrap();
    let mut a_view = a.watch();
    until(&mut a_view, |m| m.len() == 2).await;
    // c and d are gossiping with a (a knows them), but are not members.
    tokio::time::timeout(Duration::from_secs(60), async {
        while a.strangers() < 2 {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    })
    .await
    .expect("a heard from both strangers");
    let ids: Vec<String> = a.watch().borrow().iter().map(|m| m.id.clone()).collect();
    assert_eq!(ids, ["a", "b"]);
    let ids: Vec<String> = stranger
        .watch()
        .borrow()
        .iter()
        .map(|m| m.id.clone())
        .collect();
    assert_eq!(ids, ["c"], "the stranger sees only itself");
    for node in [a, b, stranger, open] {
        node.stop().await;
    }
}

/// A partition cuts one node of three away (gossip over chitchat's in-process transport, on
/// tokio's paused clock): within the quorum window the cut-off node no longer hears from a
/// majority, while the other two always do; when the links heal, it does again.
#[tokio::test(start_paused = true)]
async fn in_a_partition_only_the_larger_side_hears_from_a_majority() {
    const WINDOW: std::time::Duration = std::time::Duration::from_secs(3);
    let transport = chitchat::transport::ChannelTransport::with_mtu(65_507);
    let addr = |port| std::net::SocketAddr::from(([127, 0, 0, 1], port));
    let (a_addr, b_addr, c_addr) = (addr(7001), addr(7002), addr(7003));
    let seeds = vec![a_addr.to_string()];
    let a = GossipMembership::start_on(settings("a", a_addr, vec![]), &transport)
        .await
        .unwrap();
    let b = GossipMembership::start_on(settings("b", b_addr, seeds.clone()), &transport)
        .await
        .unwrap();
    let c = GossipMembership::start_on(settings("c", c_addr, seeds), &transport)
        .await
        .unwrap();
    for node in [&a, &b, &c] {
        until(&mut node.watch(), |m| m.len() == 3).await;
    }
    let nodes = [
        (&a, Quorum::new("a", WINDOW, false)),
        (&b, Quorum::new("b", WINDOW, true)),
        (&c, Quorum::new("c", WINDOW, true)),
    ];
    let clock = TokioClock::new();
    // One look of every node's quorum at its gossip, as a server's ticker does.
    let look = || async {
        for (node, quorum) in &nodes {
            let beats = node.beats().await;
            quorum.observe(beats.iter().map(|(id, b)| (id.as_str(), *b)), clock.now());
        }
    };
    look().await;
    for (_, quorum) in &nodes {
        assert_eq!(quorum.majority(clock.now()).heard, 3);
    }

    transport.remove_link(a_addr, b_addr).await;
    transport.remove_link(c_addr, b_addr).await;
    let cut = clock.now();
    let mut b_lost = None;
    while clock.now() - cut < 30 * 1_000_000_000 {
        tokio::time::sleep(Duration::from_millis(100)).await;
        look().await;
        let now = clock.now();
        assert!(nodes[0].1.majority(now).holds(), "a kept its majority");
        assert!(nodes[2].1.majority(now).holds(), "c kept its majority");
        if b_lost.is_none() && !nodes[1].1.majority(now).holds() {
            b_lost = Some(now - cut);
        }
        if b_lost.is_some() {
            assert!(!nodes[1].1.majority(now).holds(), "b is cut off for good");
        }
    }
    let b_lost = b_lost.expect("b noticed it was cut off");
    assert!(
        b_lost <= weir::clock::duration_to_nanos(WINDOW) + 1_000_000_000,
        "b went on believing in a majority for {b_lost} ns"
    );

    transport.add_link(a_addr, b_addr).await;
    transport.add_link(c_addr, b_addr).await;
    tokio::time::timeout(Duration::from_secs(60), async {
        loop {
            tokio::time::sleep(Duration::from_millis(100)).await;
            look().await;
            if nodes[1].1.majority(clock.now()).holds() {
                return;
            }
        }
    })
    .await
    .expect("b hears from a majority again after the heal");
    for node in [a, b, c] {
        node.stop().await;
    }
}
