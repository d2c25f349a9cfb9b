//! The unit tests of `resp/mod.rs`.

use super::*;
use crate::app::AppSettings;

fn app(dir: &std::path::Path) -> Arc<App> {
    App::new(AppSettings::for_test(dir)).unwrap()
}

const LIMITS_30S: ConnectionLimits = ConnectionLimits {
    auth_timeout: Duration::from_secs(30),
    command_timeout: Duration::from_secs(30),
    idle_timeout: None,
};

/// Serves one connection as the listener would, in a room of its own.
async fn open(
    stream: impl AsyncRead + AsyncWrite + Unpin,
    app: &Arc<App>,
    limits: ConnectionLimits,
) -> std::io::Result<()> {
    let room = Arc::new(Room::default());
    let seat = room.enter(1, 0);
    let closed = metrics::Closed::default();
    connection(
        stream,
        app,
        1,
        limits,
        (&seat, tokio::time::Instant::now()),
        &closed,
    )
    .await
}

#[tokio::test(start_paused = true)]
async fn half_a_command_is_given_the_command_timeout_and_no_more() {
    let dir = tempfile::tempdir().unwrap();
    let app = app(dir.path());
    let (mut client, server) = tokio::io::duplex(4096);
    let served = tokio::spawn(async move { open(server, &app, LIMITS_30S).await });
    // A whole request first: answered. Then one sent a byte a second, never finished.
    client.write_all(b"PING\r\n").await.unwrap();
    let mut pong = [0u8; 7];
    client.read_exact(&mut pong).await.unwrap();
    assert_eq!(&pong, b"+PONG\r\n");
    let started = tokio::time::Instant::now();
    let trickle = tokio::spawn(async move {
        // An argument of 1000 bytes: at a byte a second, never whole within the timeout.
        let head = b"*2\r\n$4\r\nPING\r\n$1000\r\n".iter();
        for byte in head.chain(std::iter::repeat(&b'a')) {
            if client.write_all(&[*byte]).await.is_err() {
                return;
            }
            tokio::time::sleep(Duration::from_secs(1)).await;
        }
    });
    let ended = served.await.unwrap().unwrap_err();
    assert_eq!(ended.kind(), std::io::ErrorKind::TimedOut);
    // From the request's first byte: each later byte does not start the clock again.
    let took = started.elapsed();
    assert!(took >= LIMITS_30S.command_timeout, "{took:?}");
    assert!(
        took < LIMITS_30S.command_timeout + Duration::from_secs(2),
        "{took:?}"
    );
    trickle.abort();
}

#[tokio::test(start_paused = true)]
async fn an_idle_connection_is_closed_at_the_idle_timeout_and_kept_without_one() {
    let dir = tempfile::tempdir().unwrap();
    let app = app(dir.path());
    let limits = ConnectionLimits {
        idle_timeout: Some(Duration::from_secs(300)),
        ..LIMITS_30S
    };
    let (mut client, server) = tokio::io::duplex(4096);
    let served = {
        let app = Arc::clone(&app);
        tokio::spawn(async move { open(server, &app, limits).await })
    };
    let started = tokio::time::Instant::now();
    client.write_all(b"PING\r\n").await.unwrap();
    let mut replies = String::new();
    // Closed without a word once 300 s pass with nothing asked.
    client.read_to_string(&mut replies).await.unwrap();
    served.await.unwrap().unwrap();
    assert_eq!(replies, "+PONG\r\n");
    assert!(started.elapsed() >= Duration::from_secs(300));
    // Without an idle timeout, the same silence is kept (here for an hour).
    let (mut client, server) = tokio::io::duplex(4096);
    let served = tokio::spawn(async move { open(server, &app, LIMITS_30S).await });
    client.write_all(b"PING\r\n").await.unwrap();
    let mut pong = [0u8; 7];
    client.read_exact(&mut pong).await.unwrap();
    tokio::time::sleep(Duration::from_secs(3600)).await;
    assert!(!served.is_finished());
    client.write_all(b"QUIT\r\n").await.unwrap();
    served.await.unwrap().unwrap();
}

#[tokio::test(start_paused = true)]
async fn a_connection_told_to_make_room_closes() {
    let dir = tempfile::tempdir().unwrap();
    let app = app(dir.path());
    let room = Arc::new(Room::default());
    let seat = room.enter(1, 0);
    let (_client, server) = tokio::io::duplex(4096);
    let epoch = tokio::time::Instant::now();
    let served = tokio::spawn(async move {
        let closed = metrics::Closed::default();
        connection(server, &app, 1, LIMITS_30S, (&seat, epoch), &closed).await
    });
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(room.make_room(since(epoch)), Some(1));
    let ended = served.await.unwrap().unwrap_err();
    assert_eq!(ended.kind(), std::io::ErrorKind::ConnectionAborted);
}

#[tokio::test(start_paused = true)]
async fn a_client_that_never_reads_its_replies_is_cut_off() {
    let dir = tempfile::tempdir().unwrap();
    let app = app(dir.path());
    let (mut client, server) = tokio::io::duplex(4096);
    let served = tokio::spawn(async move { open(server, &app, LIMITS_30S).await });
    // Requests go on being sent; replies are never read. Once the pipe's buffers are
    // full both ways, the server's write waits — and gives up after WRITE_TIMEOUT.
    let started = tokio::time::Instant::now();
    let sending = tokio::spawn(async move {
        loop {
            if client.write_all(b"PING\r\n").await.is_err() {
                return;
            }
        }
    });
    let ended = served.await.unwrap().unwrap_err();
    assert_eq!(ended.kind(), std::io::ErrorKind::TimedOut);
    assert!(started.elapsed() >= WRITE_TIMEOUT);
    sending.abort();
}

#[tokio::test(start_paused = true)]
async fn a_pipeline_longer_than_the_pending_replies_is_answered_whole() {
    let dir = tempfile::tempdir().unwrap();
    let app = app(dir.path());
    let (mut client, server) = tokio::io::duplex(1 << 20);
    let served = tokio::spawn(async move { open(server, &app, LIMITS_30S).await });
    // More whole requests in one read than replies may be held: every one is answered,
    // then the client's closing its side ends the connection.
    let requests = MAX_PENDING * 2 + 5;
    client
        .write_all("PING\r\n".repeat(requests).as_bytes())
        .await
        .unwrap();
    client.shutdown().await.unwrap();
    let mut replies = String::new();
    client.read_to_string(&mut replies).await.unwrap();
    served.await.unwrap().unwrap();
    assert_eq!(replies.matches("+PONG\r\n").count(), requests);
}

#[tokio::test(start_paused = true)]
async fn a_connection_that_never_gives_the_password_is_closed() {
    let dir = tempfile::tempdir().unwrap();
    let app = App::new(AppSettings {
        access: crate::app::Access {
            data_token: Some("a-token-of-some-length".to_owned()),
            ..Default::default()
        },
        ..AppSettings::for_test(dir.path())
    })
    .unwrap();
    let (mut client, server) = tokio::io::duplex(4096);
    let served = tokio::spawn(async move { open(server, &app, LIMITS_30S).await });
    client.write_all(b"PING\r\n").await.unwrap();
    let started = tokio::time::Instant::now();
    let ended = served.await.unwrap().unwrap_err();
    assert_eq!(ended.kind(), std::io::ErrorKind::TimedOut);
    assert!(started.elapsed() >= LIMITS_30S.auth_timeout);
    let mut replies = String::new();
    client.read_to_string(&mut replies).await.unwrap();
    assert_eq!(replies, "-NOAUTH Authentication required.\r\n");
}

#[tokio::test(start_paused = true)]
async fn replies_come_back_in_order_behind_one_that_waits() {
    let dir = tempfile::tempdir().unwrap();
    let app = app(dir.path());
    let policy: weir::policy::PolicyConfig = toml::from_str(
        "name = \"q\"\non_exhausted = \"wait\"\ntoken_bucket = { rate = 1, burst = 1 }",
    )
    .unwrap();
    app.policies().upsert(policy).unwrap();
    let (mut client, server) = tokio::io::duplex(64 * 1024);
    let served = tokio::spawn(async move { open(server, &app, LIMITS_30S).await });
    // The second acquire waits a second for its token; the PING behind it is decided at
    // once, but its reply comes after the acquire's.
    client
        .write_all(b"WEIR.ACQUIRE q k\r\nWEIR.ACQUIRE q k WAIT 5000\r\nPING\r\nQUIT\r\n")
        .await
        .unwrap();
    let mut replies = String::new();
    client.read_to_string(&mut replies).await.unwrap();
    served.await.unwrap().unwrap();
    assert_eq!(replies.match_indices("admitted").count(), 2, "{replies}");
    let (second, _) = replies.match_indices("waited_ms\r\n:").nth(1).unwrap();
    let after = &replies[second + "waited_ms\r\n:".len()..];
    let waited: u64 = after[..after.find('\r').unwrap()].parse().unwrap();
    // A token a second: the second acquire waited about that long, on the paused clock.
    assert!((990..=1000).contains(&waited), "{replies}");
    assert!(replies.find("+PONG").unwrap() > second, "{replies}");
    assert!(replies.ends_with("+PONG\r\n+OK\r\n"), "{replies}");
}
