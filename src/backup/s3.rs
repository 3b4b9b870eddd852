//! S3-compatible object storage through the `object_store` crate (which
//! signs requests with SigV4 and does the multipart protocol).
//!
//! Settings follow the AWS conventions: [`S3Settings::from_env`] reads
//! `AWS_ACCESS_KEY_ID`, `AWS_SECRET_ACCESS_KEY`, `AWS_SESSION_TOKEN`,
//! `AWS_REGION` (or `AWS_DEFAULT_REGION`) and `AWS_ENDPOINT_URL` for the
//! settings not given explicitly. The addressing style is never guessed:
//! path-style (`ENDPOINT/BUCKET/KEY`, what self-hosted servers such as
//! MinIO, SeaweedFS or Garage need) or virtual-hosted
//! (`BUCKET.ENDPOINT/KEY`, AWS's default) is the caller's choice.

use std::fmt;
use std::str::FromStr;
use std::sync::Arc;

use bytes::Bytes;
use futures::{StreamExt, TryStreamExt};
use object_store::aws::AmazonS3Builder;
use object_store::path::Path as ObjectPath;
use object_store::{ObjectStore, WriteMultipart};

use super::store::{ObjectInfo, ObjectStream, Store, StoreError, StoreFuture, Upload, check_key};

/// Size of each multipart part: S3's minimum, 5 MiB (so up to 48 GiB in
/// its 10,000 parts); with at most [`PARTS_IN_FLIGHT`] parts sending and
/// one filling, 15 MiB of buffers.
pub const PART_SIZE: usize = 5 << 20;
/// Parts sent at once.
pub const PARTS_IN_FLIGHT: usize = 2;

/// How requests name the bucket.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Addressing {
    /// `ENDPOINT/BUCKET/KEY`: self-hosted servers (MinIO, SeaweedFS,
    /// Garage, Ceph RGW without wildcard DNS).
    Path,
    /// `BUCKET.ENDPOINT/KEY`: AWS, and servers with wildcard DNS.
    Virtual,
}

impl FromStr for Addressing {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "path" => Ok(Addressing::Path),
            "virtual" => Ok(Addressing::Virtual),
            other => Err(format!(
                "unknown S3 addressing {other:?}: expected \"path\" or \"virtual\""
            )),
        }
    }
}

/// A secret string whose `Debug` shows nothing.
#[derive(Clone, PartialEq, Eq)]
pub struct SecretString(String);

impl SecretString {
    /// Wraps `secret`.
    pub fn new(secret: impl Into<String>) -> SecretString {
        SecretString(secret.into())
    }

    /// The secret itself.
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for SecretString {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("SecretString(..)")
    }
}

/// Where and how to reach an S3-compatible store.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct S3Settings {
    /// The bucket.
    pub bucket: String,
    /// The key prefix inside the bucket, without leading or trailing `/`
    /// (may be empty).
    pub prefix: String,
    /// The region (`AWS_REGION`); `us-east-1` when unset.
    pub region: Option<String>,
    /// The endpoint URL (`AWS_ENDPOINT_URL`), e.g. `http://127.0.0.1:9000`;
    /// AWS's own endpoints when unset.
    pub endpoint: Option<String>,
    /// The access key id (`AWS_ACCESS_KEY_ID`).
    pub access_key_id: Option<String>,
    /// The secret access key (`AWS_SECRET_ACCESS_KEY`).
    pub secret_access_key: Option<SecretString>,
    /// A session token (`AWS_SESSION_TOKEN`).
    pub session_token: Option<SecretString>,
    /// Path-style or virtual-hosted requests.
    pub addressing: Addressing,
    /// Send requests through this HTTP proxy.
    pub proxy: Option<String>,
}

impl S3Settings {
    /// Settings for `s3://BUCKET/PREFIX` with the given addressing; nothing
    /// else set (see [`S3Settings::from_env`]).
    pub fn parse(url: &str, addressing: Addressing) -> Result<S3Settings, StoreError> {
        let bad = |problem: &str| StoreError::Settings {
            store: url.to_owned(),
            problem: problem.to_owned(),
        };
        let rest = url
            .strip_prefix("s3://")
            .ok_or_else(|| bad("not an s3://BUCKET/PREFIX URL"))?;
        let (bucket, prefix) = rest.split_once('/').unwrap_or((rest, ""));
        let valid_bucket = (3..=63).contains(&bucket.len())
            && bucket
                .bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'.')
            && !bucket.starts_with(['-', '.'])
            && !bucket.ends_with(['-', '.']);
        if !valid_bucket {
            return Err(bad(
                "the bucket name must be 3 to 63 lower-case letters, digits, '-' or '.'",
            ));
        }
        let prefix = prefix.trim_matches('/');
        if prefix
            .split('/')
            .any(|s| s == "." || s == ".." || (s.is_empty() && !prefix.is_empty()))
        {
            return Err(bad("the prefix has an empty, '.' or '..' segment"));
        }
        Ok(S3Settings {
            bucket: bucket.to_owned(),
            prefix: prefix.to_owned(),
            region: None,
            endpoint: None,
            access_key_id: None,
            secret_access_key: None,
            session_token: None,
            addressing,
            proxy: None,
        })
    }

    /// Fills the settings left unset from the AWS environment variables.
    pub fn from_env(self) -> S3Settings {
        self.from_vars(|name| std::env::var(name).ok().filter(|v| !v.is_empty()))
    }

    /// Like [`S3Settings::from_env`], reading variables through `var`.
    pub fn from_vars(mut self, var: impl Fn(&str) -> Option<String>) -> S3Settings {
        self.region = self
            .region
            .or_else(|| var("AWS_REGION"))
            .or_else(|| var("AWS_DEFAULT_REGION"));
        self.endpoint = self.endpoint.or_else(|| var("AWS_ENDPOINT_URL"));
        self.access_key_id = self.access_key_id.or_else(|| var("AWS_ACCESS_KEY_ID"));
        self.secret_access_key = self
            .secret_access_key
            .or_else(|| var("AWS_SECRET_ACCESS_KEY").map(SecretString));
        self.session_token = self
            .session_token
            .or_else(|| var("AWS_SESSION_TOKEN").map(SecretString));
        self
    }

    /// Refuses an endpoint that is not an `http://` or `https://` URL with
    /// a host, and a region that is empty or not of letters, digits and
    /// `-`, naming the value.
    pub fn check(&self) -> Result<(), StoreError> {
        let bad = |problem: String| StoreError::Settings {
            store: self.url(),
            problem,
        };
        if let Some(endpoint) = &self.endpoint {
            let rest = endpoint
                .strip_prefix("https://")
                .or_else(|| endpoint.strip_prefix("http://"));
            match rest {
                Some(rest) if !rest.is_empty() && !rest.starts_with('/') => {}
                _ => {
                    return Err(bad(format!(
                        "endpoint {endpoint:?} is not an http:// or https:// URL with a host"
                    )));
                }
            }
        }
        if let Some(region) = &self.region
            && (region.is_empty()
                || !region
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || c == '-'))
        {
            return Err(bad(format!(
                "region {region:?} is not a region name (letters, digits and -)"
            )));
        }
        Ok(())
    }

    /// `s3://BUCKET/PREFIX`.
    pub fn url(&self) -> String {
        if self.prefix.is_empty() {
            format!("s3://{}", self.bucket)
        } else {
            format!("s3://{}/{}", self.bucket, self.prefix)
        }
    }

    /// The region, `us-east-1` when unset.
    pub fn region(&self) -> &str {
        self.region.as_deref().unwrap_or("us-east-1")
    }

    /// The endpoint, or AWS's for the region.
    fn base_endpoint(&self) -> String {
        self.endpoint
            .clone()
            .unwrap_or_else(|| format!("https://s3.{}.amazonaws.com", self.region()))
            .trim_end_matches('/')
            .to_owned()
    }

    /// The base URL requests go to: the endpoint followed by the bucket
    /// (path-style), or the endpoint's host prefixed with the bucket
    /// (virtual-hosted).
    pub fn bucket_endpoint(&self) -> Result<String, StoreError> {
        let endpoint = self.base_endpoint();
        let endpoint = endpoint.trim_end_matches('/');
        match self.addressing {
            Addressing::Path => Ok(format!("{endpoint}/{}", self.bucket)),
            Addressing::Virtual => {
                let (scheme, host) =
                    endpoint
                        .split_once("://")
                        .ok_or_else(|| StoreError::Settings {
                            store: self.url(),
                            problem: format!(
                                "endpoint {endpoint:?} has no scheme (http:// or https://)"
                            ),
                        })?;
                Ok(format!("{scheme}://{}.{host}", self.bucket))
            }
        }
    }
}

/// Backups in an S3-compatible bucket, under a prefix.
#[derive(Clone)]
pub struct S3Store {
    settings: S3Settings,
    inner: Arc<dyn ObjectStore>,
}

impl fmt::Debug for S3Store {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("S3Store")
            .field("settings", &self.settings)
            .finish_non_exhaustive()
    }
}

impl S3Store {
    /// Connects nothing yet; checks and records the settings. Credentials
    /// are required (instance-metadata lookups are never attempted).
    pub fn new(settings: S3Settings) -> Result<S3Store, StoreError> {
        let bad = |problem: String| StoreError::Settings {
            store: settings.url(),
            problem,
        };
        settings.check()?;
        let (Some(key_id), Some(secret)) = (&settings.access_key_id, &settings.secret_access_key)
        else {
            return Err(bad(
                "no credentials: set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY (or pass them)"
                    .into(),
            ));
        };
        // object_store appends the bucket to a path-style endpoint, and
        // takes a virtual-hosted one as the bucket's own.
        let endpoint = match settings.addressing {
            Addressing::Path => settings.base_endpoint(),
            Addressing::Virtual => settings.bucket_endpoint()?,
        };
        let mut builder = AmazonS3Builder::new()
            .with_bucket_name(&settings.bucket)
            .with_region(settings.region())
            .with_access_key_id(key_id)
            .with_secret_access_key(secret.expose())
            .with_allow_http(endpoint.starts_with("http://"))
            .with_endpoint(endpoint)
            .with_virtual_hosted_style_request(settings.addressing == Addressing::Virtual);
        if let Some(token) = &settings.session_token {
            builder = builder.with_token(token.expose());
        }
        if let Some(proxy) = &settings.proxy {
            builder = builder.with_proxy_url(proxy);
        }
        let inner = builder.build().map_err(|e| bad(e.to_string()))?;
        Ok(S3Store {
            settings,
            inner: Arc::new(inner),
        })
    }

    /// The settings.
    pub fn settings(&self) -> &S3Settings {
        &self.settings
    }

    fn location(&self, key: &str) -> Result<ObjectPath, StoreError> {
        check_key(self, key)?;
        let full = if self.settings.prefix.is_empty() {
            key.to_owned()
        } else {
            format!("{}/{key}", self.settings.prefix)
        };
        ObjectPath::parse(&full).map_err(|_| StoreError::InvalidKey {
            store: self.describe(),
            key: key.to_owned(),
        })
    }

    fn remote(&self, key: &str, source: object_store::Error) -> StoreError {
        match source {
            object_store::Error::NotFound { .. } => StoreError::NotFound {
                store: self.describe(),
                key: key.to_owned(),
            },
            source => StoreError::Remote {
                store: self.describe(),
                key: key.to_owned(),
                source: Box::new(source),
            },
        }
    }
}

impl Store for S3Store {
    fn describe(&self) -> String {
        self.settings.url()
    }

    fn start_upload<'a>(&'a self, key: &'a str) -> StoreFuture<'a, Box<dyn Upload>> {
        Box::pin(async move {
            let location = self.location(key)?;
            let upload = self
                .inner
                .put_multipart(&location)
                .await
                .map_err(|e| self.remote(key, e))?;
            Ok(Box::new(S3Upload {
                writer: WriteMultipart::new_with_chunk_size(upload, PART_SIZE),
                store: self.describe(),
                key: key.to_owned(),
            }) as Box<dyn Upload>)
        })
    }

    fn put<'a>(&'a self, key: &'a str, bytes: Bytes) -> StoreFuture<'a, ()> {
        Box::pin(async move {
            let location = self.location(key)?;
            self.inner
                .put(&location, bytes.into())
                .await
                .map_err(|e| self.remote(key, e))?;
            Ok(())
        })
    }

    fn get<'a>(&'a self, key: &'a str) -> StoreFuture<'a, ObjectStream> {
        Box::pin(async move {
            let location = self.location(key)?;
            let result = self
                .inner
                .get(&location)
                .await
                .map_err(|e| self.remote(key, e))?;
            let this = self.clone();
            let key = key.to_owned();
            Ok(result
                .into_stream()
                .map_err(move |e| this.remote(&key, e))
                .boxed())
        })
    }

    fn list<'a>(&'a self, prefix: &'a str) -> StoreFuture<'a, Vec<ObjectInfo>> {
        Box::pin(async move {
            let root = (!self.settings.prefix.is_empty())
                .then(|| ObjectPath::from(self.settings.prefix.as_str()));
            let mut objects: Vec<ObjectInfo> = self
                .inner
                .list(root.as_ref())
                .map_err(|e| self.remote(prefix, e))
                .try_filter_map(|meta| async move {
                    let full = meta.location.to_string();
                    let key = if self.settings.prefix.is_empty() {
                        Some(full.as_str())
                    } else {
                        full.strip_prefix(&self.settings.prefix)
                            .and_then(|k| k.strip_prefix('/'))
                    };
                    Ok(key.filter(|k| k.starts_with(prefix)).map(|k| ObjectInfo {
                        key: k.to_owned(),
                        size: meta.size,
                    }))
                })
                .try_collect()
                .await?;
            objects.sort_by(|a, b| a.key.cmp(&b.key));
            Ok(objects)
        })
    }

    fn delete<'a>(&'a self, key: &'a str) -> StoreFuture<'a, ()> {
        Box::pin(async move {
            let location = self.location(key)?;
            self.inner
                .delete(&location)
                .await
                .map_err(|e| self.remote(key, e))
        })
    }
}

struct S3Upload {
    writer: WriteMultipart,
    store: String,
    key: String,
}

impl S3Upload {
    fn error(store: String, key: String, source: object_store::Error) -> StoreError {
        StoreError::Remote {
            store,
            key,
            source: Box::new(source),
        }
    }
}

impl Upload for S3Upload {
    fn write(&mut self, bytes: Bytes) -> StoreFuture<'_, ()> {
        Box::pin(async move {
            self.writer
                .wait_for_capacity(PARTS_IN_FLIGHT)
                .await
                .map_err(|e| S3Upload::error(self.store.clone(), self.key.clone(), e))?;
            self.writer.put(bytes);
            Ok(())
        })
    }

    fn complete(self: Box<Self>) -> StoreFuture<'static, ()> {
        Box::pin(async move {
            let S3Upload { writer, store, key } = *self;
            writer
                .finish()
                .await
                .map(|_| ())
                .map_err(|e| S3Upload::error(store, key, e))
        })
    }

    fn abort(self: Box<Self>) -> StoreFuture<'static, ()> {
        Box::pin(async move {
            let S3Upload { writer, store, key } = *self;
            writer
                .abort()
                .await
                .map_err(|e| S3Upload::error(store, key, e))
        })
    }
}

#[cfg(test)]
mod tests {

    #[test]
    fn endpoints_and_regions_are_checked() {
        let mut s = S3Settings::parse("s3://bkt/p", Addressing::Path).unwrap();
        for good in [
            "http://127.0.0.1:9000",
            "https://s3.example",
            "https://s3.example:9000/",
        ] {
            s.endpoint = Some(good.into());
            s.check().unwrap();
        }
        for bad in ["127.0.0.1:9000", "ftp://x", "http://", "https:///x", ""] {
            s.endpoint = Some(bad.into());
            let e = s.check().unwrap_err().to_string();
            assert!(e.contains(&format!("{bad:?}")), "{e}");
        }
        s.endpoint = None;
        s.region = Some("eu-central-1".into());
        s.check().unwrap();
        for bad in ["", "eu central", "eu/1"] {
            s.region = Some(bad.into());
            assert!(s.check().is_err(), "{bad:?}");
        }
    }

    use super::*;

    #[test]
    fn urls_parse_into_bucket_and_prefix() {
        let s = S3Settings::parse("s3://backups/prod/cluster-a/", Addressing::Path).unwrap();
        assert_eq!(
            (s.bucket.as_str(), s.prefix.as_str()),
            ("backups", "prod/cluster-a")
        );
        assert_eq!(s.url(), "s3://backups/prod/cluster-a");
        let s = S3Settings::parse("s3://backups", Addressing::Path).unwrap();
        assert_eq!(s.prefix, "");
        for bad in [
            "/tmp/x",
            "s3://",
            "s3://UPPER/x",
            "s3://ab",
            "s3://b-b/a//c",
            "s3://bbb/../x",
        ] {
            let error = S3Settings::parse(bad, Addressing::Path).unwrap_err();
            assert!(error.to_string().starts_with(bad), "{bad}: {error}");
        }
    }

    #[test]
    fn explicit_settings_win_over_the_environment() {
        let env = |name: &str| match name {
            "AWS_REGION" => Some("eu-west-3".to_owned()),
            "AWS_ENDPOINT_URL" => Some("http://127.0.0.1:9000".to_owned()),
            "AWS_ACCESS_KEY_ID" => Some("env-id".to_owned()),
            "AWS_SECRET_ACCESS_KEY" => Some("env-secret".to_owned()),
            _ => None,
        };
        let mut s = S3Settings::parse("s3://bkt/p", Addressing::Path).unwrap();
        s.access_key_id = Some("flag-id".into());
        let s = s.from_vars(env);
        assert_eq!(s.access_key_id.as_deref(), Some("flag-id"));
        assert_eq!(s.secret_access_key.as_ref().unwrap().expose(), "env-secret");
        assert_eq!(s.region.as_deref(), Some("eu-west-3"));
        assert!(!format!("{s:?}").contains("env-secret"));
        assert_eq!(s.bucket_endpoint().unwrap(), "http://127.0.0.1:9000/bkt");
        let v = S3Settings {
            addressing: Addressing::Virtual,
            ..s
        };
        assert_eq!(v.bucket_endpoint().unwrap(), "http://bkt.127.0.0.1:9000");
        let aws = S3Settings {
            endpoint: None,
            ..v
        };
        assert_eq!(
            aws.bucket_endpoint().unwrap(),
            "https://bkt.s3.eu-west-3.amazonaws.com"
        );
    }

    #[test]
    fn a_store_without_credentials_is_refused_by_name() {
        let s = S3Settings::parse("s3://bkt/p", Addressing::Path).unwrap();
        let error = S3Store::new(s).unwrap_err();
        assert!(error.to_string().contains("AWS_ACCESS_KEY_ID"), "{error}");
        assert!("sideways".parse::<Addressing>().is_err());
    }
}
