//! The admin kubeconfig a control-plane node generates (MachineService
//! `Kubeconfig`). Talos sends it as a gzipped tar archive holding one file,
//! `kubeconfig` (machined's Kubeconfig handler in
//! internal/app/machined/internal/server/v1alpha1), in one or more
//! `common.Data` messages.

use std::io::Read as _;

use futures::StreamExt as _;

use super::reply::metadata_error;
use super::{Client, Error, Failure, One, Result, machine_stub};

/// The largest archive accepted: a kubeconfig is a few KiB.
const MAX_ARCHIVE: usize = 16 << 20;

impl Client<One> {
    /// The cluster's admin kubeconfig (YAML), as the node generates it. Fails
    /// on a node that is not a control-plane node.
    pub async fn kubeconfig(&self) -> Result<Vec<u8>> {
        let (_, transport, node) = self.transport(&self.target, None).await?;
        let mut stream = machine_stub(transport)
            .kubeconfig(())
            .await
            .map_err(|s| Error::from_status(&s, Some(&node)))?
            .into_inner();
        let mut archive = Vec::new();
        while let Some(item) = stream.next().await {
            let data = item.map_err(|s| Error::from_status(&s, Some(&node)))?;
            if let Some(error) = metadata_error(data.metadata.as_ref()) {
                return Err(error.with_node(&node));
            }
            archive.extend_from_slice(&data.bytes);
            if archive.len() > MAX_ARCHIVE {
                return Err(protocol(&node, "the kubeconfig archive exceeds 16 MiB"));
            }
        }
        extract(&archive).map_err(|reason| protocol(&node, &reason))
    }
}

fn protocol(node: &str, message: &str) -> Error {
    Error::Protocol(Failure {
        node: Some(node.to_string()),
        message: format!("kubeconfig: {message}"),
    })
}

/// The `kubeconfig` file of a gzipped tar archive.
fn extract(archive: &[u8]) -> std::result::Result<Vec<u8>, String> {
    let gunzip = flate2::read::GzDecoder::new(archive);
    let mut tar = tar::Archive::new(gunzip);
    let entries = tar
        .entries()
        .map_err(|e| format!("not a gzipped tar archive: {e}"))?;
    for entry in entries {
        let mut entry = entry.map_err(|e| format!("damaged archive: {e}"))?;
        let is_kubeconfig = entry
            .path()
            .map(|p| p.as_os_str() == "kubeconfig")
            .unwrap_or(false);
        if is_kubeconfig {
            let mut yaml = Vec::new();
            entry
                .read_to_end(&mut yaml)
                .map_err(|e| format!("damaged archive: {e}"))?;
            return Ok(yaml);
        }
    }
    Err("the archive holds no file named kubeconfig".into())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn archive(name: &str, body: &[u8]) -> Vec<u8> {
        let mut builder = tar::Builder::new(flate2::write::GzEncoder::new(
            Vec::new(),
            flate2::Compression::default(),
        ));
        let mut header = tar::Header::new_gnu();
        header.set_size(body.len() as u64);
        header.set_mode(0o600);
        header.set_cksum();
        builder.append_data(&mut header, name, body).unwrap();
        builder.into_inner().unwrap().finish().unwrap()
    }

    #[test]
    fn extracts_the_kubeconfig_file() {
        let yaml = b"apiVersion: v1\nkind: Config\n";
        assert_eq!(extract(&archive("kubeconfig", yaml)).unwrap(), yaml);
    }

    #[test]
    fn rejects_other_archives_and_plain_yaml() {
        assert!(
            extract(&archive("other", b"x"))
                .unwrap_err()
                .contains("no file named kubeconfig")
        );
        let plain = extract(b"apiVersion: v1\n").unwrap_err();
        assert!(plain.contains("damaged archive"), "{plain}");
    }
}
