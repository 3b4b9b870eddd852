//! Off-host backups (feature `backup`): verified etcd snapshots streamed to
//! a local directory or S3-compatible object storage, compressed with zstd
//! and encrypted with age, with a JSON sidecar, an optional encrypted
//! recovery kit, retention tiers and restore drills.
//!
//! - [`Store`]: [`LocalStore`] (a directory) and [`S3Store`]
//!   (`s3://BUCKET/PREFIX`, [`S3Settings`]); [`open_store`] picks by name.
//! - [`backup`] / [`backup_chunks`]: the pipeline (see the `pipeline`
//!   module's docs). A snapshot that fails any check of
//!   [`snapshot::save`](crate::snapshot::save) leaves nothing under its key.
//! - [`BackupMetadata`]: the sidecar (`KEY.json`); [`RecoveryKit`]: what a
//!   restore needs beyond etcd, stored age-encrypted (`KEY.kit.age`).
//! - [`catalogue`], [`Retention`]: the backups this library wrote, and
//!   which to keep.
//! - [`drill`]: fetch, decrypt, verify, restore into a throwaway etcd, and
//!   compare with the sidecar ([`DrillReport`]); with a kit, one Secret
//!   encrypted at rest is opened with the kit's key ([`at_rest`]).
//!
//! ```no_run
//! use talos_client::backup::{self, Addressing, BackupRequest, DrillOptions, Recipient};
//!
//! # async fn run(client: talos_client::Client<talos_client::One>) -> Result<(), Box<dyn std::error::Error>> {
//! // s3://BUCKET/PREFIX, or a directory. Credentials, region and endpoint come
//! // from AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, AWS_REGION and
//! // AWS_ENDPOINT_URL unless set in S3Settings; the addressing is explicit.
//! let store = backup::open_store("s3://backups/prod", Addressing::Path)?;
//! let mut request = BackupRequest::new("prod");
//! request.recipients = vec!["age1...".parse::<Recipient>()?];
//! let stored = backup::backup(&*store, client.etcd_snapshot().await?, &request).await?;
//!
//! let mut options = DrillOptions::default();
//! options.identities = backup::read_identities("key.txt".as_ref())?;
//! let report = backup::drill(&*store, &stored.metadata.object.key, &options).await?;
//! println!("{}", serde_json::to_string_pretty(&report)?);
//! # Ok(()) }
//! ```

pub mod at_rest;
mod catalogue;
mod drill;
mod keys;
mod metadata;
mod pipeline;
mod retention;
mod s3;
mod spool;
mod store;

use std::io;
use std::path::PathBuf;

pub use catalogue::{CatalogueEntry, catalogue, read_kit};
pub use drill::{DrillCheck, DrillOptions, DrillReport, Fetched, drill, fetch_snapshot};
pub use keys::{Identity, Recipient, read_identities};
pub use metadata::{
    BackupMetadata, CaFingerprint, Encryption, EncryptionSecret, FORMAT, KIT_SUFFIX, KitMember,
    NodeConfigDigest, RecoveryKit, SIDECAR_SUFFIX, StoredObject, sidecar_key,
};
pub use pipeline::{BackupRequest, StoredBackup, backup, backup_chunks};
pub use retention::{Retention, RetentionPlan, apply_retention};
pub use s3::{Addressing, PART_SIZE, PARTS_IN_FLIGHT, S3Settings, S3Store, SecretString};
pub use store::{
    LocalStore, ObjectInfo, ObjectStream, Store, StoreError, StoreFuture, Upload, get_all,
};

use crate::snapshot::CheckFailure;

/// Opens the store a user names: `s3://BUCKET/PREFIX` (with `addressing`,
/// settings from the AWS environment variables) or a directory.
pub fn open_store(name: &str, addressing: Addressing) -> Result<Box<dyn Store>, StoreError> {
    open_store_with(name, addressing, None, None)
}

/// [`open_store`] with an S3 store's region and endpoint given; those left
/// `None` come from the AWS environment variables as there.
pub fn open_store_with(
    name: &str,
    addressing: Addressing,
    region: Option<&str>,
    endpoint: Option<&str>,
) -> Result<Box<dyn Store>, StoreError> {
    if name.starts_with("s3://") {
        let mut settings = S3Settings::parse(name, addressing)?;
        settings.region = region.map(str::to_owned);
        settings.endpoint = endpoint.map(str::to_owned);
        Ok(Box::new(S3Store::new(settings.from_env())?))
    } else {
        Ok(Box::new(LocalStore::new(name)))
    }
}

/// Errors of backups, kits and drills.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum BackupError {
    /// The store failed.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// Receiving the snapshot failed; the upload was aborted.
    #[error("snapshot transfer failed (the upload was aborted): {source}")]
    Transfer {
        /// The client error.
        #[source]
        source: Box<crate::client::Error>,
    },
    /// The snapshot failed a check; the upload was aborted and nothing is
    /// stored under `key`.
    #[error(
        "{key}: snapshot failed the {} check (the upload was aborted): {failure}",
        .failure.check()
    )]
    Check {
        /// The key the backup was to be stored under.
        key: String,
        /// The check and how it failed.
        #[source]
        failure: Box<CheckFailure>,
    },
    /// A stage of the pipeline failed.
    #[error("backup {stage}: {source}")]
    Pipeline {
        /// The stage: `spool`, `zstd`, `age`, `upload`, `sidecar`, `kit`...
        stage: &'static str,
        /// The error.
        #[source]
        source: io::Error,
    },
    /// A local file could not be read or written.
    #[error("{}: {source}", .path.display())]
    Io {
        /// The file or directory.
        path: PathBuf,
        /// The error.
        #[source]
        source: io::Error,
    },
    /// A bad age key or identity file.
    #[error("{what}: {problem}")]
    Key {
        /// The key or file (never the secret).
        what: String,
        /// What is wrong.
        problem: String,
    },
    /// A recovery kit holds secrets: it is only stored encrypted.
    #[error("a recovery kit holds the cluster's secrets: it needs at least one age recipient")]
    KitNeedsRecipients,
    /// A sidecar or kit could not be read.
    #[error("{key}: {problem}")]
    Metadata {
        /// Its key.
        key: String,
        /// What is wrong.
        problem: String,
    },
}
