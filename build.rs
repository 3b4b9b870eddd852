//! Compiles the protobuf definitions under `proto/` into Rust with protox (a
//! pure-Rust protobuf compiler, so no `protoc` is needed) and tonic-prost-build.

use std::io;

/// The Talos API files. Servers (the simulator's, test servers) generate
/// their own server stubs over these messages: the library has clients only.
const PROTOS: &[&str] = &[
    "google/rpc/status.proto",
    "common/common.proto",
    "machine/machine.proto",
    "cluster/cluster.proto",
];

fn main() -> io::Result<()> {
    println!("cargo:rerun-if-changed=proto");
    let fds = protox::compile(PROTOS, ["proto"]).map_err(io::Error::other)?;
    tonic_prost_build::configure()
        .build_client(true)
        .build_server(false)
        // Snapshot chunks are passed along without copying.
        .bytes(".common.Data.bytes")
        // Talos messages are small: see `crate::api::TalosCodec`.
        .codec_path("crate::api::TalosCodec")
        .include_file("talos_api.rs")
        .compile_fds(fds)
}
