//! How errors look after passing through Go code: Talos's handlers, the etcd
//! Go client and grpc-go. The simulator is written in Rust, but a client of
//! Talos sees codes and texts made by Go, so these helpers reproduce them.

use tonic::{Code, Status};

/// Go's name of a gRPC code, as it appears in `rpc error: code = ...`.
pub(crate) fn code_name(code: Code) -> &'static str {
    match code {
        Code::Ok => "OK",
        Code::Cancelled => "Canceled",
        Code::Unknown => "Unknown",
        Code::InvalidArgument => "InvalidArgument",
        Code::DeadlineExceeded => "DeadlineExceeded",
        Code::NotFound => "NotFound",
        Code::AlreadyExists => "AlreadyExists",
        Code::PermissionDenied => "PermissionDenied",
        Code::ResourceExhausted => "ResourceExhausted",
        Code::FailedPrecondition => "FailedPrecondition",
        Code::Aborted => "Aborted",
        Code::OutOfRange => "OutOfRange",
        Code::Unimplemented => "Unimplemented",
        Code::Internal => "Internal",
        Code::Unavailable => "Unavailable",
        Code::DataLoss => "DataLoss",
        Code::Unauthenticated => "Unauthenticated",
    }
}

/// A status error as Go's `err.Error()` renders it.
pub(crate) fn rpc_error_text(status: &Status) -> String {
    format!(
        "rpc error: code = {} desc = {}",
        code_name(status.code()),
        status.message()
    )
}

/// A string quoted as Go's `%q` (strconv.Quote) quotes it.
pub(crate) fn quote(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\x07' => out.push_str("\\a"),
            '\x08' => out.push_str("\\b"),
            '\x0c' => out.push_str("\\f"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            '\x0b' => out.push_str("\\v"),
            c if (c as u32) < 0x20 || c == '\x7f' => out.push_str(&format!("\\x{:02x}", c as u32)),
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

/// Whether `addr` carries a port, by the rule of siderolabs/net
/// `AddressContainsPort`: Go's `net.SplitHostPort` accepts it, and a host
/// with colons inside brackets is an IP address.
pub(crate) fn contains_port(addr: &str) -> bool {
    match split_host_port(addr) {
        Some(host) if host.contains(':') => {
            host.parse::<std::net::Ipv6Addr>().is_ok() || {
                // A zone (`fe80::1%eth0`) is accepted by Go's netip.ParseAddr.
                host.split_once('%').is_some_and(|(ip, zone)| {
                    !zone.is_empty() && ip.parse::<std::net::Ipv6Addr>().is_ok()
                })
            }
        }
        Some(_) => true,
        None => false,
    }
}

/// The host part when Go's `net.SplitHostPort` accepts `hostport`.
fn split_host_port(hostport: &str) -> Option<&str> {
    let last_colon = hostport.rfind(':')?;
    let (host, open, close_from) = if hostport.starts_with('[') {
        let end = hostport.find(']')?;
        if end + 1 != last_colon {
            return None;
        }
        (&hostport[1..end], 1, end + 1)
    } else {
        let host = &hostport[..last_colon];
        if host.contains(':') {
            return None;
        }
        (host, 0, 0)
    };
    if hostport[open..].contains('[') || hostport[close_from..].contains(']') {
        return None;
    }
    Some(host)
}

/// The descriptions the etcd Go client turns into `rpctypes.EtcdError`
/// (api/v3rpc/rpctypes/error.go, `errStringToError`, etcd v3.6, the client
/// Talos 1.13.9 uses). Such an error carries no gRPC status once wrapped, so
/// a Talos handler returning it answers Unknown; any other etcd client error
/// (a transport failure) keeps its status.
const ETCD_SERVER_ERRORS: &[&str] = &[
    "etcdserver: key is not provided",
    "etcdserver: key not found",
    "etcdserver: value is provided",
    "etcdserver: lease is provided",
    "etcdserver: too many operations in txn request",
    "etcdserver: duplicate key given in txn request",
    "etcdserver: invalid sort option",
    "etcdserver: mvcc: required revision has been compacted",
    "etcdserver: mvcc: required revision is a future revision",
    "etcdserver: mvcc: database space exceeded",
    "etcdserver: requested lease not found",
    "etcdserver: lease already exists",
    "etcdserver: too large lease TTL",
    "etcdserver: member ID already exist",
    "etcdserver: Peer URLs already exists",
    "etcdserver: re-configuration failed due to not enough started members",
    "etcdserver: given member URLs are invalid",
    "etcdserver: member not found",
    "etcdserver: can only promote a learner member",
    "etcdserver: can only promote a learner member which is in sync with leader",
    "etcdserver: too many learner members in cluster",
    "etcdserver: cluster ID mismatch",
    "etcdserver: request is too large",
    "etcdserver: too many requests",
    "etcdserver: root user does not exist",
    "etcdserver: root user does not have root role",
    "etcdserver: user name already exists",
    "etcdserver: user name is empty",
    "etcdserver: user name not found",
    "etcdserver: role name already exists",
    "etcdserver: role name not found",
    "etcdserver: role name is empty",
    "etcdserver: authentication failed, invalid user ID or password",
    "etcdserver: permission denied",
    "etcdserver: role is not granted to the user",
    "etcdserver: permission is not granted to the role",
    "etcdserver: authentication is not enabled",
    "etcdserver: invalid auth token",
    "etcdserver: invalid auth management",
    "etcdserver: revision of auth store is old",
    "etcdserver: no leader",
    "etcdserver: not leader",
    "etcdserver: leader changed",
    "etcdserver: not capable",
    "etcdserver: server stopped",
    "etcdserver: request timed out",
    "etcdserver: request timed out, possibly due to previous leader failure",
    "etcdserver: request timed out, possibly due to connection lost",
    "etcdserver: unhealthy cluster",
    "etcdserver: corrupt cluster",
    "etcdserver: rpc not supported for learner",
    "etcdserver: bad leader transferee",
    "etcdserver: cluster version not found during downgrade",
    "etcdserver: wrong downgrade target version format",
    "etcdserver: invalid downgrade target version",
    "etcdserver: cluster has a downgrade job in progress",
    "etcdserver: no inflight downgrade job",
];

/// An error of the etcd Go client, as Talos code holds it.
#[derive(Debug, Clone)]
pub(crate) enum EtcdError {
    /// A server error known to the client (`rpctypes.EtcdError`): its text
    /// is the description alone and it carries no status.
    Server(String),
    /// The call's deadline passed: the client returns the context's error.
    Deadline,
    /// Anything else keeps its gRPC status.
    Transport(Status),
}

impl EtcdError {
    /// What the etcd Go client returns for the status the server (or the
    /// transport) produced (client/v3 `ContextError`).
    pub(crate) fn from_status(status: &Status) -> EtcdError {
        if ETCD_SERVER_ERRORS.contains(&status.message()) {
            EtcdError::Server(status.message().to_string())
        } else if matches!(status.code(), Code::DeadlineExceeded | Code::Cancelled) {
            EtcdError::Deadline
        } else {
            EtcdError::Transport(status.clone())
        }
    }

    /// Go's `err.Error()`.
    pub(crate) fn text(&self) -> String {
        match self {
            EtcdError::Server(desc) => desc.clone(),
            EtcdError::Deadline => "context deadline exceeded".into(),
            EtcdError::Transport(status) => rpc_error_text(status),
        }
    }

    /// Whether this is the server error with description `desc`.
    pub(crate) fn is(&self, desc: &str) -> bool {
        matches!(self, EtcdError::Server(d) if d == desc)
    }

    /// The status grpc-go sends when a handler returns this error wrapped
    /// in `context` (`fmt.Errorf("context: %w", err)`): the wrapped status's
    /// code with the whole text, DeadlineExceeded for a context error,
    /// Unknown otherwise (grpc-go status.FromError, FromContextError).
    pub(crate) fn wrapped(&self, context: &str) -> Status {
        let message = if context.is_empty() {
            self.text()
        } else {
            format!("{context}: {}", self.text())
        };
        match self {
            EtcdError::Server(_) => Status::unknown(message),
            EtcdError::Deadline => Status::deadline_exceeded(message),
            EtcdError::Transport(status) if context.is_empty() => status.clone(),
            EtcdError::Transport(status) => Status::new(status.code(), message),
        }
    }

    /// The status of the error returned as is by a handler.
    pub(crate) fn returned(&self) -> Status {
        self.wrapped("")
    }
}

/// The etcd client's error for a status, returned by a handler wrapped in
/// `context`.
pub(crate) fn etcd_wrapped(context: &str) -> impl Fn(Status) -> Status + '_ {
    move |status| EtcdError::from_status(&status).wrapped(context)
}

/// The etcd client's error for a status, returned by a handler as is.
pub(crate) fn etcd_returned(status: Status) -> Status {
    EtcdError::from_status(&status).returned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ports_are_found_as_go_splits_host_and_port() {
        for with_port in [
            "10.0.0.1:50000",
            "cp-1:1",
            "[::1]:50000",
            ":50000",
            "10.0.0.1:",
            "[fe80::1%eth0]:5",
        ] {
            assert!(contains_port(with_port), "{with_port}");
        }
        for without in [
            "10.0.0.1", "cp-1", "", "::1", "fe80::1", "[::1]", "a:b:c", "[x:y]:1", "[::1]]:1",
        ] {
            assert!(!contains_port(without), "{without}");
        }
    }

    #[test]
    fn strings_are_quoted_as_go_quotes_them() {
        assert_eq!(quote(""), r#""""#);
        assert_eq!(quote("a\"b\\c\td\x01"), r#""a\"b\\c\td\x01""#);
    }

    #[test]
    fn wrapped_etcd_errors_keep_codes_as_grpc_go_does() {
        // A server error known to the etcd client: Unknown, bare description.
        let s = EtcdError::from_status(&Status::unavailable("etcdserver: unhealthy cluster"))
            .wrapped("failed to leave cluster");
        assert_eq!(s.code(), Code::Unknown);
        assert_eq!(
            s.message(),
            "failed to leave cluster: etcdserver: unhealthy cluster"
        );
        // A transport error: its code, and Go's rendering of it.
        let s = EtcdError::from_status(&Status::unavailable("connection refused"))
            .wrapped("failed to query etcd status");
        assert_eq!(s.code(), Code::Unavailable);
        assert_eq!(
            s.message(),
            "failed to query etcd status: rpc error: code = Unavailable desc = connection refused"
        );
        // Returned unwrapped: the server error is Unknown, the other unchanged.
        assert_eq!(
            etcd_returned(Status::unavailable("etcdserver: no leader")).code(),
            Code::Unknown
        );
        let s = etcd_returned(Status::unavailable("connection refused"));
        assert_eq!(
            (s.code(), s.message()),
            (Code::Unavailable, "connection refused")
        );
        // A deadline becomes the context's error.
        let s = EtcdError::from_status(&Status::deadline_exceeded("Timeout expired"))
            .wrapped("failed to defragment etcd");
        assert_eq!(s.code(), Code::DeadlineExceeded);
        assert_eq!(
            s.message(),
            "failed to defragment etcd: context deadline exceeded"
        );
    }
}
