//! The part of a kubeconfig a client needs: the current context's server,
//! CA and credentials (inline `*-data` fields as Talos writes them, or
//! files).

use std::fmt;
use std::path::Path;

use base64::Engine as _;
use serde_json::Value;

use super::KubeError;

/// How a client authenticates.
#[derive(Clone)]
pub(crate) enum Auth {
    /// A client certificate and its key (PEM).
    Certificate { crt_pem: Vec<u8>, key_pem: Vec<u8> },
    /// A bearer token (a service-account token).
    Bearer(String),
    /// Nothing: anonymous (enough for `/readyz` on most clusters).
    Anonymous,
}

/// Where and how to reach a Kubernetes API server: the current context of
/// a kubeconfig, possibly redirected (another server, a bearer token).
///
/// `Debug` never prints the key or the token.
#[derive(Clone)]
pub struct KubeConfig {
    pub(crate) server: String,
    pub(crate) tls_server_name: Option<String>,
    pub(crate) ca_pem: Vec<u8>,
    pub(crate) auth: Auth,
}

impl fmt::Debug for KubeConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let auth = match &self.auth {
            Auth::Certificate { .. } => "client certificate",
            Auth::Bearer(_) => "bearer token",
            Auth::Anonymous => "anonymous",
        };
        f.debug_struct("KubeConfig")
            .field("server", &self.server)
            .field("tls_server_name", &self.tls_server_name)
            .field("auth", &auth)
            .finish()
    }
}

impl KubeConfig {
    /// The current context of a kubeconfig (YAML). Relative file paths
    /// are read from the current directory.
    pub fn from_yaml(yaml: &[u8]) -> Result<KubeConfig, KubeError> {
        let doc: Value =
            serde_norway::from_slice(yaml).map_err(|e| bad(format!("not a kubeconfig: {e}")))?;
        let current = doc["current-context"]
            .as_str()
            .filter(|s| !s.is_empty())
            .ok_or_else(|| bad("no current-context".into()))?;
        let context = named(&doc, "contexts", current, "context")?;
        let cluster_name = context["cluster"]
            .as_str()
            .ok_or_else(|| bad(format!("context {current:?} names no cluster")))?;
        let user_name = context["user"]
            .as_str()
            .ok_or_else(|| bad(format!("context {current:?} names no user")))?;
        let cluster = named(&doc, "clusters", cluster_name, "cluster")?;
        let user = named(&doc, "users", user_name, "user")?;
        let server = cluster["server"]
            .as_str()
            .ok_or_else(|| bad(format!("cluster {cluster_name:?} has no server")))?
            .trim_end_matches('/')
            .to_string();
        let ca_pem = data(cluster, "certificate-authority")?.ok_or_else(|| {
            bad(format!(
                "cluster {cluster_name:?} has no certificate authority"
            ))
        })?;
        let auth = if let Some(token) = user["token"].as_str() {
            Auth::Bearer(token.to_string())
        } else {
            match (data(user, "client-certificate")?, data(user, "client-key")?) {
                (Some(crt_pem), Some(key_pem)) => Auth::Certificate { crt_pem, key_pem },
                (None, None) => Auth::Anonymous,
                _ => {
                    return Err(bad(format!(
                        "user {user_name:?} has a client certificate without its key, or a key without its certificate"
                    )));
                }
            }
        };
        Ok(KubeConfig {
            server,
            tls_server_name: cluster["tls-server-name"].as_str().map(str::to_string),
            ca_pem,
            auth,
        })
    }

    /// The API server's URL (`https://host:port`).
    pub fn server(&self) -> &str {
        &self.server
    }

    /// The same credentials against another server (`https://host:port`).
    pub fn with_server(mut self, server: impl Into<String>) -> KubeConfig {
        self.server = server.into().trim_end_matches('/').to_string();
        self
    }

    /// The name the server's certificate is checked against, instead of the
    /// server URL's host (kubeconfig's `tls-server-name`).
    pub fn with_tls_server_name(mut self, name: impl Into<String>) -> KubeConfig {
        self.tls_server_name = Some(name.into());
        self
    }

    /// The same server and CA, authenticated by a bearer token instead.
    pub fn with_bearer_token(mut self, token: impl Into<String>) -> KubeConfig {
        self.auth = Auth::Bearer(token.into());
        self
    }

    /// The same server and CA, with no credentials.
    pub fn anonymous(mut self) -> KubeConfig {
        self.auth = Auth::Anonymous;
        self
    }
}

fn bad(reason: String) -> KubeError {
    KubeError::Config { reason }
}

/// The `inner` object of the entry named `name` in the list `list`.
fn named<'a>(doc: &'a Value, list: &str, name: &str, inner: &str) -> Result<&'a Value, KubeError> {
    doc[list]
        .as_array()
        .and_then(|items| items.iter().find(|i| i["name"].as_str() == Some(name)))
        .map(|i| &i[inner])
        .filter(|v| v.is_object())
        .ok_or_else(|| bad(format!("no {inner} named {name:?} in {list}")))
}

/// `FIELD-data` (base64) or `FIELD` (a file).
fn data(object: &Value, field: &str) -> Result<Option<Vec<u8>>, KubeError> {
    if let Some(b64) = object[format!("{field}-data")].as_str() {
        return base64::engine::general_purpose::STANDARD
            .decode(b64.trim())
            .map(Some)
            .map_err(|e| bad(format!("{field}-data is not base64: {e}")));
    }
    match object[field].as_str() {
        Some(path) => std::fs::read(Path::new(path))
            .map(Some)
            .map_err(|e| bad(format!("{field} {path}: {e}"))),
        None => Ok(None),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const CONFIG: &str = r#"
apiVersion: v1
kind: Config
clusters:
  - name: c
    cluster:
      server: https://10.0.0.1:6443/
      certificate-authority-data: Q0E=
contexts:
  - name: admin@c
    context: {cluster: c, user: admin@c}
current-context: admin@c
users:
  - name: admin@c
    user:
      client-certificate-data: Q1JU
      client-key-data: S0VZ
"#;

    #[test]
    fn the_current_context_gives_server_ca_and_certificate() {
        let config = KubeConfig::from_yaml(CONFIG.as_bytes()).unwrap();
        assert_eq!(config.server(), "https://10.0.0.1:6443");
        assert_eq!(config.ca_pem, b"CA");
        match &config.auth {
            Auth::Certificate { crt_pem, key_pem } => {
                assert_eq!(crt_pem, b"CRT");
                assert_eq!(key_pem, b"KEY");
            }
            _ => panic!("not a certificate"),
        }
        let debug = format!("{:?}", config.with_bearer_token("secret-token"));
        assert!(
            !debug.contains("secret-token") && debug.contains("bearer"),
            "{debug}"
        );
    }

    #[test]
    fn a_missing_context_or_half_a_credential_is_named() {
        let other = CONFIG.replace("current-context: admin@c", "current-context: nope");
        let e = KubeConfig::from_yaml(other.as_bytes())
            .unwrap_err()
            .to_string();
        assert!(e.contains("no context named \"nope\""), "{e}");
        let half = CONFIG.replace("      client-key-data: S0VZ\n", "");
        let e = KubeConfig::from_yaml(half.as_bytes())
            .unwrap_err()
            .to_string();
        assert!(e.contains("without its key"), "{e}");
    }
}
