//! The limits the manual states for talos-opsd (`docs/talos-opsd.md`,
//! "Limits") are the daemon's: the table is built here from the constants
//! and must appear on the page as written.

use std::path::PathBuf;
use std::time::Duration;

use talos_opsd::{accept, config, handshakes, input, ratelimit, recover, service};

/// A duration as the manual writes it: `5s`, `10ms`, `10m`, `3650d`.
fn short(d: Duration) -> String {
    let secs = d.as_secs();
    if secs == 0 {
        return format!("{}ms", d.as_millis());
    }
    if secs.is_multiple_of(86400) && secs >= 2 * 86400 {
        return format!("{}d", secs / 86400);
    }
    let parts = [
        (secs / 3600, "h"),
        (secs % 3600 / 60, "m"),
        (secs % 60, "s"),
    ];
    parts
        .iter()
        .filter(|(n, _)| *n > 0)
        .map(|(n, unit)| format!("{n}{unit}"))
        .collect()
}

fn expected_table() -> String {
    let rows: Vec<(&str, String)> = vec![
        (
            "connections at once on the socket",
            accept::MAX_UNIX_CONNECTIONS.to_string(),
        ),
        (
            "connections at once on TCP",
            accept::MAX_TCP_CONNECTIONS.to_string(),
        ),
        (
            "concurrent calls per connection",
            accept::MAX_STREAMS_PER_CONNECTION.to_string(),
        ),
        (
            "TLS handshakes in progress",
            accept::MAX_TLS_HANDSHAKES.to_string(),
        ),
        (
            "TLS handshakes in progress from one address",
            handshakes::PER_PEER.to_string(),
        ),
        (
            "time to finish a TLS handshake",
            short(accept::TLS_HANDSHAKE_TIMEOUT),
        ),
        (
            "connections on the metrics listener",
            accept::MAX_METRICS_CONNECTIONS.to_string(),
        ),
        (
            "time from connecting to a request's head (the HTTP/2 preface; on the metrics listener the request line and headers)",
            short(accept::HEADER_TIMEOUT),
        ),
        (
            "time a connection may stay without a request in progress",
            short(accept::IDLE_TIMEOUT),
        ),
        (
            "a request message",
            format!("{} MiB", accept::MAX_REQUEST_BYTES / (1024 * 1024)),
        ),
        (
            "entries in a list of a request (nodes, labels to wipe, paths expected to change, certificate fingerprints)",
            input::MAX_LIST_LEN.to_string(),
        ),
        (
            "audit lines about one peer's connections",
            format!(
                "{} per {}",
                ratelimit::LINES_PER_WINDOW,
                short(ratelimit::WINDOW)
            ),
        ),
        (
            "backoff after a failed accept",
            format!(
                "{} doubling to {}",
                short(accept::FIRST_BACKOFF),
                short(accept::MAX_BACKOFF)
            ),
        ),
        ("an operation id", format!("{} bytes", service::MAX_ID_LEN)),
        ("a cluster name", format!("{} bytes", input::MAX_NAME_LEN)),
        (
            "a plan fingerprint",
            format!("{} bytes", input::MAX_FINGERPRINT_LEN),
        ),
        (
            "a string in an operation's parameters",
            format!("{} bytes", input::MAX_FIELD_LEN),
        ),
        (
            "an error message",
            format!("{} bytes", input::MAX_MESSAGE_LEN),
        ),
        (
            "`resume_within` (default)",
            short(recover::DEFAULT_RESUME_WITHIN),
        ),
        (
            "a duration in the configuration",
            format!("1ms to {}", short(config::MAX_DURATION)),
        ),
    ];
    let mut out = String::from("| limit | value |\n|-------|-------|\n");
    for (limit, value) in rows {
        out.push_str(&format!("| {limit} | {value} |\n"));
    }
    out
}

#[test]
fn the_manual_states_the_daemons_limits() {
    let file = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../docs/talos-opsd.md");
    let page = std::fs::read_to_string(&file).unwrap_or_else(|e| panic!("{}: {e}", file.display()));
    let expected = expected_table();
    assert!(
        page.contains(&expected),
        "{} must hold this table:\n{expected}",
        file.display()
    );
}

#[test]
fn the_shortest_configured_duration_is_a_millisecond() {
    assert_eq!(config::parse_duration("1ms"), Ok(Duration::from_millis(1)));
    assert!(config::parse_duration("0ms").is_err());
    assert!(
        config::parse_duration(&format!("{}d", config::MAX_DURATION.as_secs() / 86400 + 1))
            .is_err()
    );
}
