//! Compiles the protobuf definitions under `proto/` into Rust with protox (a
//! pure-Rust protobuf compiler, so no `protoc` is needed) and tonic-prost-build.

use std::io;

/// The Talos API files. Servers (the simulator's, test servers) generate
/// their own server stubs over these messages: the library has clients only.
const PROTOS: &[&str] = &[
    "google/rpc/status.proto",
    "common/common.proto",
    "machine/machine.proto",
    "machine/image.proto",
    "machine/lifecycle.proto",
    "cluster/cluster.proto",
];

/// COSI's resource API and the Talos resource specs.
const COSI_PROTOS: &[&str] = &[
    "v1alpha1/resource.proto",
    "v1alpha1/state.proto",
    "v1alpha1/meta.proto",
    "talos/definitions.proto",
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
        .compile_fds(fds)?;

    // COSI's state service and the specs of the Talos resources read
    // through it (see proto/cosi). Imports resolve from proto/cosi, as
    // upstream's from its proto/ root.
    let cosi = protox::compile(COSI_PROTOS, ["proto/cosi", "proto"]).map_err(io::Error::other)?;
    tonic_prost_build::configure()
        .build_client(true)
        .build_server(false)
        .codec_path("crate::api::TalosCodec")
        .include_file("cosi_api.rs")
        .compile_fds(cosi)
}
