//! Our client's COSI reads against cosi-project/runtime's own protobuf state
//! server holding upstream Talos's resource types (the stub server's
//! cmd/stubserver/cosi.go): the specs upstream's code encodes decode into
//! our typed values, and upstream's registry supplies the definitions our
//! type resolution reads.

use std::net::IpAddr;

use prost::Message as _;
use talos_client::api::talos::resource::definitions as defs;
use talos_client::client::resources::{ConfigId, types};

use super::harness::StubServer;
use super::stub_client;

/// What cmd/stubserver/cosi.go puts in its state.
const ACTIVE: &str = "version: v1alpha1\nmachine:\n    type: controlplane\ncluster:\n    clusterName: interop-active\n";
const SAVED: &str = "version: v1alpha1\nmachine:\n    type: controlplane\ncluster:\n    clusterName: interop-saved\n";

#[tokio::test]
async fn our_client_reads_upstream_resources_from_the_runtime_state_server() {
    let stub = StubServer::start().await;
    let res = stub_client(&stub).resources();

    let active = res.machine_config(ConfigId::Active).await.unwrap();
    assert_eq!(
        (active.id.as_str(), active.yaml.as_str()),
        ("v1alpha1", ACTIVE)
    );
    assert_eq!(
        res.machine_config(ConfigId::Persistent).await.unwrap().yaml,
        SAVED
    );

    let status = res.machine_status().await.unwrap();
    assert_eq!(status.stage, "booting");
    assert!(!status.ready);
    assert_eq!(status.unmet_conditions.len(), 1);
    assert_eq!(
        (
            status.unmet_conditions[0].name.as_str(),
            status.unmet_conditions[0].reason.as_str()
        ),
        ("etcd", "service not healthy")
    );
    // The protobuf spec, decoded with our definitions, says the same.
    let raw = res
        .get(types::RUNTIME_NAMESPACE, types::MACHINE_STATUS, "machine")
        .await
        .unwrap();
    let spec = defs::MachineStatusSpec::decode(raw.spec_proto.as_slice()).unwrap();
    assert_eq!(spec.stage, defs::MachineStage::Booting as i32);
    assert_eq!(
        spec.status.unwrap().unmet_conditions[0].reason,
        "service not healthy"
    );

    let members = res.cluster_members().await.unwrap();
    assert_eq!(members.len(), 1);
    let m = &members[0];
    assert_eq!(
        (m.id.as_str(), m.node_id.as_str(), m.hostname.as_str()),
        ("stub-cp-1", "n0d3-1d", "stub-cp-1")
    );
    assert_eq!(m.machine_type, "controlplane");
    assert_eq!(m.operating_system, "Talos (v1.13.9)");
    let addresses: Vec<IpAddr> = vec!["10.20.30.40".parse().unwrap(), "fd00::40".parse().unwrap()];
    assert_eq!(m.addresses, addresses);
    let raw = res
        .list(types::CLUSTER_NAMESPACE, types::CLUSTER_MEMBER)
        .await
        .unwrap();
    let spec = defs::ClusterMemberSpec::decode(raw[0].spec_proto.as_slice()).unwrap();
    assert_eq!(
        spec.addresses[1].ip,
        addresses[1]
            .to_string()
            .parse::<std::net::Ipv6Addr>()
            .unwrap()
            .octets()
    );
    assert_eq!(
        spec.machine_type,
        defs::MachineType::TypeControlPlane as i32
    );
    assert_eq!(spec.control_plane.unwrap().api_server_port, 6443);

    let statuses = res.address_statuses().await.unwrap();
    assert_eq!(statuses.len(), 1);
    let a = &statuses[0];
    assert_eq!(a.id, "eth0/10.20.30.50/32");
    assert_eq!(
        (a.address.as_str(), a.link_name.as_str()),
        ("10.20.30.50/32", "eth0")
    );
    assert_eq!((a.family.as_str(), a.scope.as_str()), ("inet4", "global"));
    assert_eq!(a.ip(), Some("10.20.30.50".parse().unwrap()));

    // Upstream's registry made the definitions: aliases resolve as in talosctl.
    assert_eq!(
        res.resolve("mc").await.unwrap().resource_type,
        types::MACHINE_CONFIG
    );
    assert_eq!(
        res.resolve("addresses").await.unwrap().resource_type,
        types::ADDRESS_STATUS
    );
    assert_eq!(
        res.resolve("members").await.unwrap().resource_type,
        types::CLUSTER_MEMBER
    );
    let ms = res.resolve("machinestatus").await.unwrap();
    assert_eq!(ms.display_type, "MachineStatus");
    assert_eq!(
        ms.print_columns[0],
        ("Stage".to_string(), "{.stage}".to_string())
    );
    assert!(res.resolve("mc").await.unwrap().sensitive);
}
