//! age keys: X25519 recipients (`age1...`) to encrypt to, identities
//! (`AGE-SECRET-KEY-1...`, as `age-keygen` writes them) to decrypt with.

use std::fmt;
use std::path::Path;
use std::str::FromStr;

use super::BackupError;

/// An age X25519 recipient (`age1...`), a public key.
#[derive(Clone)]
pub struct Recipient(pub(crate) age::x25519::Recipient);

impl FromStr for Recipient {
    type Err = BackupError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        age::x25519::Recipient::from_str(s.trim())
            .map(Recipient)
            .map_err(|problem| BackupError::Key {
                what: format!("recipient {s:?}"),
                problem: problem.to_string(),
            })
    }
}

impl fmt::Display for Recipient {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

impl fmt::Debug for Recipient {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Recipient({})", self.0)
    }
}

/// An age X25519 identity, a secret key; its `Debug` shows only the
/// matching recipient.
#[derive(Clone)]
pub struct Identity(pub(crate) age::x25519::Identity);

impl Identity {
    /// A new random identity.
    pub fn generate() -> Identity {
        Identity(age::x25519::Identity::generate())
    }

    /// The recipient that encrypts to this identity.
    pub fn recipient(&self) -> Recipient {
        Recipient(self.0.to_public())
    }

    /// The secret key as `AGE-SECRET-KEY-1...` text (for writing an
    /// identity file; never log it).
    pub fn to_secret_text(&self) -> String {
        use age::secrecy::ExposeSecret;
        self.0.to_string().expose_secret().to_owned()
    }
}

impl FromStr for Identity {
    type Err = BackupError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        age::x25519::Identity::from_str(s.trim())
            .map(Identity)
            .map_err(|_| BackupError::Key {
                what: "identity".into(),
                problem: "not an AGE-SECRET-KEY-1... key".into(),
            })
    }
}

impl fmt::Debug for Identity {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Identity(for {})", self.0.to_public())
    }
}

/// Reads an age identity file: one `AGE-SECRET-KEY-1...` per line, blank
/// lines and `#` comments ignored. The error names the file and line.
pub fn read_identities(path: &Path) -> Result<Vec<Identity>, BackupError> {
    let text = std::fs::read_to_string(path).map_err(|source| BackupError::Io {
        path: path.to_owned(),
        source,
    })?;
    let mut identities = Vec::new();
    for (n, line) in text.lines().enumerate() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let identity = line.parse::<Identity>().map_err(|_| BackupError::Key {
            what: format!("{} line {}", path.display(), n + 1),
            problem: "not an AGE-SECRET-KEY-1... identity".into(),
        })?;
        identities.push(identity);
    }
    if identities.is_empty() {
        return Err(BackupError::Key {
            what: path.display().to_string(),
            problem: "no identity in the file".into(),
        });
    }
    Ok(identities)
}

/// An age encryptor to `recipients` (at least one).
pub(crate) fn encryptor(recipients: &[Recipient]) -> Result<age::Encryptor, BackupError> {
    age::Encryptor::with_recipients(recipients.iter().map(|r| &r.0 as &dyn age::Recipient)).map_err(
        |e| BackupError::Key {
            what: "recipients".into(),
            problem: e.to_string(),
        },
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn identity_files_parse_and_name_the_bad_line() {
        let dir = tempfile::tempdir().unwrap();
        let id = Identity::generate();
        let good = dir.path().join("good.txt");
        std::fs::write(
            &good,
            format!(
                "# created: now\n# public key: {}\n\n{}\n",
                id.recipient(),
                id.to_secret_text()
            ),
        )
        .unwrap();
        let read = read_identities(&good).unwrap();
        assert_eq!(read.len(), 1);
        assert_eq!(read[0].recipient().to_string(), id.recipient().to_string());
        assert!(!format!("{:?}", read[0]).contains("AGE-SECRET-KEY"));

        let bad = dir.path().join("bad.txt");
        std::fs::write(&bad, format!("{}\nnot-a-key\n", id.to_secret_text())).unwrap();
        let error = read_identities(&bad).unwrap_err().to_string();
        assert!(error.contains("bad.txt line 2"), "{error}");
        assert!("age1nope".parse::<Recipient>().is_err());
    }
}
