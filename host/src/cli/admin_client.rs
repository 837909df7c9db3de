//! Asking a running host's admin endpoint from the command line (`probe`,
//! `rollout`): one HTTP/1.1 request on a connection of its own, with the
//! admin token when there is one. The endpoint is the host's own, on an
//! address the config names: no proxy, no TLS.

use std::io::{Read as _, Write as _};
use std::net::{TcpStream, ToSocketAddrs as _};
use std::time::Duration;

use crate::config::LoadedConfig;

/// The largest answer read (a `/rollouts` with its examples is a few KB).
const MAX_ANSWER_BYTES: u64 = 1 << 20;

/// An answer: its status code and its body.
pub struct Answer {
    pub status: u16,
    pub body: String,
}

impl Answer {
    /// The body as JSON, or `null`.
    pub fn json(&self) -> serde_json::Value {
        serde_json::from_str(self.body.trim()).unwrap_or(serde_json::Value::Null)
    }
}

/// `METHOD target` on `address`, bounded by `timeout` for the connection
/// and each read and write.
pub fn request(
    address: &str,
    method: &str,
    target: &str,
    token: Option<&str>,
    timeout: Duration,
) -> std::io::Result<Answer> {
    let socket = address
        .to_socket_addrs()?
        .next()
        .ok_or_else(|| std::io::Error::other("the address resolves to nothing"))?;
    let mut stream = TcpStream::connect_timeout(&socket, timeout)?;
    stream.set_read_timeout(Some(timeout))?;
    stream.set_write_timeout(Some(timeout))?;
    let mut head = format!(
        "{method} {target} HTTP/1.1\r\nHost: {address}\r\nConnection: close\r\nContent-Length: 0\r\n"
    );
    if let Some(token) = token {
        head.push_str(&format!("Authorization: Bearer {token}\r\n"));
    }
    head.push_str("\r\n");
    stream.write_all(head.as_bytes())?;
    let mut raw = Vec::new();
    stream.take(MAX_ANSWER_BYTES).read_to_end(&mut raw)?;
    parse(&String::from_utf8_lossy(&raw)).ok_or_else(|| std::io::Error::other("not an HTTP answer"))
}

/// An HTTP/1.1 answer's status and body (a chunked body is joined).
fn parse(answer: &str) -> Option<Answer> {
    let status = answer.lines().next()?.split(' ').nth(1)?.parse().ok()?;
    let (head, body) = answer.split_once("\r\n\r\n").unwrap_or((answer, ""));
    let chunked = head
        .lines()
        .any(|l| l.to_ascii_lowercase().starts_with("transfer-encoding:") && l.contains("chunked"));
    let body = if chunked {
        unchunk(body)
    } else {
        body.to_string()
    };
    Some(Answer { status, body })
}

fn unchunk(mut body: &str) -> String {
    let mut out = String::new();
    while let Some((size, rest)) = body.split_once("\r\n") {
        let Ok(size) = usize::from_str_radix(size.trim(), 16) else {
            break;
        };
        if size == 0 || rest.len() < size {
            break;
        }
        out.push_str(&rest[..size]);
        body = rest[size..].trim_start_matches("\r\n");
    }
    out
}

/// The endpoint's address and the token to send, from the host's config
/// (`[host] admin_listen`; `ACEMQ_ADMIN_TOKEN`, else `admin_token_file`).
pub fn endpoint_of(config: &LoadedConfig) -> Result<(String, Option<String>), String> {
    let host = &config.config.host;
    let listen = host.admin_listen.as_ref().ok_or_else(|| {
        format!(
            "{}: no [host] admin_listen, so there is no endpoint to ask",
            config.path.display()
        )
    })?;
    // A host listening on every address answers on loopback too.
    let address = listen
        .get_ref()
        .replace("0.0.0.0:", "127.0.0.1:")
        .replace("[::]:", "[::1]:");
    let token = match std::env::var(crate::config::TOKEN_ENV) {
        Ok(token) => Some(token.trim().to_string()),
        Err(_) => match &host.admin_token_file {
            Some(file) => {
                let path = config.resolve(file.get_ref());
                Some(
                    std::fs::read_to_string(&path)
                        .map_err(|e| {
                            format!("host.admin_token_file: cannot read {}: {e}", path.display())
                        })?
                        .trim()
                        .to_string(),
                )
            }
            None => None,
        },
    };
    Ok((address, token))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn status_and_body_are_read_plain_or_chunked() {
        let plain = parse("HTTP/1.1 503 Service Unavailable\r\ncontent-length: 22\r\n\r\n{\"status\":\"NOT_READY\"}").unwrap();
        assert_eq!(
            (plain.status, plain.json()["status"].as_str()),
            (503, Some("NOT_READY"))
        );
        let chunked =
            parse("HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n5\r\n[1,2]\r\n0\r\n\r\n")
                .unwrap();
        assert_eq!(chunked.body, "[1,2]");
        assert!(parse("garbage").is_none());
    }
}
