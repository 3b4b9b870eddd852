//! The catalogue: the backups this library wrote, found by their sidecars.
//!
//! An object is in the catalogue only if a sidecar `KEY.json` beside it
//! parses as a [`BackupMetadata`] of [`FORMAT`] naming `KEY` itself.
//! Anything else in the store (other tools' objects, stray files) is never
//! listed, so retention never touches it.

use std::collections::HashMap;
use std::io::Read;

use super::BackupError;
use super::keys::Identity;
use super::metadata::{BackupMetadata, FORMAT, RecoveryKit, SIDECAR_SUFFIX};
use super::store::{Store, StoreError, get_all};

/// One backup of the catalogue.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct CatalogueEntry {
    /// The store it is in ([`Store::describe`]).
    pub store: String,
    /// Its sidecar.
    pub metadata: BackupMetadata,
    /// Whether the object itself is there, with the sidecar's size.
    pub complete: bool,
    /// The object's size in the store (`None`: no object under the key).
    pub stored_size: Option<u64>,
}

impl CatalogueEntry {
    /// Why the backup is not complete, in words (the size check that
    /// failed), or `None` when it is.
    pub fn incomplete(&self) -> Option<String> {
        if self.complete {
            return None;
        }
        let want = self.metadata.object.size;
        Some(match self.stored_size {
            Some(size) => format!(
                "its object holds {size} bytes where its sidecar says {want}: truncated or still being written"
            ),
            None => format!("its object is missing (its sidecar says {want} bytes)"),
        })
    }
}

/// Lists the backups in `stores` (local and remote alike), newest first.
pub async fn catalogue(stores: &[&dyn Store]) -> Result<Vec<CatalogueEntry>, BackupError> {
    let mut entries = Vec::new();
    for store in stores {
        entries.extend(list_one(*store).await?);
    }
    entries.sort_by(|a, b| {
        b.metadata
            .time
            .cmp(&a.metadata.time)
            .then_with(|| a.metadata.object.key.cmp(&b.metadata.object.key))
    });
    Ok(entries)
}

async fn list_one(store: &dyn Store) -> Result<Vec<CatalogueEntry>, BackupError> {
    let objects = store.list("").await?;
    let sizes: HashMap<&str, u64> = objects.iter().map(|o| (o.key.as_str(), o.size)).collect();
    let mut entries = Vec::new();
    for object in &objects {
        let Some(key) = object.key.strip_suffix(SIDECAR_SUFFIX) else {
            continue;
        };
        // Sidecars are small; anything large is not one of ours.
        if object.size > 1 << 20 {
            continue;
        }
        let bytes = match get_all(store, &object.key).await {
            Ok(bytes) => bytes,
            Err(StoreError::NotFound { .. }) => continue, // removed meanwhile
            Err(e) => return Err(e.into()),
        };
        let Ok(metadata) = serde_json::from_slice::<BackupMetadata>(&bytes) else {
            continue;
        };
        if metadata.format != FORMAT || metadata.object.key != key {
            continue;
        }
        let stored_size = sizes.get(key).copied();
        entries.push(CatalogueEntry {
            store: store.describe(),
            complete: stored_size == Some(metadata.object.size),
            stored_size,
            metadata,
        });
    }
    Ok(entries)
}

/// Fetches and decrypts the recovery kit of a backup.
pub async fn read_kit(
    store: &dyn Store,
    metadata: &BackupMetadata,
    identities: &[Identity],
) -> Result<RecoveryKit, BackupError> {
    let kit = metadata.kit.as_ref().ok_or_else(|| BackupError::Metadata {
        key: metadata.sidecar_key(),
        problem: "this backup has no recovery kit".into(),
    })?;
    let sealed = get_all(store, &kit.key).await?;
    let bad = |problem: String| BackupError::Metadata {
        key: kit.key.clone(),
        problem,
    };
    let digest = crate::snapshot::Hex(&sha2::Sha256::digest(&sealed)).to_string();
    if digest != kit.sha256 {
        return Err(bad(format!(
            "sha256 {digest} differs from the sidecar's {}",
            kit.sha256
        )));
    }
    let decryptor = age::Decryptor::new(&sealed[..]).map_err(|e| bad(e.to_string()))?;
    let mut reader = decryptor
        .decrypt(identities.iter().map(|i| &i.0 as &dyn age::Identity))
        .map_err(|e| bad(e.to_string()))?;
    let mut json = Vec::new();
    reader
        .read_to_end(&mut json)
        .map_err(|e| bad(e.to_string()))?;
    serde_json::from_slice(&json).map_err(|e| bad(format!("not a recovery kit: {e}")))
}

use sha2::Digest as _;
