//! Several servers of one kind, asked in turn; each lease is given back where it came from.

use weir_api::http::AcquireBody;

use super::{Answer, Target};

/// Servers asked in turn.
#[derive(Clone)]
pub struct RoundRobin<T> {
    servers: Vec<T>,
    next: usize,
}

impl<T: Target> RoundRobin<T> {
    /// Servers asked in turn from the first; at least one.
    pub fn new(servers: Vec<T>) -> anyhow::Result<Self> {
        if servers.is_empty() {
            anyhow::bail!("a run needs at least one server");
        }
        Ok(RoundRobin { servers, next: 0 })
    }

    /// How many servers (at least one).
    pub fn servers(&self) -> usize {
        self.servers.len()
    }
}

/// A lease from server `n` travels as `n:lease`, so that it goes back to `n`.
impl<T: Target> Target for RoundRobin<T> {
    async fn acquire(&mut self, request: AcquireBody) -> Answer {
        let server = self.next;
        self.next = (server + 1) % self.servers.len();
        let (outcome, lease) = self.servers[server].acquire(request).await?;
        Ok((outcome, lease.map(|lease| format!("{server}:{lease}"))))
    }

    fn for_client(mut self, client: usize) -> Self {
        self.next = client % self.servers.len();
        self
    }

    async fn release(&mut self, lease: String) {
        let Some((server, lease)) = lease.split_once(':') else {
            return;
        };
        let Some(target) = server
            .parse::<usize>()
            .ok()
            .and_then(|server| self.servers.get_mut(server))
        else {
            return;
        };
        target.release(lease.to_owned()).await;
    }
}
