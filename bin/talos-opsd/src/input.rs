//! Bounds on what a request may carry, checked before anything uses it, so
//! that no name, node or id reaches a log line, an error trailer or the
//! journal at a size the caller chose.

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

/// `status` with its message cut to [`MAX_MESSAGE_LEN`], its code,
/// details and metadata kept, so that it always fits in a trailer.
pub fn bounded(status: Status) -> Status {
    if status.message().len() <= MAX_MESSAGE_LEN {
        return status;
    }
    let message = truncated(status.message(), MAX_MESSAGE_LEN);
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
    }
}
