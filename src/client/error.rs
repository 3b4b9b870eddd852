//! Errors of API calls, with gRPC status codes mapped to variants a caller can
//! match on.

use std::fmt;
use std::path::PathBuf;

use tonic::Code;

use crate::config::ConfigError;
use crate::tls::TlsError;

/// Where a failed call was answered, and what the server said.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Failure {
    /// The node the call targeted or that reported the failure, if known.
    pub node: Option<String>,
    /// The server's message.
    pub message: String,
}

impl fmt::Display for Failure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.node {
            Some(node) => write!(f, "node {node}: {}", self.message),
            None => f.write_str(&self.message),
        }
    }
}

/// One endpoint that could not be reached, and why.
#[derive(Debug, Clone)]
pub struct ConnectAttempt {
    /// The endpoint (`host:port`).
    pub endpoint: String,
    /// Why the connection failed.
    pub reason: String,
}

/// Errors of the Talos API client.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The talosconfig could not be used.
    #[error(transparent)]
    Config(Box<ConfigError>),
    /// The TLS material could not be used.
    #[error("{origin}: {source}")]
    Tls {
        /// Where the material came from (a talosconfig context, a builder).
        origin: String,
        /// The problem.
        #[source]
        source: Box<TlsError>,
    },
    /// The client was built without something it needs.
    #[error("client configuration: {0}")]
    Builder(&'static str),
    /// No endpoint could be reached.
    #[error("cannot reach any endpoint: {}", attempts(.0))]
    Connect(Vec<ConnectAttempt>),
    /// The caller's role does not allow the call (gRPC PermissionDenied).
    #[error("permission denied: {0}")]
    PermissionDenied(Failure),
    /// The client certificate was not accepted (gRPC Unauthenticated).
    #[error("unauthenticated: {0}")]
    Unauthenticated(Failure),
    /// The target does not exist (gRPC NotFound), e.g. an unknown member id.
    #[error("not found: {0}")]
    NotFound(Failure),
    /// The node is not in a state that allows the call (gRPC FailedPrecondition).
    #[error("failed precondition: {0}")]
    FailedPrecondition(Failure),
    /// The request was rejected as invalid (gRPC InvalidArgument).
    #[error("invalid argument: {0}")]
    InvalidArgument(Failure),
    /// The node or its service is unreachable (gRPC Unavailable).
    #[error("unavailable: {0}")]
    Unavailable(Failure),
    /// The node does not serve this call (gRPC Unimplemented), e.g. etcd calls
    /// on a worker.
    #[error("unimplemented: {0}")]
    Unimplemented(Failure),
    /// The call ran out of time (gRPC DeadlineExceeded).
    #[error("deadline exceeded: {0}")]
    DeadlineExceeded(Failure),
    /// The target already exists (gRPC AlreadyExists).
    #[error("already exists: {0}")]
    AlreadyExists(Failure),
    /// The call was aborted, e.g. by a conflicting operation (gRPC Aborted).
    #[error("aborted: {0}")]
    Aborted(Failure),
    /// The call was cancelled (gRPC Cancelled).
    #[error("cancelled: {0}")]
    Cancelled(Failure),
    /// The node does not know a COSI resource type (upstream answers
    /// PermissionDenied `resource type "X" is not supported`), or no
    /// type matches a name or alias.
    #[error("unknown resource type {resource_type:?}: {failure}")]
    UnknownResourceType {
        /// The type or alias asked for.
        resource_type: String,
        /// Where and what.
        failure: Failure,
    },
    /// Any other gRPC status.
    #[error("{code:?}: {failure}")]
    Status {
        /// The gRPC code.
        code: Code,
        /// Where and what.
        failure: Failure,
    },
    /// The server answered something this client cannot interpret.
    #[error("unexpected response: {0}")]
    Protocol(Failure),
    /// A local file operation failed.
    #[error("{}: {source}", .path.display())]
    Io {
        /// The file.
        path: PathBuf,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },
}

impl From<ConfigError> for Error {
    fn from(e: ConfigError) -> Self {
        Error::Config(Box::new(e))
    }
}

fn attempts(list: &[ConnectAttempt]) -> String {
    list.iter()
        .map(|a| format!("{}: {}", a.endpoint, a.reason))
        .collect::<Vec<_>>()
        .join("; ")
}

/// Evaluates `$some` with `$f` bound to the [`Failure`] of a status-derived
/// error, or `$none` for the other variants.
macro_rules! with_failure {
    ($error:expr, $f:ident => $some:expr, $none:expr) => {
        match $error {
            Error::PermissionDenied($f)
            | Error::Unauthenticated($f)
            | Error::NotFound($f)
            | Error::FailedPrecondition($f)
            | Error::InvalidArgument($f)
            | Error::Unavailable($f)
            | Error::Unimplemented($f)
            | Error::DeadlineExceeded($f)
            | Error::AlreadyExists($f)
            | Error::Aborted($f)
            | Error::Cancelled($f)
            | Error::Protocol($f)
            | Error::Status { failure: $f, .. }
            | Error::UnknownResourceType { failure: $f, .. } => $some,
            _ => $none,
        }
    };
}

impl Error {
    /// Maps a gRPC status to the matching variant.
    ///
    /// A status caused by a TLS failure below gRPC (for instance the server
    /// rejecting the client certificate after a TLS 1.3 handshake) is
    /// explained in TLS terms and reported as `Unauthenticated`.
    pub fn from_status(status: &tonic::Status, node: Option<&str>) -> Error {
        use std::error::Error as _;
        if let Some(source) = status.source()
            && let Some(reason) = crate::tls::describe_tls_cause(source)
        {
            return Error::from_code(Code::Unauthenticated, reason, node);
        }
        Error::from_code(status.code(), status.message().to_string(), node)
    }

    /// Maps a gRPC code and message to the matching variant.
    pub fn from_code(code: Code, message: String, node: Option<&str>) -> Error {
        let failure = Failure {
            node: node.filter(|n| !n.is_empty()).map(str::to_string),
            message,
        };
        match code {
            Code::PermissionDenied => Error::PermissionDenied(failure),
            Code::Unauthenticated => Error::Unauthenticated(failure),
            Code::NotFound => Error::NotFound(failure),
            Code::FailedPrecondition => Error::FailedPrecondition(failure),
            Code::InvalidArgument => Error::InvalidArgument(failure),
            Code::Unavailable => Error::Unavailable(failure),
            Code::Unimplemented => Error::Unimplemented(failure),
            Code::DeadlineExceeded => Error::DeadlineExceeded(failure),
            Code::AlreadyExists => Error::AlreadyExists(failure),
            Code::Aborted => Error::Aborted(failure),
            Code::Cancelled => Error::Cancelled(failure),
            code => Error::Status { code, failure },
        }
    }

    /// The gRPC code this error corresponds to, if it came from a status.
    pub fn code(&self) -> Option<Code> {
        Some(match self {
            Error::PermissionDenied(_) => Code::PermissionDenied,
            Error::Unauthenticated(_) => Code::Unauthenticated,
            Error::NotFound(_) => Code::NotFound,
            Error::FailedPrecondition(_) => Code::FailedPrecondition,
            Error::InvalidArgument(_) => Code::InvalidArgument,
            Error::Unavailable(_) | Error::Connect(_) => Code::Unavailable,
            Error::Unimplemented(_) => Code::Unimplemented,
            Error::DeadlineExceeded(_) => Code::DeadlineExceeded,
            Error::AlreadyExists(_) => Code::AlreadyExists,
            Error::Aborted(_) => Code::Aborted,
            Error::Cancelled(_) => Code::Cancelled,
            Error::Status { code, .. } => *code,
            Error::UnknownResourceType { .. } => Code::NotFound,
            _ => return None,
        })
    }

    /// The server's failure details, for status-derived errors.
    pub fn failure(&self) -> Option<&Failure> {
        with_failure!(self, f => Some(f), None)
    }

    /// The node an error is attributed to, if known.
    pub fn node(&self) -> Option<&str> {
        self.failure().and_then(|f| f.node.as_deref())
    }

    /// Attributes the error to `node` when it has no node yet.
    pub(crate) fn with_node(mut self, node: &str) -> Error {
        with_failure!(&mut self, f => {
            if f.node.is_none() {
                f.node = Some(node.to_string());
            }
        }, ());
        self
    }

    pub(crate) fn protocol(node: Option<&str>, message: impl Into<String>) -> Error {
        Error::Protocol(Failure {
            node: node.map(str::to_string),
            message: message.into(),
        })
    }
}
