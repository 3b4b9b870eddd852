//! A real S3 server on loopback for the backup tests: s3s-fs (the s3s
//! project's file-system backend) in this process, with SigV4
//! authentication, on a free port; stopped when dropped.

#![allow(dead_code)]

use std::path::{Path, PathBuf};

use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto::Builder as ConnBuilder;
use s3s::auth::SimpleAuth;
use s3s::host::SingleDomain;
use s3s::service::S3ServiceBuilder;
use talos_client::backup::{Addressing, S3Settings, S3Store, SecretString};
use tokio::net::TcpListener;
use tokio::sync::oneshot;

pub const ACCESS_KEY: &str = "test-access-key";
pub const SECRET_KEY: &str = "test-secret-key-0123456789";
pub const BUCKET: &str = "backups";

/// A running server holding one bucket, [`BUCKET`].
pub struct S3Server {
    /// `http://127.0.0.1:PORT`.
    pub endpoint: String,
    pub port: u16,
    root: tempfile::TempDir,
    stop: Option<oneshot::Sender<()>>,
}

impl S3Server {
    /// Starts a server that takes path-style requests, or (with
    /// `virtual_hosts`) virtual-hosted ones for `BUCKET.localhost:PORT`.
    pub async fn start(virtual_hosts: bool) -> S3Server {
        let root = tempfile::tempdir().unwrap();
        std::fs::create_dir(root.path().join(BUCKET)).unwrap();
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let fs = s3s_fs::FileSystem::new(root.path()).unwrap();
        let mut builder = S3ServiceBuilder::new(fs);
        builder.set_auth(SimpleAuth::from_single(ACCESS_KEY, SECRET_KEY));
        if virtual_hosts {
            builder.set_host(SingleDomain::new(&format!("localhost:{port}")).unwrap());
        }
        let service = builder.build();
        let (stop, mut stopped) = oneshot::channel::<()>();
        tokio::spawn(async move {
            let http = ConnBuilder::new(TokioExecutor::new());
            loop {
                let socket = tokio::select! {
                    accepted = listener.accept() => match accepted {
                        Ok((socket, _)) => socket,
                        Err(_) => continue,
                    },
                    _ = &mut stopped => break,
                };
                let conn = http
                    .serve_connection(TokioIo::new(socket), service.clone())
                    .into_owned();
                tokio::spawn(async move {
                    let _ = conn.await;
                });
            }
        });
        S3Server {
            endpoint: format!("http://127.0.0.1:{port}"),
            port,
            root,
            stop: Some(stop),
        }
    }

    /// Settings for `s3://BUCKET/PREFIX` on this server.
    pub fn settings(&self, prefix: &str, addressing: Addressing) -> S3Settings {
        let mut settings =
            S3Settings::parse(&format!("s3://{BUCKET}/{prefix}"), addressing).unwrap();
        settings.region = Some("us-east-1".into());
        settings.access_key_id = Some(ACCESS_KEY.into());
        settings.secret_access_key = Some(SecretString::new(SECRET_KEY));
        match addressing {
            Addressing::Path => settings.endpoint = Some(self.endpoint.clone()),
            Addressing::Virtual => {
                // BUCKET.localhost does not resolve here: the requests go
                // to the server as their proxy, Host header and signature
                // unchanged.
                settings.endpoint = Some(format!("http://localhost:{}", self.port));
                settings.proxy = Some(self.endpoint.clone());
            }
        }
        settings
    }

    /// A store for `s3://BUCKET/PREFIX`.
    pub fn store(&self, prefix: &str) -> S3Store {
        S3Store::new(self.settings(prefix, Addressing::Path)).unwrap()
    }

    /// The file that holds object `key` (full key, prefix included).
    pub fn object_file(&self, key: &str) -> PathBuf {
        self.root.path().join(BUCKET).join(key)
    }

    /// The server's root directory.
    pub fn root(&self) -> &Path {
        self.root.path()
    }

    /// Every file under the root (objects, metadata, upload parts), as
    /// relative paths.
    pub fn files(&self) -> Vec<String> {
        let mut found = Vec::new();
        let mut dirs = vec![self.root.path().to_owned()];
        while let Some(dir) = dirs.pop() {
            for entry in std::fs::read_dir(&dir).unwrap() {
                let path = entry.unwrap().path();
                if path.is_dir() {
                    dirs.push(path);
                } else {
                    let rel = path.strip_prefix(self.root.path()).unwrap();
                    found.push(rel.display().to_string());
                }
            }
        }
        found.sort();
        found
    }
}

impl Drop for S3Server {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
    }
}
