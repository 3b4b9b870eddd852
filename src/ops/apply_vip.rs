//! The apply gate's VIP check (`--vip-check`): each Layer-2 VIP of a changed
//! `Layer2VIPConfig` document must be held by exactly one control-plane node
//! (an address status of that node, read through COSI as `talosctl get
//! addresses` does), and that node must answer the Talos API. Upstream's VIP
//! operator elects the holder through etcd among the control-plane nodes
//! whose configuration asks for the VIP; two holders, or none, mean clients
//! of the VIP reach nothing or the wrong node.

use std::net::IpAddr;

use super::cluster::{ClusterView, member_address};
use crate::Client;

/// Checks every VIP in `vips` against the control-plane nodes of `view`
/// (its etcd voters); a summary, or what failed.
pub(crate) async fn check_vips(
    client: &Client,
    view: &ClusterView,
    vips: &[String],
) -> Result<String, String> {
    let mut held = Vec::new();
    for vip in vips {
        let ip: IpAddr = vip
            .parse()
            .map_err(|_| format!("the VIP {vip:?} is not an IP address"))?;
        let holder = holder(client, view, ip).await?;
        client
            .node(holder.as_str())
            .version()
            .await
            .map_err(|e| format!("{holder} holds the VIP {vip} but does not answer: {e}"))?;
        held.push(format!(
            "the VIP {vip} is held by {holder} alone, which answers"
        ));
    }
    Ok(held.join("; "))
}

/// The one control-plane node whose address statuses hold `ip`.
async fn holder(client: &Client, view: &ClusterView, ip: IpAddr) -> Result<String, String> {
    let mut holders = Vec::new();
    let mut unread = Vec::new();
    for member in view.members.iter().filter(|m| !m.is_learner) {
        let Some(address) = member_address(member) else {
            continue;
        };
        match client
            .node(address.as_str())
            .resources()
            .address_statuses()
            .await
        {
            Ok(addresses) if addresses.iter().any(|a| a.ip() == Some(ip)) => holders.push(address),
            Ok(_) => {}
            Err(e) => unread.push(format!("{address}: {e}")),
        }
    }
    match holders.as_slice() {
        [one] => Ok(one.clone()),
        [] if unread.is_empty() => Err(format!("no control-plane node holds the VIP {ip}")),
        [] => Err(format!(
            "no control-plane node holds the VIP {ip} (addresses not read on {})",
            unread.join("; ")
        )),
        many => Err(format!(
            "the VIP {ip} is held by {} nodes at once: {}",
            many.len(),
            many.join(", ")
        )),
    }
}
