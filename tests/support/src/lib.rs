//! Test helpers shared by the workspace's packages, kept out of every
//! published API:
//!
//! - [`server`]: an in-process Talos API server with real mutual TLS and a
//!   test PKI, whose answers the tests control;
//! - [`sim`]: a simulated cluster (talos-sim) per test, and waiting for a
//!   condition with a deadline;
//! - [`etcd`]: a throwaway real etcd member and snapshots taken from it;
//! - [`cli`]: running a built binary of the workspace;
//! - [`pty`]: a pseudo-terminal, to answer a prompt as a person would.

pub mod cli;
pub mod etcd;
pub mod pty;
pub mod server;
pub mod sim;

use std::io::Write as _;
use std::path::Path;

use futures::StreamExt as _;

/// Writes a byte stream from the API to `path` as it arrives, unverified
/// (what talosctl does), and returns the byte count.
pub async fn stream_to_file(
    mut stream: talos_client::client::ByteStream,
    path: &Path,
) -> talos_client::Result<u64> {
    let mut file = std::io::BufWriter::with_capacity(
        1 << 20,
        std::fs::File::create(path).expect("create the output file"),
    );
    let mut total = 0u64;
    while let Some(chunk) = stream.next().await {
        let chunk = chunk?;
        total += chunk.len() as u64;
        file.write_all(&chunk).expect("write the output file");
    }
    file.flush().expect("flush the output file");
    Ok(total)
}
