use std::time::Duration;

use proptest::prelude::*;

use super::*;

fn go(text: &str) -> Result<Duration, InputError> {
    duration("--timeout", text, Units::Go)
}

#[test]
fn go_durations_parse_as_go_reads_them() {
    for (text, expected) in [
        ("0", Duration::ZERO),
        ("+0", Duration::ZERO),
        ("0s", Duration::ZERO),
        ("90s", Duration::from_secs(90)),
        ("1m30s", Duration::from_secs(90)),
        ("1.5h", Duration::from_secs(5400)),
        ("1.5s", Duration::from_millis(1500)),
        (".5s", Duration::from_millis(500)),
        ("5.s", Duration::from_secs(5)),
        ("500ms", Duration::from_millis(500)),
        ("2us", Duration::from_micros(2)),
        ("2µs", Duration::from_micros(2)),
        ("2μs", Duration::from_micros(2)),
        ("7ns", Duration::from_nanos(7)),
        ("2h45m", Duration::from_secs(9900)),
        ("2562047h47m16.854775807s", MAX_GO_DURATION),
    ] {
        assert_eq!(go(text).unwrap(), expected, "{text}");
    }
    assert_eq!(
        duration("interval", "7d", Units::WithDays).unwrap(),
        Duration::from_secs(7 * 86400)
    );
}

#[test]
fn go_durations_refuse_what_go_refuses_and_negatives() {
    for (text, reason) in [
        ("", "not a duration"),
        ("10", "a unit is missing"),
        ("1x", "unknown unit"),
        ("7d", "unknown unit"),
        (".", "not a duration"),
        ("1..5s", "not a duration"),
        ("s", "not a duration"),
        ("-5s", "cannot be negative"),
        ("1s2", "a unit is missing"),
        ("99999999999999999999s", "longer than any duration"),
        ("2562047h47m16.854775808s", "longer than any duration"),
        ("9223372036854775808ns", "longer than any duration"),
        ("NaNs", "not a duration"),
        ("infs", "not a duration"),
    ] {
        let e = go(text).unwrap_err();
        assert_eq!(e.what, "--timeout");
        assert!(e.to_string().contains(reason), "{text}: {e}");
    }
}

#[test]
fn bounds_name_the_flag_and_the_range() {
    let e = within(
        "--try-timeout",
        Duration::from_millis(500),
        Duration::from_secs(1),
        Duration::from_secs(3600),
    )
    .unwrap_err();
    assert_eq!(
        e.to_string(),
        "--try-timeout \"500ms\": must lie between 1s and 1h0m0s"
    );
    assert!(
        within(
            "x",
            Duration::from_secs(1),
            Duration::ZERO,
            Duration::from_secs(1)
        )
        .is_ok()
    );
    assert_eq!(format_duration(Duration::from_millis(1500)), "1.5s");
    assert_eq!(format_duration(Duration::from_secs(90)), "1m30s");
}

#[test]
fn endpoints_are_urls_with_a_host_and_nothing_else() {
    let e = endpoint("--lease-probe", "https://10.5.0.2:7445", &["https"]).unwrap();
    assert_eq!((e.host.as_str(), e.port), ("10.5.0.2", 7445));
    let e = endpoint("--lease-probe", "https://[fd00::2]", &["https"]).unwrap();
    assert_eq!((e.host.as_str(), e.port), ("fd00::2", 443));
    assert_eq!(e.url(), "https://[fd00::2]:443");
    let e = endpoint(
        "s3_endpoint",
        "http://minio.local:9000/",
        &["http", "https"],
    )
    .unwrap();
    assert_eq!(e.url(), "http://minio.local:9000");
    for (text, reason) in [
        ("not a url", "not a URL"),
        ("http://10.0.0.1:6443", "the scheme must be https"),
        ("https://", "not a host"),
        ("https://host:0", "not a port"),
        ("https://host:65536", "not a port"),
        ("https://host:+80", "not a port"),
        ("https://host/path", "no path"),
        ("https://user:pw@host", "credentials"),
        ("https://[fd00::2", "closing"),
        ("https://[nope]:1", "not an IPv6"),
        ("https://ho st", "not a host"),
    ] {
        let e = endpoint("--lease-probe", text, &["https"]).unwrap_err();
        assert!(e.to_string().contains(reason), "{text}: {e}");
        assert!(e.to_string().starts_with("--lease-probe "), "{e}");
    }
}

#[test]
fn counts_and_shares_refuse_what_is_out_of_range() {
    assert_eq!(count("--keep", "3", 0, 10).unwrap(), 3);
    assert!(count("--keep", "-1", 0, 10).is_err());
    assert!(count("--keep", "99999999999999999999999", 0, u64::MAX).is_err());
    assert!(count("--parallel", "0", 1, 64).is_err());
    assert_eq!(share("--threshold", 0.5).unwrap(), 0.5);
    for bad in [f64::NAN, f64::INFINITY, 0.0, -0.1, 1.5] {
        assert!(share("--threshold", bad).is_err(), "{bad}");
    }
}

/// Strings made of the characters durations and URLs are written with,
/// so that the generator reaches deep into both parsers.
fn near_miss() -> impl Strategy<Value = String> {
    proptest::string::string_regex("[-+0-9.a-zµμ:/\\[\\]@?# ]{0,40}").unwrap()
}

proptest! {
    /// No input makes a parser panic, and what a duration parser accepts
    /// is no longer than Go's longest duration.
    #[test]
    fn no_input_panics(text in any::<String>(), near in near_miss(), f in any::<f64>()) {
        for t in [&text, &near] {
            for units in [Units::Go, Units::WithDays] {
                if let Ok(d) = duration("--x", t, units) {
                    prop_assert!(d <= MAX_GO_DURATION);
                }
            }
            let _ = endpoint("--x", t, &["https", "http"]);
            let _ = count("--x", t, 1, u64::MAX);
        }
        let _ = share("--x", f);
    }

    /// A sum of Go terms parses to its value, whatever their sizes,
    /// unless it passes Go's longest duration, which is then refused.
    #[test]
    fn sums_of_terms_parse_exactly_or_overflow(
        terms in proptest::collection::vec((0u64..u64::MAX, 0usize..6), 1..4)
    ) {
        const UNITS: [(&str, u128); 6] = [
            ("ns", 1), ("us", 1_000), ("ms", 1_000_000), ("s", 1_000_000_000),
            ("m", 60_000_000_000), ("h", 3_600_000_000_000),
        ];
        let text: String = terms.iter().map(|(n, u)| format!("{n}{}", UNITS[*u].0)).collect();
        let expected: u128 = terms.iter().map(|(n, u)| u128::from(*n) * UNITS[*u].1).sum();
        match go(&text) {
            Ok(d) => prop_assert_eq!(d.as_nanos(), expected),
            Err(e) => {
                prop_assert!(expected > MAX_GO_DURATION.as_nanos(), "{}: {}", text, e);
                prop_assert!(e.to_string().contains("longer than any duration"));
            }
        }
    }
}
