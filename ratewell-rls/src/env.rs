//! The environment reader's primitives, shared by every concern's settings: Go's boolean and
//! duration syntax, and typed lookups that name the variable in their errors.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::time::Duration;

/// Go's `strconv.ParseBool`.
pub(crate) fn parse_bool(v: &str) -> Option<bool> {
    match v {
        "1" | "t" | "T" | "TRUE" | "true" | "True" => Some(true),
        "0" | "f" | "F" | "FALSE" | "false" | "False" => Some(false),
        _ => None,
    }
}

/// A Go duration (`10s`, `250ms`, `1h30m`), the subset of units a setting uses.
pub fn parse_duration(v: &str) -> Option<Duration> {
    let mut total = Duration::ZERO;
    let mut rest = v.trim();
    if rest == "0" {
        return Some(Duration::ZERO);
    }
    while !rest.is_empty() {
        let digits = rest.find(|c: char| !c.is_ascii_digit() && c != '.').unwrap_or(rest.len());
        let (number, tail) = rest.split_at(digits);
        let number: f64 = number.parse().ok()?;
        let unit_len = tail.find(|c: char| c.is_ascii_digit()).unwrap_or(tail.len());
        let (unit, tail) = tail.split_at(unit_len);
        let scale = match unit {
            "ns" => 1e-9,
            "us" | "µs" => 1e-6,
            "ms" => 1e-3,
            "s" => 1.0,
            "m" => 60.0,
            "h" => 3600.0,
            _ => return None,
        };
        total += Duration::try_from_secs_f64(number * scale).ok()?;
        rest = tail;
    }
    Some(total)
}

/// Typed lookups in an environment, each error naming the variable and its value.
pub(crate) struct Env<'a>(pub(crate) &'a HashMap<String, String>);

impl Env<'_> {
    pub(crate) fn get(&self, name: &str) -> Option<&str> {
        self.0.get(name).map(String::as_str)
    }

    pub(crate) fn string(&self, name: &str, default: &str) -> String {
        self.get(name).unwrap_or(default).to_owned()
    }

    pub(crate) fn flag(&self, name: &str, default: bool) -> Result<bool, String> {
        match self.get(name) {
            None | Some("") => Ok(default),
            Some(v) => {
                parse_bool(v).ok_or_else(|| format!("{name}={v}: not a boolean (true or false)"))
            }
        }
    }

    pub(crate) fn number<T: std::str::FromStr>(&self, name: &str, default: T) -> Result<T, String> {
        match self.get(name) {
            None | Some("") => Ok(default),
            Some(v) => v.trim().parse().map_err(|_| format!("{name}={v}: not a number")),
        }
    }

    pub(crate) fn addr(
        &self,
        host: &str,
        port: &str,
        defaults: (&str, u16),
    ) -> Result<SocketAddr, String> {
        let h = self.string(host, defaults.0);
        let p: u16 = self.number(port, defaults.1)?;
        if let Ok(ip) = h.parse::<std::net::IpAddr>() {
            return Ok(SocketAddr::new(ip, p));
        }
        // A host name, as the Go service takes one: its first address.
        let mut resolved = std::net::ToSocketAddrs::to_socket_addrs(&(h.as_str(), p))
            .map_err(|e| format!("{host}={h}: not an address: {e}"))?;
        resolved.next().ok_or_else(|| format!("{host}={h}: resolves to no address"))
    }
}
