//! The registered front doors' tables in a config file: kept as written, each read and checked
//! by its own door, so that the config names no door. A top-level table that is neither one of
//! the config's own nor a registered door's is refused as serde refuses an unknown field, so
//! that a misspelt table is named (with the nearest name) rather than ignored.

use std::collections::BTreeMap;
use std::fmt;
use std::net::SocketAddr;

use serde::de::{self, MapAccess, Visitor};
use serde::{Deserialize, Deserializer, Serialize};

use crate::front_door::{FrontDoor, REGISTERED, registered};

/// The config's own top-level tables: what an unknown one is told it could have meant, beside
/// the registered doors'.
const OWN_TABLES: &[&str] = &["server", "policy", "rls", "rlqs", "resp", "redis"];

/// Each registered door's table, by door name, as the file gives it.
#[derive(Debug, Clone, PartialEq, Default, Serialize)]
#[serde(transparent)]
pub struct DoorTables(BTreeMap<String, toml::Table>);

impl DoorTables {
    /// The table of the door named `door`, if the file has one.
    pub fn table(&self, door: &str) -> Option<&toml::Table> {
        self.0.get(door)
    }

    /// Sets where the door named `door` listens (its flag, which overrides the file).
    pub fn set_listen(&mut self, door: &str, addr: SocketAddr) {
        self.0
            .entry(door.to_owned())
            .or_default()
            .insert("listen".to_owned(), toml::Value::String(addr.to_string()));
    }

    /// Where each registered door listens, as its table says.
    pub fn listening(&self) -> impl Iterator<Item = (&'static dyn FrontDoor, SocketAddr)> + '_ {
        let empty = toml::Table::new();
        REGISTERED.iter().filter_map(move |door| {
            let table = self.table(door.name()).unwrap_or(&empty);
            Some((*door, door.listen(table)?))
        })
    }

    /// What each door finds wrong with its table.
    pub fn problems(&self) -> impl Iterator<Item = String> + '_ {
        self.0.iter().flat_map(|(name, table)| {
            registered(name).map_or_else(Vec::new, |door| door.problems(table))
        })
    }
}

/// serde's own words for an unknown field, which `mistakes.rs` reads its suggestion from.
fn unknown_table(name: &str) -> String {
    let expected: Vec<String> = OWN_TABLES
        .iter()
        .copied()
        .chain(REGISTERED.iter().map(|door| door.name()))
        .map(|table| format!("`{table}`"))
        .collect();
    format!(
        "unknown field `{name}`, expected one of {}",
        expected.join(", ")
    )
}

impl<'de> Deserialize<'de> for DoorTables {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct Tables;
        impl<'de> Visitor<'de> for Tables {
            type Value = DoorTables;

            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("the registered front doors' tables")
            }

            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<DoorTables, A::Error> {
                let mut tables = BTreeMap::new();
                while let Some(name) = map.next_key::<String>()? {
                    if registered(&name).is_none() {
                        return Err(de::Error::custom(unknown_table(&name)));
                    }
                    let table: toml::Table = map.next_value()?;
                    tables.insert(name, table);
                }
                Ok(DoorTables(tables))
            }
        }
        deserializer.deserialize_map(Tables)
    }
}

#[cfg(test)]
mod tests {
    use super::super::ConfigFile;
    use super::*;

    #[test]
    fn the_configs_own_tables_are_its_fields_and_an_unknown_one_is_named_with_its_nearest() {
        // Each name listed as the config's own is one it reads (an empty table, or list).
        for own in OWN_TABLES {
            let text = if *own == "policy" {
                String::new()
            } else {
                format!("[{own}]\n")
            };
            let parsed = ConfigFile::parse(&text);
            assert!(
                parsed.as_ref().err().is_none_or(|problems| problems
                    .iter()
                    .all(|p| !p.to_string().contains("unknown field"))),
                "{own}: {parsed:?}"
            );
        }
        let problems = ConfigFile::parse("[servr]\nnode_id = \"a\"\n").unwrap_err();
        let text: Vec<String> = problems.iter().map(ToString::to_string).collect();
        assert_eq!(
            text,
            ["unknown field `servr` (did you mean `server`?)"],
            "{text:?}"
        );
        // A registered door's table is kept as written, for its door.
        let door = REGISTERED[0].name();
        let parsed = ConfigFile::parse(&format!("[{door}]\nlisten = \"127.0.0.1:1\"\n")).unwrap();
        let listening: Vec<_> = parsed
            .doors
            .listening()
            .map(|(door, addr)| (door.name(), addr))
            .collect();
        assert_eq!(listening, [(door, "127.0.0.1:1".parse().unwrap())]);
    }

    #[test]
    fn a_flag_sets_the_listener_over_the_files_and_survives_a_write_back() {
        let door = REGISTERED[0].name();
        let mut config = ConfigFile::parse("").unwrap();
        config
            .doors
            .set_listen(door, "127.0.0.1:2".parse().unwrap());
        let written = toml::to_string(&config).unwrap();
        let read = ConfigFile::parse(&written).unwrap();
        assert_eq!(read.doors, config.doors, "{written}");
    }
}
