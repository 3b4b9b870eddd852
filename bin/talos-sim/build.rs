//! Generates the simulator's wire layer with protox (no `protoc` needed) and
//! tonic-prost-build: server stubs for the Talos services over the client
//! library's own message types, and a client for etcd's v3 API.

use std::io;

fn main() -> io::Result<()> {
    println!("cargo:rerun-if-changed=../../proto");
    println!("cargo:rerun-if-changed=proto");

    let talos = protox::compile(
        [
            "machine/machine.proto",
            "machine/image.proto",
            "machine/lifecycle.proto",
            "cluster/cluster.proto",
        ],
        ["../../proto"],
    )
    .map_err(io::Error::other)?;
    tonic_prost_build::configure()
        .build_client(false)
        .build_server(true)
        // Messages come from talos-client, so a server and the client speak
        // the very same types.
        .extern_path(".common", "::talos_client::api::common")
        .extern_path(".machine", "::talos_client::api::machine")
        .extern_path(".cluster", "::talos_client::api::cluster")
        .extern_path(".google.rpc", "::talos_client::api::google::rpc")
        // A server implements only the calls it serves.
        .generate_default_stubs(true)
        .codec_path("crate::api::SimCodec")
        .include_file("talos_server.rs")
        .compile_fds(talos)?;

    // COSI's state service (cosi::StateService serves it), over the
    // library's message types like the Talos services.
    let cosi = protox::compile(["v1alpha1/state.proto"], ["../../proto/cosi"])
        .map_err(io::Error::other)?;
    tonic_prost_build::configure()
        .build_client(false)
        .build_server(true)
        .extern_path(".cosi", "::talos_client::api::cosi")
        .generate_default_stubs(true)
        .codec_path("crate::api::SimCodec")
        .include_file("cosi_server.rs")
        .compile_fds(cosi)?;

    let etcd = protox::compile(
        ["etcd/mvccpb/kv.proto", "etcd/etcdserverpb/rpc.proto"],
        ["proto"],
    )
    .map_err(io::Error::other)?;
    tonic_prost_build::configure()
        .build_client(true)
        .build_server(false)
        // Snapshot chunks are passed along without copying.
        .bytes(".etcdserverpb.SnapshotResponse.blob")
        .include_file("etcd_api.rs")
        .compile_fds(etcd)
}
