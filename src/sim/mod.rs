//! talos-sim: simulated Talos control-plane nodes on loopback, each backed
//! by a real etcd member, behind a Talos API front that behaves like apid and
//! machined for the calls this crate speaks.

pub mod pki;
pub mod serve;
