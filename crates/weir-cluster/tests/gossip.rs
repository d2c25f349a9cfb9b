//! Membership by gossip: two nodes on loopback find each other through a seed, and one notices
//! when the other stops.

use std::time::Duration;

use tokio::sync::watch;
use weir_cluster::membership::{GossipMembership, GossipSettings, Membership, NodeInfo};
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
        protocol: 1,
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
