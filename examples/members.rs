//! Lists the etcd members as one control-plane node sees them.
//!
//! ```text
//! cargo run --example members -- [TALOSCONFIG] [NODE]
//! ```
//!
//! Without arguments it uses the talosconfig talosctl would use
//! ($TALOSCONFIG, ~/.talos/config, ...) and its context's first node.

use std::path::PathBuf;

use talos_client::Client;
use talos_client::config::{Overrides, TalosConfig};

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let explicit = args.next().map(PathBuf::from);
    let (config, location) = TalosConfig::load(explicit.as_deref())?;
    let context = config.resolve(&Overrides::default(), &location.path)?;
    let client = Client::from_context(&context)?;
    let node = args.next().or_else(|| context.nodes.first().cloned());
    let client = match &node {
        Some(node) => client.node(node.as_str()),
        None => client.endpoint_node(),
    };

    let members = client.etcd_member_list(true).await?;
    println!("{:<18} {:<16} {:<8} PEER URLS", "ID", "HOSTNAME", "LEARNER");
    for m in members {
        println!(
            "{:<18} {:<16} {:<8} {}",
            m.id.to_string(),
            m.hostname,
            m.is_learner,
            m.peer_urls.join(",")
        );
    }
    Ok(())
}
