//! The registered doors' listener flags on `weir serve`: `--name ADDR` (or `WEIR_NAME`) for each
//! door in [`REGISTERED`], made from the list, so that the command line names no door itself.

use std::net::SocketAddr;

use clap::{Arg, ArgMatches, Args, Command, FromArgMatches};

use super::REGISTERED;

/// The addresses given to the registered doors' flags, by door.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DoorListeners(pub Vec<(&'static str, SocketAddr)>);

impl FromArgMatches for DoorListeners {
    fn from_arg_matches(matches: &ArgMatches) -> Result<Self, clap::Error> {
        Ok(DoorListeners(
            REGISTERED
                .iter()
                .filter_map(|door| {
                    let addr = matches.get_one::<SocketAddr>(door.name())?;
                    Some((door.name(), *addr))
                })
                .collect(),
        ))
    }

    fn update_from_arg_matches(&mut self, matches: &ArgMatches) -> Result<(), clap::Error> {
        *self = Self::from_arg_matches(matches)?;
        Ok(())
    }
}

impl Args for DoorListeners {
    fn augment_args(command: Command) -> Command {
        REGISTERED.iter().fold(command, |command, door| {
            command.arg(
                Arg::new(door.name())
                    .long(door.name())
                    .env(door.env())
                    .value_name("ADDR")
                    .value_parser(crate::listen_address)
                    .help(door.listener_help()),
            )
        })
    }

    fn augment_args_for_update(command: Command) -> Command {
        Self::augment_args(command)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, clap::Parser)]
    struct Serve {
        #[command(flatten)]
        doors: DoorListeners,
    }

    #[test]
    fn each_registered_door_has_its_flag_read_as_an_address() {
        use clap::Parser;
        let flags: Vec<String> = REGISTERED
            .iter()
            .flat_map(|door| [format!("--{}", door.name()), "127.0.0.1:1051".to_owned()])
            .collect();
        let parsed = Serve::try_parse_from(std::iter::once("serve".to_owned()).chain(flags))
            .unwrap()
            .doors;
        assert_eq!(parsed.0.len(), REGISTERED.len());
        for (name, addr) in parsed.0 {
            assert!(super::super::registered(name).is_some());
            assert_eq!(addr, "127.0.0.1:1051".parse().unwrap());
        }
        let flag = format!("--{}", REGISTERED[0].name());
        let wrong = Serve::try_parse_from(["serve", flag.as_str(), "nowhere"]).unwrap_err();
        assert!(wrong.to_string().contains("nowhere"), "{wrong}");
    }
}
