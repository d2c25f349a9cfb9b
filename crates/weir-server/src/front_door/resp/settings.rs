//! `[resp]`: where the Redis protocol listens, how many keys `CL.THROTTLE` keeps and how long an
//! idle connection stays. A leaf the config reads, importing nothing of the server but how
//! addresses are read.
//!
//! These were `[server] resp`, `resp_max_keys` and `resp_idle_timeout` before the protocol's
//! settings moved to its own table; a config with the old names still loads (see
//! [`OLD_NAMES`]), with a note naming the new one.

use std::net::SocketAddr;
use std::time::Duration;

use serde::{Deserialize, Serialize};

/// The `[server]` fields these settings had before, and the `[resp]` field each is now.
pub const OLD_NAMES: [Renamed; 3] = [
    ("resp", "listen"),
    ("resp_max_keys", "max_keys"),
    ("resp_idle_timeout", "idle_timeout"),
];

/// A setting read under its old name: `(old, new)`.
pub type Renamed = (&'static str, &'static str);

/// What `[server]` held under the old names, as read.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct OldSettings {
    /// `[server] resp`.
    pub listen: Option<SocketAddr>,
    /// `[server] resp_max_keys`.
    pub max_keys: Option<usize>,
    /// `[server] resp_idle_timeout`.
    pub idle_timeout: Option<Duration>,
}

/// `[resp]`: the Redis protocol's listener.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RespTable {
    /// Where it listens (`--resp`, `WEIR_RESP`); absent: it does not.
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "crate::listen_address::serde::some"
    )]
    pub listen: Option<SocketAddr>,
    /// The most keys `CL.THROTTLE` keeps at once (default 100 000); at the cap, keys whole
    /// again are dropped first, and a new key is refused only when none is.
    #[serde(default = "default_max_keys")]
    pub max_keys: usize,
    /// How long a connection with nothing asked of it is kept (default `0s`: for ever, as
    /// Redis's `timeout 0`). A request begun must arrive whole within `[server]
    /// header_timeout` whatever this says.
    #[serde(default, with = "weir::duration::serde")]
    pub idle_timeout: Duration,
}

fn default_max_keys() -> usize {
    100_000
}

impl Default for RespTable {
    fn default() -> Self {
        RespTable {
            listen: None,
            max_keys: default_max_keys(),
            idle_timeout: Duration::ZERO,
        }
    }
}

impl RespTable {
    /// Whether nothing is set (the table is then left out of a config written back).
    pub fn is_default(&self) -> bool {
        *self == Self::default()
    }

    /// Takes in what `old` holds, each where this table does not give the same setting itself
    /// (`given` says whether it names a field). The old names read, as `(old, new)`; or, when a
    /// setting is given under both names, each such one as `(new field, problem)`.
    pub fn take_old(
        &mut self,
        old: OldSettings,
        given: &dyn Fn(&str) -> bool,
    ) -> Result<Vec<Renamed>, Vec<(&'static str, String)>> {
        let [listen, max_keys, idle_timeout] = OLD_NAMES;
        let mut read = Vec::new();
        let mut both = Vec::new();
        let mut take = |(old_name, new_name): (&'static str, &'static str), present: bool| {
            if !present {
                false
            } else if given(new_name) {
                both.push((
                    new_name,
                    format!(
                        "is given, and so is its old name `server.{old_name}`: keep `resp.{new_name}` only"
                    ),
                ));
                false
            } else {
                read.push((old_name, new_name));
                true
            }
        };
        if take(listen, old.listen.is_some()) {
            self.listen = old.listen;
        }
        if let Some(keys) = old.max_keys.filter(|_| take(max_keys, true)) {
            self.max_keys = keys;
        }
        if let Some(idle) = old.idle_timeout.filter(|_| take(idle_timeout, true)) {
            self.idle_timeout = idle;
        }
        if both.is_empty() { Ok(read) } else { Err(both) }
    }

    /// What does not hold together, as `(field, problem)`.
    pub fn problems(&self) -> Vec<(&'static str, String)> {
        let mut problems = Vec::new();
        if self.max_keys == 0 {
            problems.push(("max_keys", "must be at least 1".to_owned()));
        }
        problems
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn old_names_are_taken_in_and_a_setting_under_both_names_is_refused() {
        let old = OldSettings {
            listen: Some("127.0.0.1:6379".parse().unwrap()),
            max_keys: Some(7),
            idle_timeout: None,
        };
        let mut table = RespTable::default();
        assert_eq!(
            table.take_old(old, &|_| false),
            Ok(vec![("resp", "listen"), ("resp_max_keys", "max_keys")])
        );
        assert_eq!(table.listen, old.listen);
        assert_eq!(table.max_keys, 7);
        assert_eq!(table.idle_timeout, Duration::ZERO);

        let mut table = RespTable {
            max_keys: 9,
            ..RespTable::default()
        };
        let both = table
            .take_old(old, &|field| field == "max_keys")
            .unwrap_err();
        assert_eq!(both.len(), 1);
        assert_eq!(both[0].0, "max_keys");
        assert!(
            both[0].1.contains("`server.resp_max_keys`"),
            "{}",
            both[0].1
        );
        assert_eq!(table.max_keys, 9, "the new name's setting stands");
    }
}
