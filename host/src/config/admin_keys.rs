//! The admin endpoint's keys in the config file, checked where the config
//! is checked: pure rules on their text, which the endpoint
//! (`admin::policy`) applies the same way.

use std::net::SocketAddr;

/// Environment variable holding the admin token; wins over `[host] admin_token_file`.
pub const TOKEN_ENV: &str = "ACEMQ_ADMIN_TOKEN";

/// Whether an `admin_listen` address is reachable from other machines.
///
/// Literal loopback addresses and `localhost` are not; every other name
/// could resolve to anything, so it counts as remote.
pub fn is_remote(address: &str) -> Result<bool, String> {
    if let Ok(socket) = address.parse::<SocketAddr>() {
        return Ok(!socket.ip().is_loopback());
    }
    let Some((host, port)) = address.rsplit_once(':') else {
        return Err(format!(
            "\"{address}\" is not HOST:PORT (for example \"127.0.0.1:9090\")"
        ));
    };
    if port.parse::<u16>().is_err() {
        return Err(format!(
            "\"{address}\": the port \"{port}\" is not a number from 0 to 65535"
        ));
    }
    Ok(!host.eq_ignore_ascii_case("localhost"))
}

/// Refuses an `admin_listen` address reachable from other machines unless
/// `admin_allow_remote` says so; the message names both keys.
pub fn check_listen(address: &str, allow_remote: bool) -> Result<(), String> {
    if is_remote(address)? && !allow_remote {
        return Err(format!(
            "\"{address}\" is reachable from other machines; bind the admin endpoint to \
             loopback (127.0.0.1:PORT, [::1]:PORT or localhost:PORT), or set \
             admin_allow_remote = true in [host] (which also requires an admin token)"
        ));
    }
    Ok(())
}

/// The `admin_allowed_hosts` entry that allows every Host: for an endpoint
/// reached by addresses no config can know (a pod's IP, scraped by
/// Prometheus). Allowed only with a token (`admin::Settings`): the Host
/// check stops a web page that rebinds a name to the endpoint from reading
/// it, and such a page cannot send the token.
pub const ANY_HOST: &str = "*";

/// Checks an `admin_allowed_hosts` entry: the Host header clients send.
pub fn check_allowed_host(entry: &str) -> Result<(), String> {
    if entry == ANY_HOST {
        return Ok(());
    }
    let shape = "must be HOST:PORT as clients send it in the Host header \
                 (for example \"acemq-1.internal:9090\")";
    if entry.is_empty()
        || entry.contains("://")
        || entry.contains(['/', '?', '#', '@'])
        || entry.chars().any(|c| !c.is_ascii_graphic())
    {
        return Err(format!("\"{entry}\" {shape}"));
    }
    if port_of(entry).is_none_or(|port| port.parse::<u16>().is_err()) {
        return Err(format!("\"{entry}\" has no port number; it {shape}"));
    }
    Ok(())
}

/// The port of a `host:port` authority (`[v6]:port` included), if it has one.
pub fn port_of(authority: &str) -> Option<&str> {
    let after_host = match authority.strip_prefix('[') {
        Some(rest) => &rest[rest.find(']')? + 1..],
        None => &authority[authority.find(':')?..],
    };
    after_host.strip_prefix(':').filter(|port| !port.is_empty())
}
