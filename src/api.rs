//! The generated wire layer: prost messages and tonic client/server stubs for
//! every `.proto` file under `proto/`.
//!
//! This is the escape hatch for calls the typed [`Client`](crate::Client) does
//! not wrap. Module paths follow the protobuf packages: [`machine`],
//! [`common`], [`cluster`], [`google::rpc`].

#![allow(missing_docs, clippy::all, clippy::pedantic)]

include!(concat!(env!("OUT_DIR"), "/talos_api.rs"));
