//! Bounds on what a request may carry, checked before anything uses it, so
//! that no name, node or id reaches a log line, an error trailer or the
//! journal at a size the caller chose.

use talos_opsd_api::proto::start_operation_request::Kind;
use tonic::Status;

use crate::service::quoted;

/// The longest cluster name (or talosconfig context name) accepted.
pub const MAX_NAME_LEN: usize = 256;
/// The longest string anywhere in an operation's parameters (a node, an
/// endpoint, a path, a label).
pub const MAX_FIELD_LEN: usize = 1024;
/// The longest plan fingerprint accepted (a SHA-256 in hex is 64).
pub const MAX_FINGERPRINT_LEN: usize = 128;
/// The longest error message sent back; longer ones are cut.
pub const MAX_MESSAGE_LEN: usize = 2048;
/// The most entries of any list in a request (nodes, labels to wipe,
/// paths expected to change, certificate fingerprints): far above any
/// cluster's, far below what a message could carry.
pub const MAX_LIST_LEN: usize = 256;

/// Refuses a request whose lists are longer than [`MAX_LIST_LEN`]
/// (`INVALID_ARGUMENT`, naming the list), before anything else is made of
/// them.
pub fn check_lists(kind: &Kind) -> Result<(), Status> {
    let fingerprints = |m: &Option<talos_opsd_api::proto::MaintenanceConfig>| {
        m.as_ref().map_or(0, |m| m.cert_fingerprints.len())
    };
    let lists: Vec<(&str, usize)> = match kind {
        Kind::Snapshot(_) => Vec::new(),
        Kind::Retire(r) => vec![("retire.wipe", r.wipe.len())],
        Kind::Join(j) => vec![(
            "join.maintenance.cert_fingerprints",
            fingerprints(&j.maintenance),
        )],
        Kind::Migrate(m) => vec![
            ("migrate.wipe", m.wipe.len()),
            (
                "migrate.maintenance.cert_fingerprints",
                fingerprints(&m.maintenance),
            ),
        ],
        Kind::Apply(a) => vec![
            ("apply.nodes", a.nodes.len()),
            ("apply.expect_change", a.expect_change.len()),
        ],
        Kind::Defrag(d) => vec![("defrag.nodes", d.nodes.len())],
        Kind::Upgrade(u) => vec![("upgrade.nodes", u.nodes.len())],
    };
    match lists.into_iter().find(|(_, len)| *len > MAX_LIST_LEN) {
        None => Ok(()),
        Some((list, len)) => Err(Status::invalid_argument(format!(
            "{list} has {len} entries, more than {MAX_LIST_LEN}"
        ))),
    }
}

/// Parameters (as JSON) for an audit line: every string longer than a
/// name cut with its length, the whole at most 1024 bytes.
pub fn described(params: &serde_json::Value) -> String {
    fn cut(value: &serde_json::Value) -> serde_json::Value {
        match value {
            serde_json::Value::String(s) if s.chars().count() > talos_client::text::NAME_BOUND => {
                let kept: String = s.chars().take(talos_client::text::NAME_BOUND).collect();
                serde_json::Value::String(format!("{kept}... ({} bytes)", s.len()))
            }
            serde_json::Value::Array(items) => items.iter().map(cut).collect(),
            serde_json::Value::Object(map) => {
                map.iter().map(|(k, v)| (k.clone(), cut(v))).collect()
            }
            other => other.clone(),
        }
    }
    truncated(&cut(params).to_string(), 1024)
}

/// Refuses a cluster name longer than [`MAX_NAME_LEN`] (`INVALID_ARGUMENT`).
pub fn check_name(name: &str) -> Result<(), Status> {
    if name.len() > MAX_NAME_LEN {
        return Err(Status::invalid_argument(format!(
            "cluster {} is longer than {MAX_NAME_LEN} bytes",
            quoted(name)
        )));
    }
    Ok(())
}

/// Refuses a fingerprint longer than [`MAX_FINGERPRINT_LEN`].
pub fn check_fingerprint(fingerprint: &str) -> Result<(), Status> {
    if fingerprint.len() > MAX_FINGERPRINT_LEN {
        return Err(Status::invalid_argument(format!(
            "plan_fingerprint {} is longer than {MAX_FINGERPRINT_LEN} bytes",
            quoted(fingerprint)
        )));
    }
    Ok(())
}

/// Refuses parameters (as JSON) holding a string longer than
/// [`MAX_FIELD_LEN`], naming where it is.
pub fn check_fields(value: &serde_json::Value) -> Result<(), Status> {
    match too_long(value, "") {
        None => Ok(()),
        Some((at, text)) => Err(Status::invalid_argument(format!(
            "{at} {} is longer than {MAX_FIELD_LEN} bytes",
            quoted(text)
        ))),
    }
}

fn too_long<'a>(value: &'a serde_json::Value, at: &str) -> Option<(String, &'a str)> {
    match value {
        serde_json::Value::String(s) if s.len() > MAX_FIELD_LEN => {
            Some((at.trim_start_matches('.').to_string(), s))
        }
        serde_json::Value::Array(items) => items
            .iter()
            .enumerate()
            .find_map(|(i, v)| too_long(v, &format!("{at}[{i}]"))),
        serde_json::Value::Object(map) => map
            .iter()
            .find_map(|(k, v)| too_long(v, &format!("{at}.{k}"))),
        _ => None,
    }
}

/// `text` cut to at most `max` bytes on a character boundary, saying so.
pub fn truncated(text: &str, max: usize) -> String {
    if text.len() <= max {
        return text.to_string();
    }
    let mut cut = max;
    while !text.is_char_boundary(cut) {
        cut -= 1;
    }
    format!("{}... ({} bytes)", &text[..cut], text.len())
}

/// `status` with the control characters of its message escaped (it may
/// quote what a caller sent) and the message cut to [`MAX_MESSAGE_LEN`],
/// its code, details and metadata kept, so that it always fits in a
/// trailer and stays one line wherever it is shown.
pub fn bounded(status: Status) -> Status {
    let message = status.message();
    let clean = talos_client::text::escaped(message, usize::MAX).to_string();
    if clean.len() <= MAX_MESSAGE_LEN && clean == message {
        return status;
    }
    let message = truncated(&clean, MAX_MESSAGE_LEN);
    let mut cut = Status::with_details(status.code(), message, status.details().to_vec().into());
    *cut.metadata_mut() = status.metadata().clone();
    cut
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn long_fields_are_found_and_cut() {
        let long = "n".repeat(MAX_FIELD_LEN + 1);
        let value = serde_json::json!({"retire": {"node": long, "other": ["ok"]}});
        let e = check_fields(&value).unwrap_err();
        assert!(
            e.message().starts_with("retire.node \"nnn"),
            "{}",
            e.message()
        );
        assert!(e.message().len() < 200, "{}", e.message());
        assert!(check_fields(&serde_json::json!({"a": ["x"]})).is_ok());
        let status = bounded(Status::not_found("é".repeat(MAX_MESSAGE_LEN)));
        assert!(status.message().len() < MAX_MESSAGE_LEN + 40);
        assert_eq!(status.code(), tonic::Code::NotFound);
        let status = bounded(Status::failed_precondition("x\nforged\u{1b}[2J"));
        assert_eq!(status.message(), "x\\nforged\\u{1b}[2J");
    }

    #[test]
    fn long_lists_are_refused_by_name() {
        let labels = vec!["STATE".to_string(); MAX_LIST_LEN + 1];
        let kind = Kind::Retire(talos_opsd_api::proto::RetireParams {
            wipe: labels,
            ..Default::default()
        });
        let e = check_lists(&kind).unwrap_err();
        assert_eq!(e.code(), tonic::Code::InvalidArgument);
        assert!(e.message().contains("retire.wipe"), "{}", e.message());
    }

    #[test]
    fn described_parameters_cut_each_long_string() {
        let params = serde_json::json!({"retire": {"node": "n".repeat(1000), "wipe": ["STATE"]}});
        let text = described(&params);
        assert!(text.contains("... (1000 bytes)"), "{text}");
        assert!(text.len() < 200, "{text}");
    }
}
