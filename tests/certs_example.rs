//! The example PKI in certs-example/ is coherent: its talosconfigs resolve,
//! carry the documented roles, and connect over mutual TLS to a server
//! presenting its server certificate.

use talos_test_support as common;

use std::path::Path;

use common::server::TestServer;
use talos_client::Client;
use talos_client::config::{Overrides, TalosConfig};
use talos_client::tls::Credentials;

fn read(name: &str) -> Vec<u8> {
    std::fs::read(Path::new("certs-example").join(name)).unwrap()
}

#[tokio::test]
async fn example_talosconfigs_connect_with_their_roles() {
    let server = TestServer::start_with(
        Credentials::from_pem(read("ca.crt"), read("server.crt"), read("server.key")),
        "example",
    )
    .await;
    for (file, role) in [
        ("talosconfig", "os:admin"),
        ("talosconfig-reader", "os:reader"),
        ("talosconfig-backup", "os:etcd:backup"),
    ] {
        let path = Path::new("certs-example").join(file);
        let config = TalosConfig::read(&path).unwrap();
        let context = config
            .resolve(
                &Overrides::default().with_endpoints(vec![server.endpoint()]),
                &path,
            )
            .unwrap();
        assert_eq!(context.nodes, ["127.0.0.11"]);
        let info = context.credentials.certificate_info().unwrap();
        assert_eq!(info.roles, [role], "{file}");
        assert!(info.client_auth_only, "{file}");
        let client = Client::from_context(&context).unwrap();
        assert_eq!(client.hostname().await.unwrap(), "example", "{file}");
    }
}
