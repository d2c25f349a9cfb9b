//! Targets over the Redis protocol: Weir's `WEIR.ACQUIRE`, redis-cell's `CL.THROTTLE` (on
//! Weir, or on a Redis that loaded the module), and the same decision as a Lua script in a
//! plain Redis — one client, one connection (pipelined by the client library when several
//! requests of the connection are in flight).

use redis::Value;
use redis::aio::MultiplexedConnection;
use weir_api::http::AcquireBody;

use super::{Answer, Target};
use crate::report::RequestOutcome;

/// A `CL.THROTTLE` bucket's numbers: `max_burst count period`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CellShape {
    /// Requests at once beyond the first.
    pub max_burst: u64,
    /// Requests per period.
    pub count: u64,
    /// The period, seconds.
    pub period: u64,
}

impl CellShape {
    /// `BURST,COUNT,PERIOD`.
    pub fn parse(text: &str) -> anyhow::Result<Self> {
        let numbers: Vec<u64> = text
            .split(',')
            .map(|n| n.trim().parse::<u64>())
            .collect::<Result<_, _>>()
            .map_err(|_| {
                anyhow::anyhow!("--cell must be BURST,COUNT,PERIOD (whole numbers), not {text:?}")
            })?;
        let [max_burst, count, period] = numbers[..] else {
            anyhow::bail!("--cell must be BURST,COUNT,PERIOD, not {text:?}");
        };
        Ok(CellShape {
            max_burst,
            count,
            period,
        })
    }
}

/// What each request asks.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RespCommand {
    /// `WEIR.ACQUIRE policy key [COST n]`, leases given back with `WEIR.RELEASE`.
    Acquire {
        /// The policy.
        policy: String,
    },
    /// `CL.THROTTLE key max_burst count period [quantity]`.
    Cell(CellShape),
    /// redis-cell's decision as a Lua script (`EVALSHA`), for a Redis without the module.
    LuaCell(CellShape),
}

/// redis-cell's GCRA in Lua, with its arithmetic (microseconds here, from the server's
/// `TIME`): the same replies, one round trip.
const LUA_CELL: &str = r"
local burst, count, period = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3])
local quantity = tonumber(ARGV[4])
local time = redis.call('TIME')
local now = tonumber(time[1]) * 1000000 + tonumber(time[2])
local interval = math.floor(period * 1000000 / count)
local tolerance = interval * (burst + 1)
local increment = interval * quantity
local tat = tonumber(redis.call('GET', KEYS[1])) or now
local new_tat = math.max(tat, now) + increment
local diff = now - (new_tat - tolerance)
local limited, ttl, retry = 0, new_tat - now, -1
if diff < 0 then
  limited, ttl = 1, tat - now
  if increment <= tolerance then retry = -diff end
else
  redis.call('SET', KEYS[1], new_tat, 'PX', math.max(1, math.floor(ttl / 1000)))
end
local next = tolerance - ttl
local remaining = 0
if next > -interval then remaining = math.floor(next / interval) end
local function seconds(us)
  if us < 0 then return -1 end
  local s = math.floor(us / 1000000)
  if math.floor((us % 1000000) / 1000) > 0 then s = s + 1 end
  return s
end
return {limited, burst + 1, remaining, seconds(retry), seconds(math.max(0, ttl))}
";

/// One client's connection.
#[derive(Clone)]
pub struct Resp {
    connection: MultiplexedConnection,
    command: RespCommand,
    script: redis::Script,
}

impl Resp {
    /// Connects to `url` (`redis://host:port`).
    pub async fn connect(url: &str, command: RespCommand) -> anyhow::Result<Self> {
        let connection = redis::Client::open(url)
            .map_err(|e| anyhow::anyhow!("the address {url:?}: {e}"))?
            .get_multiplexed_async_connection()
            .await
            .map_err(|e| anyhow::anyhow!("connecting to {url}: {e}"))?;
        Ok(Resp {
            connection,
            command,
            script: redis::Script::new(LUA_CELL),
        })
    }
}

/// `WEIR.ACQUIRE`'s reply (RESP2: field, value, …): admitted, and the lease if one was taken.
fn acquired(reply: &[Value]) -> Result<(bool, Option<String>), String> {
    let field = |name: &str| {
        reply
            .chunks(2)
            .find(|pair| matches!(&pair[0], Value::BulkString(n) if n == name.as_bytes()))
            .and_then(|pair| pair.get(1))
    };
    let admitted = matches!(field("admitted"), Some(Value::Int(1)));
    let lease = match field("lease") {
        Some(Value::BulkString(id)) => Some(String::from_utf8_lossy(id).into_owned()),
        _ => None,
    };
    match field("admitted") {
        Some(_) => Ok((admitted, lease)),
        None => Err(format!("an unexpected reply: {reply:?}")),
    }
}

impl Target for Resp {
    async fn acquire(&mut self, request: AcquireBody) -> Answer {
        let cost = request.cost.unwrap_or(1);
        let decided: redis::RedisResult<(bool, Option<String>)> = match &self.command {
            RespCommand::Acquire { policy } => {
                let mut command = redis::cmd("WEIR.ACQUIRE");
                command.arg(policy).arg(&request.key);
                if cost != 1 {
                    command.arg("COST").arg(cost);
                }
                match command
                    .query_async::<Vec<Value>>(&mut self.connection)
                    .await
                {
                    Ok(reply) => {
                        return acquired(&reply).map(|(admitted, lease)| {
                            let outcome = match admitted {
                                true => RequestOutcome::Admitted,
                                false => RequestOutcome::Refused,
                            };
                            (outcome, lease)
                        });
                    }
                    Err(error) => Err(error),
                }
            }
            RespCommand::Cell(shape) => redis::cmd("CL.THROTTLE")
                .arg(&request.key)
                .arg(shape.max_burst)
                .arg(shape.count)
                .arg(shape.period)
                .arg(cost)
                .query_async::<Vec<i64>>(&mut self.connection)
                .await
                .map(|verdict| (verdict.first() == Some(&0), None)),
            RespCommand::LuaCell(shape) => self
                .script
                .key(&request.key)
                .arg(shape.max_burst)
                .arg(shape.count)
                .arg(shape.period)
                .arg(cost)
                .invoke_async::<Vec<i64>>(&mut self.connection)
                .await
                .map(|verdict| (verdict.first() == Some(&0), None)),
        };
        match decided {
            Ok((true, lease)) => Ok((RequestOutcome::Admitted, lease)),
            Ok((false, _)) => Ok((RequestOutcome::Refused, None)),
            Err(error) => Err(format!("resp: {error}")),
        }
    }

    async fn release(&mut self, lease: String) {
        let _ = redis::cmd("WEIR.RELEASE")
            .arg(lease)
            .query_async::<()>(&mut self.connection)
            .await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_cell_shape_is_three_numbers() {
        assert_eq!(
            CellShape::parse("15, 30,60").unwrap(),
            CellShape {
                max_burst: 15,
                count: 30,
                period: 60
            }
        );
        assert!(CellShape::parse("15,30").is_err());
        assert!(CellShape::parse("a,b,c").is_err());
    }

    #[test]
    fn an_acquire_reply_is_read_by_its_field_names() {
        let text = |s: &str| Value::BulkString(s.as_bytes().to_vec());
        let admitted = [text("admitted"), Value::Int(1), text("lease"), text("42")];
        assert_eq!(acquired(&admitted), Ok((true, Some("42".to_owned()))));
        let refused = [text("admitted"), Value::Int(0), text("lease"), Value::Nil];
        assert_eq!(acquired(&refused), Ok((false, None)));
        assert!(acquired(&[]).is_err());
    }
}
