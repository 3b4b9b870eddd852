//! Finding, reading, writing, merging and resolving talosconfig files, with
//! upstream's rules (`pkg/machinery/client/config/{config,path}.go`,
//! `pkg/machinery/client/connection.go`).

use std::fmt;
use std::fs;
use std::io;
use std::path::{Path, PathBuf};

use base64::Engine as _;

use super::file::{Context, TalosConfig};
use crate::tls::{self, Credentials, Material, TlsError};

/// The apid port used when an endpoint names none.
pub const DEFAULT_API_PORT: u16 = 50000;

/// Where the in-pod service-account talosconfig is mounted (read-only).
pub const SERVICE_ACCOUNT_CONFIG: &str = "/var/run/secrets/talos.dev/config";

/// Errors reading, resolving or writing a talosconfig. Each names the file
/// and, where one is at fault, the key.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ConfigError {
    /// The file could not be read.
    #[error("talosconfig {}: {source}", .path.display())]
    Read {
        /// The file.
        path: PathBuf,
        /// The I/O error.
        #[source]
        source: io::Error,
    },
    /// The file is not valid talosconfig YAML.
    #[error("talosconfig {}: not a valid talosconfig: {source}", .path.display())]
    Parse {
        /// The file.
        path: PathBuf,
        /// The YAML error, with line and column.
        #[source]
        source: serde_norway::Error,
    },
    /// No talosconfig exists at any default location.
    #[error("no talosconfig found (looked at {}); pass --talosconfig or set TALOSCONFIG", display_paths(.tried))]
    NotFound {
        /// The locations tried, in order.
        tried: Vec<PathBuf>,
    },
    /// No context was named and the file has no current context.
    #[error("talosconfig {}: no current context is set; pass --context or run `config context NAME`", .path.display())]
    NoCurrentContext {
        /// The file.
        path: PathBuf,
    },
    /// The named context does not exist.
    #[error("talosconfig {}: context {name:?} not found (available: {})", .path.display(), list_or_none(.available))]
    UnknownContext {
        /// The file.
        path: PathBuf,
        /// The context asked for.
        name: String,
        /// The contexts the file has.
        available: Vec<String>,
    },
    /// A key holds a value that cannot be used.
    #[error("talosconfig {}: contexts.{context}.{key}: {reason}", .path.display())]
    BadValue {
        /// The file.
        path: PathBuf,
        /// The context.
        context: String,
        /// The key at fault (`ca`, `crt`, `key`, `endpoints`).
        key: &'static str,
        /// What is wrong with it.
        reason: String,
    },
    /// A key's PEM content is not usable TLS material.
    #[error("talosconfig {}: contexts.{context}.{key}: {source}", .path.display())]
    Tls {
        /// The file.
        path: PathBuf,
        /// The context.
        context: String,
        /// The key at fault (`ca`, `crt` or `key`).
        key: &'static str,
        /// The TLS problem.
        #[source]
        source: Box<TlsError>,
    },
    /// The context has no endpoints and none were given.
    #[error("talosconfig {}: contexts.{context}.endpoints is empty; pass --endpoints", .path.display())]
    NoEndpoints {
        /// The file.
        path: PathBuf,
        /// The context.
        context: String,
    },
    /// An endpoint could not be parsed.
    #[error("endpoint {endpoint:?}: {reason}")]
    BadEndpoint {
        /// The endpoint as written.
        endpoint: String,
        /// What is wrong with it.
        reason: String,
    },
    /// The file could not be written.
    #[error("talosconfig {}: cannot write: {source}", .path.display())]
    Write {
        /// The file.
        path: PathBuf,
        /// The I/O error.
        #[source]
        source: io::Error,
    },
    /// The file is the read-only in-pod service-account config.
    #[error("talosconfig {}: read-only location, refusing to write", .path.display())]
    ReadOnly {
        /// The file.
        path: PathBuf,
    },
}

fn display_paths(paths: &[PathBuf]) -> String {
    paths
        .iter()
        .map(|p| p.display().to_string())
        .collect::<Vec<_>>()
        .join(", ")
}

fn list_or_none(items: &[String]) -> String {
    if items.is_empty() {
        "none".to_string()
    } else {
        items.join(", ")
    }
}

/// A talosconfig location and whether it may be written.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct ConfigPath {
    /// The file.
    pub path: PathBuf,
    /// False for the in-pod service-account mount.
    pub write_allowed: bool,
}

impl ConfigPath {
    /// A talosconfig at `path` that may be written.
    pub fn new(path: impl Into<PathBuf>) -> ConfigPath {
        ConfigPath {
            path: path.into(),
            write_allowed: true,
        }
    }
}

/// The default locations, in priority order: `$TALOSCONFIG`,
/// `$TALOS_HOME/config` (when absolute) or `~/.talos/config`, then the
/// in-pod `/var/run/secrets/talos.dev/config`.
pub fn default_paths() -> Vec<ConfigPath> {
    default_paths_with(|name| std::env::var_os(name))
}

/// [`default_paths`] with the environment supplied by `env`.
pub fn default_paths_with(env: impl Fn(&str) -> Option<std::ffi::OsString>) -> Vec<ConfigPath> {
    let mut paths = Vec::new();
    if let Some(p) = env("TALOSCONFIG") {
        paths.push(ConfigPath {
            path: PathBuf::from(p),
            write_allowed: true,
        });
    }
    let talos_home = env("TALOS_HOME")
        .map(PathBuf::from)
        .filter(|p| p.is_absolute())
        .or_else(|| env("HOME").map(|h| PathBuf::from(h).join(".talos")));
    if let Some(dir) = talos_home {
        paths.push(ConfigPath {
            path: dir.join("config"),
            write_allowed: true,
        });
    }
    paths.push(ConfigPath {
        path: PathBuf::from(SERVICE_ACCOUNT_CONFIG),
        write_allowed: false,
    });
    paths
}

impl TalosConfig {
    /// Parses talosconfig YAML; `path` is only used in error messages.
    pub fn from_yaml(yaml: &[u8], path: &Path) -> Result<TalosConfig, ConfigError> {
        let mut config: TalosConfig = if yaml.iter().all(u8::is_ascii_whitespace) {
            TalosConfig::default()
        } else {
            serde_norway::from_slice(yaml).map_err(|source| ConfigError::Parse {
                path: path.to_path_buf(),
                source,
            })?
        };
        config.contexts.values_mut().for_each(Context::upgrade);
        Ok(config)
    }

    /// Reads a talosconfig file.
    pub fn read(path: &Path) -> Result<TalosConfig, ConfigError> {
        let yaml = fs::read(path).map_err(|source| ConfigError::Read {
            path: path.to_path_buf(),
            source,
        })?;
        TalosConfig::from_yaml(&yaml, path)
    }

    /// Finds and reads the talosconfig: `explicit` when given, else the first
    /// existing [`default_paths`] entry. Returns the file's location too.
    pub fn load(explicit: Option<&Path>) -> Result<(TalosConfig, ConfigPath), ConfigError> {
        let location = match explicit {
            Some(path) => ConfigPath {
                path: path.to_path_buf(),
                write_allowed: true,
            },
            None => {
                let candidates = default_paths();
                match candidates.iter().find(|c| c.path.exists()) {
                    Some(found) => found.clone(),
                    None => {
                        return Err(ConfigError::NotFound {
                            tried: candidates.into_iter().map(|c| c.path).collect(),
                        });
                    }
                }
            }
        };
        let config = TalosConfig::read(&location.path)?;
        Ok((config, location))
    }

    /// Serializes to YAML.
    pub fn to_yaml(&self) -> String {
        serde_norway::to_string(self).expect("a talosconfig always serializes")
    }

    /// Writes the file atomically with mode 0600: a temporary file in the same
    /// directory is written and synced, then renamed over `location`, and the
    /// directory is synced. A crash leaves either the old or the new file.
    pub fn save(&self, location: &ConfigPath) -> Result<(), ConfigError> {
        if !location.write_allowed {
            return Err(ConfigError::ReadOnly {
                path: location.path.clone(),
            });
        }
        crate::atomic::write_atomic(&location.path, self.to_yaml().as_bytes()).map_err(|source| {
            ConfigError::Write {
                path: location.path.clone(),
                source,
            }
        })
    }

    /// Merges the contexts of `other` into this file. A context whose name is
    /// taken is renamed `name-1`, `name-2`, ...; the merged file's current
    /// context becomes `other`'s (renamed if needed), as talosctl does.
    pub fn merge(&mut self, other: TalosConfig) -> Vec<Rename> {
        let mut renames = Vec::new();
        let mut current = None;
        for (name, context) in other.contexts {
            let mut merged = name.clone();
            let mut i = 1;
            while self.contexts.contains_key(&merged) {
                merged = format!("{name}-{i}");
                i += 1;
            }
            if merged != name {
                renames.push(Rename {
                    from: name.clone(),
                    to: merged.clone(),
                });
            }
            if name == other.context {
                current = Some(merged.clone());
            }
            self.contexts.insert(merged, context);
        }
        if !other.context.is_empty() {
            self.context = current.unwrap_or_default();
        }
        renames
    }

    /// Resolves a context with `overrides` into endpoints, nodes and
    /// credentials. `path` names the file in errors.
    pub fn resolve(
        &self,
        overrides: &Overrides,
        path: &Path,
    ) -> Result<ResolvedContext, ConfigError> {
        let name = overrides
            .context
            .clone()
            .unwrap_or_else(|| self.context.clone());
        if name.is_empty() {
            return Err(ConfigError::NoCurrentContext {
                path: path.to_path_buf(),
            });
        }
        let context = self
            .contexts
            .get(&name)
            .ok_or_else(|| ConfigError::UnknownContext {
                path: path.to_path_buf(),
                name: name.clone(),
                available: self.contexts.keys().cloned().collect(),
            })?;
        let endpoints = if overrides.endpoints.is_empty() {
            context.endpoints.clone()
        } else {
            overrides.endpoints.clone()
        };
        if endpoints.is_empty() {
            return Err(ConfigError::NoEndpoints {
                path: path.to_path_buf(),
                context: name,
            });
        }
        for endpoint in &endpoints {
            normalize_endpoint(endpoint)?;
        }
        let nodes = if overrides.nodes.is_empty() {
            context.nodes.clone()
        } else {
            overrides.nodes.clone()
        };
        let field = |key: &'static str, value: &str| decode_pem(path, &name, key, value);
        let ca = field("ca", &context.ca)?;
        let crt = field("crt", &context.crt)?;
        let key = field("key", &context.key)?;
        let tls_error = |key: &'static str, source: TlsError| ConfigError::Tls {
            path: path.to_path_buf(),
            context: name.clone(),
            key,
            source: Box::new(source),
        };
        tls::parse_certificates(&ca, Material::Ca).map_err(|e| tls_error("ca", e))?;
        tls::parse_certificates(&crt, Material::Certificate).map_err(|e| tls_error("crt", e))?;
        tls::parse_private_key(&key).map_err(|e| tls_error("key", e))?;
        Ok(ResolvedContext {
            path: path.to_path_buf(),
            name,
            endpoints,
            nodes,
            credentials: Credentials::from_pem(ca, crt, key),
        })
    }
}

fn decode_pem(
    path: &Path,
    context: &str,
    key: &'static str,
    value: &str,
) -> Result<Vec<u8>, ConfigError> {
    let bad = |reason: String| ConfigError::BadValue {
        path: path.to_path_buf(),
        context: context.to_string(),
        key,
        reason,
    };
    if value.trim().is_empty() {
        return Err(bad("missing (base64-encoded PEM expected)".to_string()));
    }
    let compact: String = value.split_whitespace().collect();
    base64::engine::general_purpose::STANDARD
        .decode(compact)
        .map_err(|e| bad(format!("not valid base64: {e}")))
}

/// Command-line style overrides applied on top of a context.
#[derive(Debug, Clone, Default)]
#[non_exhaustive]
pub struct Overrides {
    /// Use this context instead of the current one.
    pub context: Option<String>,
    /// Replace the context's endpoints.
    pub endpoints: Vec<String>,
    /// Replace the context's nodes.
    pub nodes: Vec<String>,
}

impl Overrides {
    /// Uses context `name` instead of the current one (`None`: the current).
    pub fn with_context(mut self, name: Option<String>) -> Self {
        self.context = name;
        self
    }

    /// Replaces the context's endpoints (empty: keep them).
    pub fn with_endpoints(mut self, endpoints: Vec<String>) -> Self {
        self.endpoints = endpoints;
        self
    }

    /// Replaces the context's nodes (empty: keep them).
    pub fn with_nodes(mut self, nodes: Vec<String>) -> Self {
        self.nodes = nodes;
        self
    }
}

/// A context renamed by [`TalosConfig::merge`].
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Rename {
    /// Name in the merged-in file.
    pub from: String,
    /// Name it got.
    pub to: String,
}

impl fmt::Display for Rename {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:?} -> {:?}", self.from, self.to)
    }
}

/// A context ready to connect with.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct ResolvedContext {
    /// File it came from.
    pub path: PathBuf,
    /// Context name.
    pub name: String,
    /// Endpoints, as written (see [`normalize_endpoint`]).
    pub endpoints: Vec<String>,
    /// Target nodes (may be empty: the endpoint node answers).
    pub nodes: Vec<String>,
    /// CA, certificate and key.
    pub credentials: Credentials,
}

/// An endpoint's host and port.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub struct EndpointAddr {
    /// Host name or IP address (no brackets).
    pub host: String,
    /// TCP port.
    pub port: u16,
}

impl fmt::Display for EndpointAddr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.host.contains(':') {
            write!(f, "[{}]:{}", self.host, self.port)
        } else {
            write!(f, "{}:{}", self.host, self.port)
        }
    }
}

/// Turns an endpoint as written in a talosconfig or on the command line into
/// host and port, with upstream's rules: `https://host` means port 443, any
/// other URL or a bare host without a port means 50000, `host:port` and
/// `[v6]:port` keep their port, and a bare IPv6 address gets 50000.
pub fn normalize_endpoint(endpoint: &str) -> Result<EndpointAddr, ConfigError> {
    let bad = |reason: &str| ConfigError::BadEndpoint {
        endpoint: endpoint.to_string(),
        reason: reason.to_string(),
    };
    let trimmed = endpoint.trim();
    if trimmed.is_empty() {
        return Err(bad("empty"));
    }
    let (scheme, rest) = match trimmed.split_once("://") {
        Some((scheme, rest)) => (Some(scheme.to_ascii_lowercase()), rest),
        None => (None, trimmed),
    };
    let authority = rest.split(['/', '?', '#']).next().unwrap_or_default();
    let default_port = if scheme.as_deref() == Some("https") {
        443
    } else {
        DEFAULT_API_PORT
    };
    let parse_port = |p: &str| {
        p.parse::<u16>()
            .map_err(|_| bad("port is not a number from 0 to 65535"))
    };
    let (host, port) = if let Some(v6) = authority.strip_prefix('[') {
        let (host, after) = v6
            .split_once(']')
            .ok_or_else(|| bad("unclosed '[' in IPv6 address"))?;
        match after.strip_prefix(':') {
            Some(p) => (host, parse_port(p)?),
            None if after.is_empty() => (host, default_port),
            None => return Err(bad("unexpected text after IPv6 address")),
        }
    } else if authority.matches(':').count() > 1 {
        (authority, default_port)
    } else if let Some((host, p)) = authority.split_once(':') {
        (host, parse_port(p)?)
    } else {
        (authority, default_port)
    };
    if host.is_empty() {
        return Err(bad("no host"));
    }
    Ok(EndpointAddr {
        host: host.to_string(),
        port,
    })
}
