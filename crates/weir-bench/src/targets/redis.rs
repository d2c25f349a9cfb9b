//! The Redis baseline as a target: the policy's limiter as a Lua script (see `crate::redis`).

use weir_api::http::AcquireBody;

use super::{Answer, Target};
use crate::redis::RedisTarget;
use crate::report::RequestOutcome;

impl Target for RedisTarget {
    async fn acquire(&mut self, request: AcquireBody) -> Answer {
        match RedisTarget::acquire(self, &request.key, request.cost.unwrap_or(1)).await {
            Ok((true, lease)) => Ok((RequestOutcome::Admitted, lease)),
            Ok((false, _)) => Ok((RequestOutcome::Refused, None)),
            Err(error) => Err(format!("redis: {error}")),
        }
    }

    async fn release(&mut self, lease: String) {
        let _ = RedisTarget::release(self, &lease).await;
    }
}
