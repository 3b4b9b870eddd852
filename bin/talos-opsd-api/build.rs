//! Compiles the daemon's API (`proto/opsd/v1/opsd.proto`, in this package
//! so that its published package holds it) with protox (no `protoc`
//! needed) and tonic-prost-build: server stubs for the daemon, client stubs
//! for the CLI and the tests.

use std::io;

fn main() -> io::Result<()> {
    println!("cargo:rerun-if-changed=proto/opsd");
    let fds = protox::compile(["opsd/v1/opsd.proto"], ["proto"]).map_err(io::Error::other)?;
    tonic_prost_build::configure()
        .build_client(true)
        .build_server(true)
        .compile_fds(fds)
}
