//! One parser for the durations, counts, shares and URLs that a command's
//! flags, the daemon's API and its configuration take. Every function
//! refuses what cannot be meant (overflow, a negative or non-finite
//! number, zero where zero means nothing, a URL that is not one) with an
//! [`InputError`] naming the flag or key, and none of them panics,
//! whatever the input (a property test holds them to that).
//!
//! Durations are written as Go's `time.ParseDuration` reads them (what
//! talosctl's duration flags take: `90s`, `1m30s`, `1.5h`, `500ms`, `0`),
//! optionally with a `d` unit of 24 hours where a configuration file takes
//! one ([`Units::WithDays`]).

use std::time::Duration;

/// A value that cannot be used, naming where it came from.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{what} {value:?}: {reason}")]
#[non_exhaustive]
pub struct InputError {
    /// The flag or key (`--timeout`, `cluster[0].snapshots.interval`).
    pub what: String,
    /// The value as given (cut to 100 characters).
    pub value: String,
    /// What is wrong with it.
    pub reason: String,
}

impl InputError {
    /// `value` of `what` refused for `reason`.
    pub fn new(what: impl Into<String>, value: &str, reason: impl Into<String>) -> InputError {
        InputError {
            what: what.into(),
            value: value.chars().take(100).collect(),
            reason: reason.into(),
        }
    }
}

/// Which units a duration may use.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Units {
    /// Go's: `ns`, `us` (`µs`, `μs`), `ms`, `s`, `m`, `h`.
    Go,
    /// Go's and `d` (24 h), for configuration files.
    WithDays,
}

/// The longest duration Go can hold (2^63 - 1 ns, about 292 years): the
/// most any duration parses to.
pub const MAX_GO_DURATION: Duration = Duration::from_nanos(i64::MAX as u64);

/// Parses `text` as a duration of `what` (a flag or key, for the error):
/// Go's syntax (a sequence of decimal numbers, each with an optional
/// fraction and a unit; `0` alone needs none). Negative durations and
/// anything above [`MAX_GO_DURATION`] are refused.
pub fn duration(what: &str, text: &str, units: Units) -> Result<Duration, InputError> {
    let bad = |reason: &str| InputError::new(what, text, reason);
    let examples = match units {
        Units::Go => "a number and a unit: 30s, 1m30s, 1.5h, 500ms",
        Units::WithDays => "a number and a unit: 30s, 1m30s, 1.5h, 500ms, 7d",
    };
    let mut rest = text.trim();
    if let Some(unsigned) = rest.strip_prefix('+') {
        rest = unsigned;
    } else if rest.starts_with('-') {
        return Err(bad("a duration cannot be negative"));
    }
    if rest == "0" {
        return Ok(Duration::ZERO);
    }
    if rest.is_empty() {
        return Err(bad(&format!("not a duration: {examples}")));
    }
    let mut total: u128 = 0;
    while !rest.is_empty() {
        let number_len = rest
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .unwrap_or(rest.len());
        let (number, tail) = rest.split_at(number_len);
        let (whole, fraction) = number.split_once('.').unwrap_or((number, ""));
        if whole.is_empty() && fraction.is_empty() || fraction.contains('.') {
            return Err(bad(&format!("not a duration: {examples}")));
        }
        let unit_len = tail
            .find(|c: char| c.is_ascii_digit() || c == '.')
            .unwrap_or(tail.len());
        let (unit, after) = tail.split_at(unit_len);
        let nanos = unit_nanos(unit, units).ok_or_else(|| {
            if unit.is_empty() {
                bad(&format!("a unit is missing: {examples}"))
            } else {
                bad(&format!("unknown unit {unit:?}: {examples}"))
            }
        })?;
        total = total
            .checked_add(scaled(whole, fraction, nanos).ok_or_else(|| too_long(what, text))?)
            .filter(|t| *t <= MAX_GO_DURATION.as_nanos())
            .ok_or_else(|| too_long(what, text))?;
        rest = after;
    }
    // At most 2^63 - 1 ns: fits a u64.
    Ok(Duration::from_nanos(total as u64))
}

fn too_long(what: &str, text: &str) -> InputError {
    InputError::new(
        what,
        text,
        "longer than any duration can be (about 292 years)",
    )
}

fn unit_nanos(unit: &str, units: Units) -> Option<u128> {
    Some(match unit {
        "ns" => 1,
        "us" | "µs" | "μs" => 1_000,
        "ms" => 1_000_000,
        "s" => 1_000_000_000,
        "m" => 60_000_000_000,
        "h" => 3_600_000_000_000,
        "d" if units == Units::WithDays => 86_400_000_000_000,
        _ => return None,
    })
}

/// `whole.fraction` times `unit` ns (the fraction truncated to whole ns),
/// or `None` past [`MAX_GO_DURATION`].
fn scaled(whole: &str, fraction: &str, unit: u128) -> Option<u128> {
    let limit = MAX_GO_DURATION.as_nanos();
    let mut value: u128 = 0;
    for digit in whole.bytes() {
        value = value * 10 + u128::from(digit - b'0');
        if value * unit > limit {
            return None;
        }
    }
    let mut total = value * unit;
    // Digits beyond the 20th cannot add a whole nanosecond to any unit
    // here (the largest, a day, is under 10^14 ns).
    let mut scale: u128 = 1;
    let mut numerator: u128 = 0;
    for digit in fraction.bytes().take(20) {
        numerator = numerator * 10 + u128::from(digit - b'0');
        scale *= 10;
    }
    total += numerator * unit / scale;
    (total <= limit).then_some(total)
}

/// `value` of `what` if it lies within `[min, max]`, else why not.
pub fn within(what: &str, value: Duration, min: Duration, max: Duration) -> Result<(), InputError> {
    if value < min || value > max {
        return Err(InputError::new(
            what,
            &format_duration(value),
            format!(
                "must lie between {} and {}",
                format_duration(min),
                format_duration(max)
            ),
        ));
    }
    Ok(())
}

/// A duration as Go prints it (`1h2m3s`, `1.5s`, `250ms`, `0s`).
pub fn format_duration(d: Duration) -> String {
    if d.is_zero() {
        return "0s".into();
    }
    if d < Duration::from_secs(1) {
        let nanos = d.subsec_nanos();
        return match nanos {
            n if n % 1_000_000 == 0 => format!("{}ms", n / 1_000_000),
            n if n % 1_000 == 0 => format!("{}µs", n / 1_000),
            n => format!("{n}ns"),
        };
    }
    let secs = d.as_secs();
    let (h, m, s) = (secs / 3600, secs / 60 % 60, secs % 60);
    let mut seconds = s.to_string();
    if d.subsec_nanos() != 0 {
        let fraction = format!("{:09}", d.subsec_nanos());
        seconds.push('.');
        seconds.push_str(fraction.trim_end_matches('0'));
    }
    match (h, m) {
        (0, 0) => format!("{seconds}s"),
        (0, m) => format!("{m}m{seconds}s"),
        (h, m) => format!("{h}h{m}m{seconds}s"),
    }
}

/// A count of `what` between `min` and `max`.
pub fn count(what: &str, text: &str, min: u64, max: u64) -> Result<u64, InputError> {
    let n: u64 = text.trim().parse().map_err(|_| {
        InputError::new(
            what,
            text,
            format!("not a whole number from {min} to {max}"),
        )
    })?;
    if n < min || n > max {
        return Err(InputError::new(
            what,
            text,
            format!("must lie between {min} and {max}"),
        ));
    }
    Ok(n)
}

/// A share in `(0, 1]` (a fraction of a whole, such as an in-use share),
/// refusing NaN and infinities.
pub fn share(what: &str, value: f64) -> Result<f64, InputError> {
    if value.is_finite() && value > 0.0 && value <= 1.0 {
        Ok(value)
    } else {
        Err(InputError::new(
            what,
            &value.to_string(),
            "must be a share in (0, 1]",
        ))
    }
}

/// A parsed `http(s)://HOST[:PORT]` URL with no path, query or
/// credentials: where a client connects.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Endpoint {
    /// `https` or `http`.
    pub scheme: String,
    /// The host (an IPv6 address without its brackets).
    pub host: String,
    /// The port, or the scheme's.
    pub port: u16,
}

impl Endpoint {
    /// `scheme://host:port` (brackets around an IPv6 address).
    pub fn url(&self) -> String {
        if self.host.contains(':') {
            format!("{}://[{}]:{}", self.scheme, self.host, self.port)
        } else {
            format!("{}://{}:{}", self.scheme, self.host, self.port)
        }
    }
}

/// Parses `text` as an endpoint URL of `what` whose scheme is one of
/// `schemes` (`https`, or `http` where a plain endpoint is allowed).
pub fn endpoint(what: &str, text: &str, schemes: &[&str]) -> Result<Endpoint, InputError> {
    let bad = |reason: String| InputError::new(what, text, reason);
    let wanted = schemes
        .iter()
        .map(|s| format!("{s}://HOST[:PORT]"))
        .collect::<Vec<_>>()
        .join(" or ");
    let (scheme, rest) = text
        .trim()
        .split_once("://")
        .ok_or_else(|| bad(format!("not a URL: {wanted}")))?;
    let scheme = scheme.to_ascii_lowercase();
    if !schemes.contains(&scheme.as_str()) {
        return Err(bad(format!("the scheme must be {wanted}")));
    }
    let authority = rest.strip_suffix('/').unwrap_or(rest);
    if authority.contains(['/', '?', '#']) {
        return Err(bad(format!("no path, query or fragment: {wanted}")));
    }
    if authority.contains('@') {
        return Err(bad("credentials do not belong in the URL".into()));
    }
    let (host, port) = if let Some(v6) = authority.strip_prefix('[') {
        let (host, tail) = v6
            .split_once(']')
            .ok_or_else(|| bad("an IPv6 address lacks its closing ']'".into()))?;
        if host.parse::<std::net::Ipv6Addr>().is_err() {
            return Err(bad(format!("{host:?} is not an IPv6 address")));
        }
        match tail {
            "" => (host, None),
            _ => (
                host,
                Some(
                    tail.strip_prefix(':')
                        .ok_or_else(|| bad(format!("{tail:?} after the address")))?,
                ),
            ),
        }
    } else {
        match authority.rsplit_once(':') {
            Some((host, port)) => (host, Some(port)),
            None => (authority, None),
        }
    };
    let valid_host = !host.is_empty()
        && host.len() <= 253
        && (host.contains(':')
            || host
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '.' || c == '_'));
    if !valid_host {
        return Err(bad(format!("{host:?} is not a host name or address")));
    }
    let port = match port {
        None => default_port(&scheme),
        Some(port) => match port.parse::<u16>() {
            Ok(p) if p != 0 && port.chars().all(|c| c.is_ascii_digit()) => p,
            _ => return Err(bad(format!("{port:?} is not a port (1 to 65535)"))),
        },
    };
    Ok(Endpoint {
        scheme,
        host: host.to_string(),
        port,
    })
}

fn default_port(scheme: &str) -> u16 {
    if scheme == "http" { 80 } else { 443 }
}

#[cfg(test)]
#[path = "input_tests.rs"]
mod tests;
