//! The COSI resources of a simulated node, derived from its state each time
//! they are asked for: machine configuration (active and persisted),
//! machine status, version, services, the local etcd member, cluster
//! members, addresses (a Layer-2 VIP included on the node holding it),
//! volumes, and the namespaces and resource definitions that describe
//! them. Types, ids and spec fields follow siderolabs/talos v1.13.9
//! pkg/machinery/resources; the definitions' aliases are derived as
//! cosi-project/runtime's pkg/resource/meta/spec/resource_definition.go
//! (Fill) derives them.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use prost::Message as _;
use serde::Serialize;

use crate::api::cosi::resource::meta as meta_pb;
use crate::api::talos::resource::definitions as defs;
use crate::node::{Node, Power, system_volumes};
use crate::shared::Shared;
use talos_client::client::resources::types as t;

/// One resource before versioning: where it is and its spec.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Item {
    pub namespace: &'static str,
    pub resource_type: &'static str,
    pub id: String,
    pub yaml: String,
    pub proto: Vec<u8>,
    pub annotations: Vec<(String, String)>,
}

/// A resource type the simulated node serves.
pub(crate) struct TypeDef {
    pub resource_type: &'static str,
    pub display: &'static str,
    pub namespace: &'static str,
    pub aliases: &'static [&'static str],
    pub columns: &'static [(&'static str, &'static str)],
    pub sensitive: bool,
}

/// The types served, with upstream's explicit aliases, print columns and
/// sensitivity (each type's ResourceDefinition() in pkg/machinery/resources).
pub(crate) const TYPES: &[TypeDef] = &[
    TypeDef {
        resource_type: t::RESOURCE_DEFINITION,
        display: "ResourceDefinition",
        namespace: t::META_NAMESPACE,
        aliases: &["api-resources"],
        columns: &[("Aliases", "{.aliases[:]}")],
        sensitive: false,
    },
    TypeDef {
        resource_type: "Namespaces.meta.cosi.dev",
        display: "Namespace",
        namespace: t::META_NAMESPACE,
        aliases: &["ns"],
        columns: &[],
        sensitive: false,
    },
    TypeDef {
        resource_type: t::MACHINE_CONFIG,
        display: "MachineConfig",
        namespace: t::CONFIG_NAMESPACE,
        aliases: &[],
        columns: &[],
        sensitive: true,
    },
    TypeDef {
        resource_type: t::MACHINE_STATUS,
        display: "MachineStatus",
        namespace: t::RUNTIME_NAMESPACE,
        aliases: &[],
        columns: &[("Stage", "{.stage}"), ("Ready", "{.status.ready}")],
        sensitive: false,
    },
    TypeDef {
        resource_type: t::VERSION,
        display: "Version",
        namespace: t::RUNTIME_NAMESPACE,
        aliases: &[],
        columns: &[("Name", "{.name}"), ("Version", "{.version}")],
        sensitive: false,
    },
    TypeDef {
        resource_type: t::SERVICE,
        display: "Service",
        namespace: t::RUNTIME_NAMESPACE,
        aliases: &["svc"],
        columns: &[
            ("Running", "{.running}"),
            ("Healthy", "{.healthy}"),
            ("Health Unknown", "{.unknown}"),
        ],
        sensitive: false,
    },
    TypeDef {
        resource_type: t::ETCD_MEMBER,
        display: "EtcdMember",
        namespace: t::ETCD_NAMESPACE,
        aliases: &[],
        columns: &[("Member ID", "{.memberID}")],
        sensitive: false,
    },
    TypeDef {
        resource_type: t::CLUSTER_MEMBER,
        display: "Member",
        namespace: t::CLUSTER_NAMESPACE,
        aliases: &[],
        columns: &[
            ("Hostname", "{.hostname}"),
            ("Machine Type", "{.machineType}"),
            ("OS", "{.operatingSystem}"),
            ("Addresses", "{.addresses}"),
        ],
        sensitive: false,
    },
    TypeDef {
        resource_type: t::IDENTITY,
        display: "Identity",
        namespace: t::CLUSTER_NAMESPACE,
        aliases: &[],
        columns: &[("ID", "{.nodeId}")],
        sensitive: false,
    },
    TypeDef {
        resource_type: t::ADDRESS_STATUS,
        display: "AddressStatus",
        namespace: t::NETWORK_NAMESPACE,
        aliases: &["address", "addresses"],
        columns: &[("Address", "{.address}"), ("Link", "{.linkName}")],
        sensitive: false,
    },
    TypeDef {
        resource_type: t::VOLUME_STATUS,
        display: "VolumeStatus",
        namespace: t::RUNTIME_NAMESPACE,
        aliases: &[],
        columns: &[
            ("Type", "{.type}"),
            ("Phase", "{.phase}"),
            ("Location", "{.location}"),
            ("Size", "{.prettySize}"),
        ],
        sensitive: false,
    },
];

/// The namespaces served, with upstream's descriptions.
pub(crate) const NAMESPACES: &[(&str, &str)] = &[
    (
        t::META_NAMESPACE,
        "Metadata namespace which contains resource definitions.",
    ),
    (t::CONFIG_NAMESPACE, "Talos node configuration."),
    (t::RUNTIME_NAMESPACE, "Talos runtime resources."),
    (t::ETCD_NAMESPACE, "etcd resources."),
    (
        t::CLUSTER_NAMESPACE,
        "Cluster configuration and discovery resources.",
    ),
    (t::NETWORK_NAMESPACE, "Networking resources."),
];

/// The definition of `resource_type` (exact name), if served.
pub(crate) fn definition(resource_type: &str) -> Option<&'static TypeDef> {
    TYPES.iter().find(|d| d.resource_type == resource_type)
}

/// `Fill`'s aliases: the explicit ones, the singular name, the capitals
/// (and their plural) when there are several; all-aliases add the plural
/// and the plural with each prefix of the suffix.
fn aliases(def: &TypeDef) -> (Vec<String>, Vec<String>) {
    let (name, suffix) = def
        .resource_type
        .split_once('.')
        .unwrap_or((def.resource_type, ""));
    let mut aliases: Vec<String> = def.aliases.iter().map(|a| a.to_string()).collect();
    aliases.push(def.display.to_lowercase());
    let mut all = vec![name.to_lowercase()];
    let parts: Vec<&str> = suffix.split('.').collect();
    for i in 1..parts.len() {
        all.push(format!("{}.{}", name.to_lowercase(), parts[..i].join(".")));
    }
    let capitals: String = name.chars().filter(char::is_ascii_uppercase).collect();
    if capitals.len() > 1 {
        aliases.push(capitals.to_lowercase());
        if !capitals.ends_with('S') {
            aliases.push(format!("{}s", capitals.to_lowercase()));
        }
    }
    all.extend(aliases.iter().cloned());
    (aliases, all)
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct RdYaml {
    #[serde(rename = "type")]
    resource_type: String,
    display_type: String,
    default_namespace: String,
    aliases: Vec<String>,
    all_aliases: Vec<String>,
    print_columns: Vec<ColumnYaml>,
    #[serde(skip_serializing_if = "Option::is_none")]
    sensitivity: Option<&'static str>,
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct ColumnYaml {
    name: String,
    json_path: String,
}

fn yaml<T: Serialize>(value: &T) -> String {
    serde_norway::to_string(value).unwrap_or_default()
}

fn item(
    namespace: &'static str,
    resource_type: &'static str,
    id: impl Into<String>,
    yaml: String,
    proto: Vec<u8>,
) -> Item {
    Item {
        namespace,
        resource_type,
        id: id.into(),
        yaml,
        proto,
        annotations: Vec::new(),
    }
}

fn meta_items() -> Vec<Item> {
    let mut items = Vec::new();
    for def in TYPES {
        let (aliases, all_aliases) = aliases(def);
        let columns = def.columns.iter().map(|(n, p)| ColumnYaml {
            name: n.to_string(),
            json_path: p.to_string(),
        });
        let spec = RdYaml {
            resource_type: def.resource_type.into(),
            display_type: def.display.into(),
            default_namespace: def.namespace.into(),
            aliases: aliases.clone(),
            all_aliases: all_aliases.clone(),
            print_columns: columns.collect(),
            sensitivity: def.sensitive.then_some("sensitive"),
        };
        let proto = meta_pb::ResourceDefinitionSpec {
            resource_type: def.resource_type.into(),
            display_type: def.display.into(),
            default_namespace: def.namespace.into(),
            aliases,
            all_aliases,
            print_columns: def
                .columns
                .iter()
                .map(|(n, p)| meta_pb::resource_definition_spec::PrintColumn {
                    name: n.to_string(),
                    json_path: p.to_string(),
                })
                .collect(),
            sensitivity: i32::from(def.sensitive),
        };
        items.push(item(
            t::META_NAMESPACE,
            t::RESOURCE_DEFINITION,
            def.resource_type.to_lowercase(),
            yaml(&spec),
            proto.encode_to_vec(),
        ));
    }
    for (ns, description) in NAMESPACES {
        #[derive(Serialize)]
        struct Ns<'a> {
            description: &'a str,
        }
        let proto = meta_pb::NamespaceSpec {
            description: description.to_string(),
        };
        items.push(item(
            t::META_NAMESPACE,
            "Namespaces.meta.cosi.dev",
            *ns,
            yaml(&Ns { description }),
            proto.encode_to_vec(),
        ));
    }
    items
}

fn machine_config(id: &str, config: &str) -> Item {
    let proto = defs::MachineConfigSpec {
        yaml_marshalled: config.as_bytes().to_vec(),
    };
    let mut item = item(
        t::CONFIG_NAMESPACE,
        t::MACHINE_CONFIG,
        id,
        yaml(&config),
        proto.encode_to_vec(),
    );
    // Marks the YAML spec as the configuration in a string
    // (resources/config/machine_config.go).
    item.annotations
        .push(("talos.dev/yaml-spec".into(), "1".into()));
    item
}

/// What the node's etcd looks like now: running, and its member id when it
/// answers.
pub(crate) async fn etcd_state(node: &Node) -> (bool, Option<u64>) {
    if !node.is_control_plane() || !node.etcd_running().await {
        return (false, None);
    }
    let status =
        tokio::time::timeout(Duration::from_secs(1), crate::machined_etcd::status(node)).await;
    (true, status.ok().and_then(Result::ok).map(|s| s.member_id))
}

fn runtime_items(node: &Node, etcd: (bool, Option<u64>)) -> Vec<Item> {
    let mut items = Vec::new();
    let healthy = etcd.1.is_some();
    let unmet: Vec<defs::UnmetCondition> = if node.is_control_plane() && !healthy {
        vec![defs::UnmetCondition {
            name: "services".into(),
            reason: "some services are not healthy: etcd".into(),
        }]
    } else {
        Vec::new()
    };
    // A node on its way down shows the stage it entered (upstream's
    // MachineStatusController follows the sequencer); else running.
    let stage = node
        .runtime_events
        .stage()
        .and_then(|n| defs::MachineStage::try_from(n).ok())
        .filter(|s| {
            matches!(
                s,
                defs::MachineStage::Rebooting
                    | defs::MachineStage::ShuttingDown
                    | defs::MachineStage::Resetting
                    | defs::MachineStage::Upgrading
            )
        })
        .unwrap_or(defs::MachineStage::Running);
    let stage_name = match stage {
        defs::MachineStage::Rebooting => "rebooting",
        defs::MachineStage::ShuttingDown => "shutting down",
        defs::MachineStage::Resetting => "resetting",
        defs::MachineStage::Upgrading => "upgrading",
        _ => "running",
    };
    let status = defs::MachineStatusSpec {
        stage: stage as i32,
        status: Some(defs::MachineStatusStatus {
            ready: unmet.is_empty(),
            unmet_conditions: unmet.clone(),
        }),
    };
    let unmet_yaml: Vec<_> = unmet
        .iter()
        .map(|u| serde_json::json!({"name": u.name, "reason": u.reason}))
        .collect();
    let status_yaml = serde_json::json!({"stage": stage_name, "status": {"ready": unmet.is_empty(), "unmetConditions": unmet_yaml}});
    items.push(item(
        t::RUNTIME_NAMESPACE,
        t::MACHINE_STATUS,
        "machine",
        yaml(&status_yaml),
        status.encode_to_vec(),
    ));
    let version = defs::VersionSpec {
        version: crate::SIMULATED_TALOS_VERSION.into(),
        name: "Talos".into(),
    };
    let version_yaml =
        serde_json::json!({"name": "Talos", "version": crate::SIMULATED_TALOS_VERSION});
    items.push(item(
        t::RUNTIME_NAMESPACE,
        t::VERSION,
        "version",
        yaml(&version_yaml),
        version.encode_to_vec(),
    ));
    let mut services = vec![
        ("apid", true, true),
        ("machined", true, true),
        ("trustd", true, true),
    ];
    if node.is_control_plane() && etcd.0 {
        services.push(("etcd", true, healthy));
    }
    for (id, running, healthy) in services {
        let spec = defs::ServiceSpec {
            running,
            healthy,
            unknown: false,
        };
        let y = serde_json::json!({"running": running, "healthy": healthy, "unknown": false});
        items.push(item(
            t::RUNTIME_NAMESPACE,
            t::SERVICE,
            id,
            yaml(&y),
            spec.encode_to_vec(),
        ));
    }
    // A 1.14 node has etcd's own volume, ETCD, too.
    // IMAGECACHE only while the image cache is enabled.
    let cache = crate::node::image_cache_enabled(&node.active_config());
    for (i, label) in system_volumes(node.talos_version()).iter().enumerate() {
        if *label == "IMAGECACHE" && !cache {
            continue;
        }
        let y = serde_json::json!({"phase": "ready", "type": "partition", "location": format!("/dev/sda{}", i + 3), "prettySize": "1.0 GB"});
        let spec = defs::VolumeStatusSpec {
            phase: 6,
            location: format!("/dev/sda{}", i + 3),
            pretty_size: "1.0 GB".into(),
            ..Default::default()
        };
        items.push(item(
            t::RUNTIME_NAMESPACE,
            t::VOLUME_STATUS,
            *label,
            yaml(&y),
            spec.encode_to_vec(),
        ));
    }
    if let Some(id) = etcd.1 {
        let hex = format!("{id:016x}");
        let spec = defs::EtcdMemberSpec {
            member_id: hex.clone(),
        };
        items.push(item(
            t::ETCD_NAMESPACE,
            t::ETCD_MEMBER,
            "local",
            yaml(&serde_json::json!({"memberID": hex})),
            spec.encode_to_vec(),
        ));
    }
    items
}

fn member_item(node: &Node) -> Item {
    let machine_type = if node.is_control_plane() {
        "controlplane"
    } else {
        "worker"
    };
    let os = format!("Talos ({})", crate::SIMULATED_TALOS_VERSION);
    let node_id = node.node_id().unwrap_or_default();
    let mut y = serde_json::json!({"nodeId": node_id, "addresses": [node.ip.to_string()], "hostname": node.name, "machineType": machine_type, "operatingSystem": os});
    let mut spec = defs::ClusterMemberSpec {
        node_id,
        addresses: vec![defs::NetIp {
            ip: node.ip.octets().to_vec(),
        }],
        hostname: node.name.clone(),
        machine_type: if node.is_control_plane() {
            defs::MachineType::TypeControlPlane
        } else {
            defs::MachineType::TypeWorker
        } as i32,
        operating_system: os,
        control_plane: None,
    };
    if node.is_control_plane() {
        spec.control_plane = Some(defs::ControlPlane {
            api_server_port: 6443,
        });
        y["controlPlane"] = serde_json::json!({"apiServerPort": 6443});
    }
    item(
        t::CLUSTER_NAMESPACE,
        t::CLUSTER_MEMBER,
        node.name.clone(),
        yaml(&y),
        spec.encode_to_vec(),
    )
}

fn address_item(link: &str, ip: std::net::Ipv4Addr, prefix: u8) -> Item {
    let address = format!("{ip}/{prefix}");
    let y = serde_json::json!({"address": address, "local": ip.to_string(), "linkIndex": 2, "linkName": link, "family": "inet4", "scope": "global", "flags": "permanent", "priority": 0});
    let spec = defs::AddressStatusSpec {
        address: Some(defs::NetIpPrefix {
            ip: ip.octets().to_vec(),
            prefix_length: i32::from(prefix),
        }),
        local: Some(defs::NetIp {
            ip: ip.octets().to_vec(),
        }),
        link_index: 2,
        link_name: link.into(),
        family: 2,
        scope: 0,
        flags: 0x80,
        ..Default::default()
    };
    item(
        t::NETWORK_NAMESPACE,
        t::ADDRESS_STATUS,
        format!("{link}/{address}"),
        yaml(&y),
        spec.encode_to_vec(),
    )
}

/// The Layer-2 VIPs a configuration asks for: (address, link) of each
/// `Layer2VIPConfig` document (pkg/machinery/config/types/network/layer2_vip.go).
pub(crate) fn layer2_vips(config: &str) -> Vec<(std::net::Ipv4Addr, String)> {
    use serde::Deserialize as _;
    serde_norway::Deserializer::from_str(config)
        .filter_map(|doc| serde_norway::Value::deserialize(doc).ok())
        .filter(|doc| doc.get("kind").and_then(|k| k.as_str()) == Some("Layer2VIPConfig"))
        .filter_map(|doc| {
            let ip = doc.get("name")?.as_str()?.parse().ok()?;
            let link = doc.get("link").and_then(|l| l.as_str()).unwrap_or("eth0");
            Some((ip, link.to_string()))
        })
        .collect()
}

/// Which node holds each VIP: (cluster directory, VIP) -> node name. Like
/// upstream's VIP operator (an etcd election among control-plane nodes),
/// the holder keeps it while it stays eligible; otherwise the first
/// eligible node takes it.
static HOLDERS: Mutex<Vec<(std::path::PathBuf, std::net::Ipv4Addr, String)>> =
    Mutex::new(Vec::new());

/// The links a simulated node has besides `lo`.
pub(crate) const LINKS: &[&str] = &["eth0"];

/// Whether `node` may hold `vip`: a powered control-plane node whose etcd
/// runs and whose active configuration asks for the VIP on a link it has
/// (upstream's VIP operator runs on the named link and never starts on a
/// missing one: internal/app/machined/pkg/controllers/network/operator/vip.go).
async fn eligible(node: &Node, vip: std::net::Ipv4Addr) -> bool {
    node.is_control_plane()
        && node.power() == Power::On
        && node.etcd_running().await
        && layer2_vips(&node.active_config())
            .iter()
            .any(|(ip, link)| *ip == vip && LINKS.contains(&link.as_str()))
}

/// The name of the node holding `vip` now, electing a new holder if needed.
pub(crate) async fn vip_holder(shared: &Arc<Shared>, vip: std::net::Ipv4Addr) -> Option<String> {
    let cluster = shared.cfg.dir.clone();
    let mut candidates = Vec::new();
    for n in shared.nodes() {
        if eligible(&n, vip).await {
            candidates.push(n.name.clone());
        }
    }
    let mut holders = HOLDERS.lock().expect("vip holders");
    let current = holders
        .iter()
        .position(|(dir, ip, _)| *dir == cluster && *ip == vip);
    if let Some(i) = current {
        if candidates.contains(&holders[i].2) {
            return Some(holders[i].2.clone());
        }
        holders.remove(i);
    }
    let first = candidates.into_iter().next()?;
    holders.push((cluster, vip, first.clone()));
    Some(first)
}

/// Every resource of `node` now.
pub(crate) async fn snapshot(shared: &Arc<Shared>, node: &Arc<Node>) -> Vec<Item> {
    let mut items = meta_items();
    if !node.is_configured() {
        return items;
    }
    let active = node.active_config();
    if !active.is_empty() {
        items.push(machine_config("v1alpha1", &active));
    }
    if let Some(persisted) = node.persisted_config() {
        items.push(machine_config("persistent", &persisted));
    }
    if let Some(node_id) = node.node_id() {
        items.push(item(
            t::CLUSTER_NAMESPACE,
            t::IDENTITY,
            "local",
            yaml(&serde_json::json!({"nodeId": node_id})),
            defs::IdentitySpec { node_id }.encode_to_vec(),
        ));
    }
    let etcd = etcd_state(node).await;
    items.extend(runtime_items(node, etcd));
    for peer in shared.nodes() {
        if peer.is_configured() {
            items.push(member_item(&peer));
        }
    }
    items.push(address_item("lo", std::net::Ipv4Addr::LOCALHOST, 8));
    items.push(address_item("eth0", node.ip, 24));
    for (vip, link) in layer2_vips(&active) {
        if vip_holder(shared, vip).await.as_deref() == Some(node.name.as_str()) {
            items.push(address_item(&link, vip, 32));
        }
    }
    items
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn aliases_follow_the_runtime_rules() {
        let (short, all) = aliases(definition(t::MACHINE_CONFIG).unwrap());
        assert_eq!(short, ["machineconfig", "mc", "mcs"]);
        assert!(all.contains(&"machineconfigs.config.talos".to_string()));
        let (short, all) = aliases(definition(t::CLUSTER_MEMBER).unwrap());
        assert_eq!(short, ["member"]);
        assert!(all.contains(&"members".to_string()));
        let (_, all) = aliases(definition(t::ETCD_MEMBER).unwrap());
        assert!(all.contains(&"etcdmembers".to_string()));
    }

    #[test]
    fn vips_come_from_layer2_vip_documents() {
        let config = "version: v1alpha1\n---\napiVersion: v1alpha1\nkind: Layer2VIPConfig\nname: 10.5.0.50\nlink: eth1\n";
        assert_eq!(
            layer2_vips(config),
            vec![("10.5.0.50".parse().unwrap(), "eth1".to_string())]
        );
        assert!(layer2_vips("version: v1alpha1\n").is_empty());
    }
}
