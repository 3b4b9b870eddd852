//! Reading a file from a node (MachineService `Read`).

use super::{ByteStream, Client, One, Result};
use crate::api::machine;

impl Client<One> {
    /// Streams a file from the node (MachineService `Read`, admin only). A
    /// missing file fails with [`Error::NotFound`](crate::Error::NotFound).
    /// Since Talos 1.12 the STATE partition is not mounted, so the persisted
    /// machine configuration is read through COSI, not this call.
    pub async fn read(&self, path: &str) -> Result<ByteStream> {
        self.data_stream(
            "/machine.MachineService/Read",
            &machine::ReadRequest {
                path: path.to_string(),
            },
        )
        .await
    }
}
