//! Compiles the protobuf definitions under `proto/` into Rust with protox (a
//! pure-Rust protobuf compiler, so no `protoc` is needed) and tonic-prost-build.

use std::io;

/// The Talos API files, plus etcd's v3 API used by the simulator.
const PROTOS: &[&str] = &[
    "google/rpc/status.proto",
    "common/common.proto",
    "machine/machine.proto",
    "cluster/cluster.proto",
    "etcd/mvccpb/kv.proto",
    "etcd/etcdserverpb/rpc.proto",
];

fn main() -> io::Result<()> {
    println!("cargo:rerun-if-changed=proto");
    let fds = protox::compile(PROTOS, ["proto"]).map_err(io::Error::other)?;
    tonic_prost_build::configure()
        .build_client(true)
        .build_server(true)
        // Snapshot chunks are passed along without copying.
        .bytes(".common.Data.bytes")
        .bytes(".etcdserverpb.SnapshotResponse.blob")
        // Servers (the simulator, tests) implement only the calls they serve.
        .generate_default_stubs(true)
        .include_file("talos_api.rs")
        .compile_fds(fds)
}
