//! Kubernetes values encrypted at rest, opened with a recovery kit's keys.
//!
//! Talos configures kube-apiserver's encryption of Secrets with the
//! cluster's `secretboxEncryptionSecret` as key `key2` and its
//! `aescbcEncryptionSecret` as key `key1`
//! (internal/app/machined/pkg/controllers/k8s/internal/k8stemplates/apiserver.go).
//! kube-apiserver then stores `k8s:enc:PROVIDER:v1:KEYNAME:` followed by,
//! for secretbox, a 24-byte nonce and the sealed box (XSalsa20-Poly1305),
//! and for aescbc, a 16-byte IV and the AES-CBC ciphertext with PKCS#7
//! padding (k8s.io/apiserver/pkg/storage/value/encrypt/{secretbox,aes}).

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as BASE64;

use super::metadata::RecoveryKit;

/// The prefix of every value encrypted at rest.
pub const ENCRYPTED_PREFIX: &[u8] = b"k8s:enc:";

/// The key name Talos gives each provider's key.
fn talos_key_name(provider: &str) -> Option<&'static str> {
    match provider {
        "secretbox" => Some("key2"),
        "aescbc" => Some("key1"),
        _ => None,
    }
}

/// How a value was opened.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Opened {
    /// `secretbox` or `aescbc`.
    pub provider: String,
    /// The key name the value names (`key2`, `key1`).
    pub key_name: String,
    /// The plain value: kube-apiserver's storage encoding of the object.
    pub plain: Vec<u8>,
}

impl Opened {
    /// Whether the plain value is a Kubernetes object as kube-apiserver
    /// stores it: its protobuf envelope (`k8s\0`) or JSON.
    pub fn is_kubernetes_object(&self) -> bool {
        self.plain.starts_with(b"k8s\0") || self.plain.first() == Some(&b'{')
    }
}

/// Opens `value`, as stored in etcd, with the kit's key for the provider
/// and key name it names. The error says what did not match.
pub fn open(kit: &RecoveryKit, value: &[u8]) -> Result<Opened, String> {
    let rest = value
        .strip_prefix(ENCRYPTED_PREFIX)
        .ok_or("the value is not encrypted at rest (no k8s:enc: prefix)")?;
    let (provider, rest) = split_field(rest).ok_or("no provider after k8s:enc:")?;
    let (version, rest) = split_field(rest).ok_or("no version after the provider")?;
    let (key_name, data) = split_field(rest).ok_or("no key name after the version")?;
    if version != "v1" {
        return Err(format!("{provider} {version}: only v1 is known"));
    }
    let secret = kit
        .encryption_secrets
        .iter()
        .find(|s| s.provider == provider && talos_key_name(&s.provider) == Some(key_name.as_str()))
        .ok_or_else(|| format!("the kit has no {provider} key named {key_name}"))?;
    let key = BASE64
        .decode(secret.secret.expose())
        .map_err(|e| format!("the kit's {provider} key is not base64: {e}"))?;
    let plain = match provider.as_str() {
        "secretbox" => open_secretbox(&key, data)?,
        "aescbc" => open_aescbc(&key, data)?,
        other => return Err(format!("provider {other} is not one Talos configures")),
    };
    Ok(Opened {
        provider,
        key_name,
        plain,
    })
}

/// Seals `plain` as kube-apiserver stores a value with Talos' secretbox
/// key (`k8s:enc:secretbox:v1:key2:`, a random nonce, the box).
pub fn seal_secretbox(secret_base64: &str, plain: &[u8]) -> Result<Vec<u8>, String> {
    use crypto_secretbox::XSalsa20Poly1305;
    use crypto_secretbox::aead::{Aead, AeadCore, KeyInit, OsRng};

    let key = BASE64
        .decode(secret_base64)
        .map_err(|e| format!("the key is not base64: {e}"))?;
    let cipher = XSalsa20Poly1305::new_from_slice(&key)
        .map_err(|_| format!("a secretbox key is 32 bytes, not {}", key.len()))?;
    let nonce = XSalsa20Poly1305::generate_nonce(&mut OsRng);
    let sealed = cipher
        .encrypt(&nonce, plain)
        .map_err(|_| "secretbox sealing failed".to_string())?;
    let mut out = b"k8s:enc:secretbox:v1:key2:".to_vec();
    out.extend_from_slice(&nonce);
    out.extend_from_slice(&sealed);
    Ok(out)
}

fn split_field(bytes: &[u8]) -> Option<(String, &[u8])> {
    let colon = bytes.iter().position(|&b| b == b':')?;
    let field = std::str::from_utf8(&bytes[..colon]).ok()?;
    Some((field.to_owned(), &bytes[colon + 1..]))
}

fn open_secretbox(key: &[u8], data: &[u8]) -> Result<Vec<u8>, String> {
    use crypto_secretbox::aead::{Aead, KeyInit};
    use crypto_secretbox::{Nonce, XSalsa20Poly1305};

    const NONCE: usize = 24;
    const TAG: usize = 16;
    let cipher = XSalsa20Poly1305::new_from_slice(key)
        .map_err(|_| format!("a secretbox key is 32 bytes, not {}", key.len()))?;
    if data.len() < NONCE + TAG {
        return Err(format!("{} bytes are too few for a secretbox", data.len()));
    }
    let (nonce, sealed) = data.split_at(NONCE);
    cipher
        .decrypt(Nonce::from_slice(nonce), sealed)
        .map_err(|_| "the kit's secretbox key does not open the value".to_string())
}

fn open_aescbc(key: &[u8], data: &[u8]) -> Result<Vec<u8>, String> {
    use aes::cipher::{BlockDecryptMut, KeyIvInit, block_padding::Pkcs7};

    const BLOCK: usize = 16;
    if data.len() < 2 * BLOCK || !data.len().is_multiple_of(BLOCK) {
        return Err(format!(
            "{} bytes are not an IV and AES-CBC blocks",
            data.len()
        ));
    }
    let (iv, ciphertext) = data.split_at(BLOCK);
    let wrong = || "the kit's aescbc key does not open the value".to_string();
    let plain = match key.len() {
        16 => cbc::Decryptor::<aes::Aes128>::new_from_slices(key, iv)
            .map_err(|_| wrong())?
            .decrypt_padded_vec_mut::<Pkcs7>(ciphertext),
        24 => cbc::Decryptor::<aes::Aes192>::new_from_slices(key, iv)
            .map_err(|_| wrong())?
            .decrypt_padded_vec_mut::<Pkcs7>(ciphertext),
        32 => cbc::Decryptor::<aes::Aes256>::new_from_slices(key, iv)
            .map_err(|_| wrong())?
            .decrypt_padded_vec_mut::<Pkcs7>(ciphertext),
        n => return Err(format!("an AES key is 16, 24 or 32 bytes, not {n}")),
    };
    plain.map_err(|_| wrong())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backup::SecretString;
    use crate::backup::metadata::EncryptionSecret;

    fn kit(provider: &str, secret: &str) -> RecoveryKit {
        RecoveryKit {
            cluster: "c".into(),
            revision: 1,
            encryption_secrets: vec![EncryptionSecret {
                provider: provider.into(),
                secret: SecretString::new(secret),
            }],
            members: Vec::new(),
            ca_fingerprints: Vec::new(),
            node_configs: Vec::new(),
        }
    }

    #[test]
    fn a_sealed_secret_opens_with_the_kit_and_not_with_another_key() {
        let secret = BASE64.encode([7u8; 32]);
        let sealed = seal_secretbox(&secret, b"k8s\0secret data").unwrap();
        assert!(sealed.starts_with(b"k8s:enc:secretbox:v1:key2:"));
        let opened = open(&kit("secretbox", &secret), &sealed).unwrap();
        assert_eq!(opened.plain, b"k8s\0secret data");
        assert_eq!(opened.key_name, "key2");
        assert!(opened.is_kubernetes_object());

        let other = BASE64.encode([8u8; 32]);
        let err = open(&kit("secretbox", &other), &sealed).unwrap_err();
        assert!(err.contains("does not open"), "{err}");
        let err = open(&kit("aescbc", &secret), &sealed).unwrap_err();
        assert!(err.contains("no secretbox key named key2"), "{err}");
        let err = open(&kit("secretbox", &secret), b"plain").unwrap_err();
        assert!(err.contains("not encrypted"), "{err}");
    }

    #[test]
    fn an_aescbc_value_opens_with_pkcs7_padding() {
        use aes::cipher::{BlockEncryptMut, KeyIvInit, block_padding::Pkcs7};

        let key = [3u8; 32];
        let iv = [9u8; 16];
        let ciphertext = cbc::Encryptor::<aes::Aes256>::new_from_slices(&key, &iv)
            .unwrap()
            .encrypt_padded_vec_mut::<Pkcs7>(b"{\"kind\":\"Secret\"}");
        let mut value = b"k8s:enc:aescbc:v1:key1:".to_vec();
        value.extend_from_slice(&iv);
        value.extend_from_slice(&ciphertext);
        let opened = open(&kit("aescbc", &BASE64.encode(key)), &value).unwrap();
        assert_eq!(opened.plain, b"{\"kind\":\"Secret\"}");
        let err = open(&kit("aescbc", &BASE64.encode([4u8; 32])), &value).unwrap_err();
        assert!(err.contains("does not open"), "{err}");
    }
}
