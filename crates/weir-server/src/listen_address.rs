//! Addresses to listen on, as the flags and every table of the config file take them: `IP:PORT`
//! or `HOST:PORT`, resolved once. A leaf: the settings of any front door may read it.

use std::net::SocketAddr;

/// An address to listen on: `IP:PORT`, or `HOST:PORT` with the host resolved now (the first
/// IPv4 address it has, else the first; `localhost:8080` is `127.0.0.1:8080`). For the flags
/// and the config file alike.
pub fn listen_address(text: &str) -> Result<SocketAddr, String> {
    use std::net::ToSocketAddrs;
    if let Ok(address) = text.parse() {
        return Ok(address);
    }
    let Some((host, port)) = text.rsplit_once(':') else {
        return Err(format!(
            "`{text}` is not an address to listen on: give HOST:PORT or IP:PORT, e.g. 127.0.0.1:8080"
        ));
    };
    if port.parse::<u16>().is_err() {
        return Err(format!("`{text}`: `{port}` is not a port (0 to 65535)"));
    }
    let found: Vec<SocketAddr> = text
        .to_socket_addrs()
        .map_err(|error| format!("`{text}`: the host `{host}` could not be resolved: {error}"))?
        .collect();
    found
        .iter()
        .find(|address| address.is_ipv4())
        .or(found.first())
        .copied()
        .ok_or_else(|| format!("`{text}`: the host `{host}` has no address"))
}

/// [`listen_address`] for serde: `deserialize_with = "…::one"` (or `some` for an optional one).
pub mod serde {
    use std::net::SocketAddr;

    use ::serde::{Deserialize, Deserializer};

    /// An address.
    pub fn one<'de, D: Deserializer<'de>>(deserializer: D) -> Result<SocketAddr, D::Error> {
        let text = String::deserialize(deserializer)?;
        super::listen_address(&text).map_err(::serde::de::Error::custom)
    }

    /// An optional address, when given.
    pub fn some<'de, D: Deserializer<'de>>(
        deserializer: D,
    ) -> Result<Option<SocketAddr>, D::Error> {
        one(deserializer).map(Some)
    }
}
