//! Typed views of the COSI resources the operations read, decoded from the
//! YAML spec every node sends (field names as upstream's Go specs tag them
//! under siderolabs/talos pkg/machinery/resources), or from the protobuf
//! spec where the YAML alone is not faithful (machine configuration,
//! resource definitions).

use std::net::IpAddr;

use serde::Deserialize;

use super::resources::{Resource, Resources, decode_proto};
use super::{MemberId, Result, Scope};
use crate::api::cosi::resource::meta as meta_pb;
use crate::api::talos::resource::definitions as defs;

/// Namespaces and type names of the resources this module reads
/// (upstream's constants, siderolabs/talos v1.13.9).
pub mod types {
    /// COSI's own namespace: namespaces and resource definitions.
    pub const META_NAMESPACE: &str = "meta";
    /// The definitions of resource types.
    pub const RESOURCE_DEFINITION: &str = "ResourceDefinitions.meta.cosi.dev";
    /// Namespace of machine configurations.
    pub const CONFIG_NAMESPACE: &str = "config";
    /// Machine configuration (ids `v1alpha1`, `persistent`); sensitive.
    pub const MACHINE_CONFIG: &str = "MachineConfigs.config.talos.dev";
    /// Namespace of runtime state: machine status, version, services,
    /// volumes.
    pub const RUNTIME_NAMESPACE: &str = "runtime";
    /// Machine status (id `machine`).
    pub const MACHINE_STATUS: &str = "MachineStatuses.runtime.talos.dev";
    /// Talos version (id `version`).
    pub const VERSION: &str = "Versions.runtime.talos.dev";
    /// System services (namespace `runtime`).
    pub const SERVICE: &str = "Services.v1alpha1.talos.dev";
    /// Namespace of etcd resources.
    pub const ETCD_NAMESPACE: &str = "etcd";
    /// The node's own etcd member (id `local`), while etcd runs.
    pub const ETCD_MEMBER: &str = "EtcdMembers.etcd.talos.dev";
    /// Namespace of cluster discovery.
    pub const CLUSTER_NAMESPACE: &str = "cluster";
    /// Cluster members as discovery sees them.
    pub const CLUSTER_MEMBER: &str = "Members.cluster.talos.dev";
    /// The node's identity (id `local`), in [`CLUSTER_NAMESPACE`].
    pub const IDENTITY: &str = "Identities.cluster.talos.dev";
    /// Namespace of network resources.
    pub const NETWORK_NAMESPACE: &str = "network";
    /// Addresses on the node's links (a Layer-2 VIP among them while held).
    pub const ADDRESS_STATUS: &str = "AddressStatuses.net.talos.dev";
    /// Volumes (namespace `runtime`).
    pub const VOLUME_STATUS: &str = "VolumeStatuses.block.talos.dev";
}

/// A resource type as the node defines it (`talosctl get rd`).
#[derive(Debug, Clone, PartialEq, Eq, Default, serde::Serialize)]
#[non_exhaustive]
pub struct ResourceDefinition {
    /// Id: the type in lower case.
    pub id: String,
    /// The type, e.g. `MachineStatuses.runtime.talos.dev`.
    pub resource_type: String,
    /// Singular name for display, e.g. `MachineStatus`.
    pub display_type: String,
    /// Where resources of this type live unless told otherwise.
    pub default_namespace: String,
    /// Short names shown to users.
    pub aliases: Vec<String>,
    /// Every name the type matches.
    pub all_aliases: Vec<String>,
    /// Extra table columns: name and JSONPath into the spec.
    pub print_columns: Vec<(String, String)>,
    /// Whether only `os:admin` may read it.
    pub sensitive: bool,
}

impl ResourceDefinition {
    pub(crate) fn decode(r: &Resource) -> Result<ResourceDefinition> {
        let spec: meta_pb::ResourceDefinitionSpec = match decode_proto(r)? {
            Some(spec) => spec,
            None => return Err(r.bad_spec("no protobuf spec")),
        };
        Ok(ResourceDefinition {
            id: r.metadata.id.clone(),
            resource_type: spec.resource_type,
            display_type: spec.display_type,
            default_namespace: spec.default_namespace,
            aliases: spec.aliases,
            all_aliases: spec.all_aliases,
            print_columns: spec
                .print_columns
                .into_iter()
                .map(|c| (c.name, c.json_path))
                .collect(),
            sensitive: spec.sensitivity
                == meta_pb::resource_definition_spec::Sensitivity::Sensitive as i32,
        })
    }
}

/// Which machine configuration to read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ConfigId {
    /// `v1alpha1`: the configuration the node runs (a TRY's while it is
    /// pending).
    Active,
    /// `persistent`: the one saved for the next boot (ahead after a STAGED
    /// apply, behind during a TRY).
    Persistent,
}

impl ConfigId {
    /// The resource id.
    pub fn id(self) -> &'static str {
        match self {
            ConfigId::Active => "v1alpha1",
            ConfigId::Persistent => "persistent",
        }
    }
}

/// A machine configuration resource.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
#[non_exhaustive]
pub struct MachineConfig {
    /// `v1alpha1` or `persistent`.
    pub id: String,
    /// The resource version (changes with every apply that touches it).
    pub version: String,
    /// The configuration documents, as the node holds them.
    pub yaml: String,
}

impl MachineConfig {
    /// Decodes a `MachineConfigs.config.talos.dev` resource: the protobuf
    /// spec holds the submitted bytes; without it, the YAML spec is the
    /// configuration as a string (marked by the `talos.dev/yaml-spec`
    /// annotation) or, from old nodes, the document itself
    /// (pkg/machinery/resources/config/machine_config.go).
    pub fn decode(r: &Resource) -> Result<MachineConfig> {
        let yaml = match decode_proto::<defs::MachineConfigSpec>(r)? {
            Some(spec) => String::from_utf8(spec.yaml_marshalled).map_err(|e| r.bad_spec(e))?,
            None if r.metadata.annotations.contains_key("talos.dev/yaml-spec") => {
                r.decode_yaml::<String>()?
            }
            None => r.spec_yaml.clone(),
        };
        Ok(MachineConfig {
            id: r.metadata.id.clone(),
            version: r.metadata.version.clone(),
            yaml,
        })
    }
}

/// A condition that keeps a machine from being ready.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, serde::Serialize)]
#[non_exhaustive]
pub struct UnmetCondition {
    /// Name, e.g. `etcd`.
    pub name: String,
    /// Why.
    pub reason: String,
}

/// The machine's stage and readiness.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
#[non_exhaustive]
pub struct MachineStatus {
    /// `booting`, `running`, `rebooting`, `resetting`, ...
    pub stage: String,
    /// Whether every condition is met.
    pub ready: bool,
    /// What is not ready yet.
    pub unmet_conditions: Vec<UnmetCondition>,
}

#[derive(Deserialize)]
struct MachineStatusYaml {
    stage: String,
    status: MachineStatusStatusYaml,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct MachineStatusStatusYaml {
    ready: bool,
    #[serde(default)]
    unmet_conditions: Option<Vec<UnmetCondition>>,
}

/// The Talos version a node runs.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, serde::Serialize)]
#[non_exhaustive]
pub struct TalosVersion {
    /// e.g. `v1.13.9`.
    pub version: String,
    /// e.g. `Talos`.
    #[serde(default)]
    pub name: String,
}

/// A system service's state.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
#[non_exhaustive]
pub struct ServiceStatus {
    /// Service id (`etcd`, `apid`, ...).
    pub id: String,
    /// Whether it runs.
    pub running: bool,
    /// Whether its health check passes.
    pub healthy: bool,
    /// Whether its health is not known yet.
    pub unknown: bool,
}

#[derive(Deserialize)]
struct ServiceYaml {
    running: bool,
    healthy: bool,
    #[serde(default)]
    unknown: bool,
}

/// The node's own etcd member.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
#[non_exhaustive]
pub struct EtcdLocalMember {
    /// Its member id.
    pub member_id: MemberId,
}

#[derive(Deserialize)]
struct EtcdMemberYaml {
    #[serde(rename = "memberID")]
    member_id: String,
}

/// A cluster member as discovery sees it.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, serde::Serialize)]
#[serde(rename_all = "camelCase")]
#[non_exhaustive]
pub struct ClusterMember {
    /// Resource id (the hostname, usually).
    #[serde(skip_deserializing)]
    pub id: String,
    /// Discovery's node id.
    #[serde(default)]
    pub node_id: String,
    /// Its addresses.
    #[serde(default)]
    pub addresses: Vec<IpAddr>,
    /// Hostname.
    #[serde(default)]
    pub hostname: String,
    /// `controlplane`, `worker`, `init`, `unknown`.
    #[serde(default)]
    pub machine_type: String,
    /// e.g. `Talos (v1.13.9)`.
    #[serde(default)]
    pub operating_system: String,
}

/// An address on one of the node's links.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, serde::Serialize)]
#[serde(rename_all = "camelCase")]
#[non_exhaustive]
pub struct AddressStatus {
    /// Resource id, `link/address`.
    #[serde(skip_deserializing)]
    pub id: String,
    /// Address with prefix length, e.g. `10.5.0.2/24`.
    pub address: String,
    /// The link's name.
    #[serde(default)]
    pub link_name: String,
    /// `inet4` or `inet6`.
    #[serde(default)]
    pub family: String,
    /// `global`, `host`, `link`, ...
    #[serde(default)]
    pub scope: String,
}

impl AddressStatus {
    /// The address without its prefix length.
    pub fn ip(&self) -> Option<IpAddr> {
        self.address.split('/').next()?.parse().ok()
    }
}

/// The node's identity (`Identities.cluster.talos.dev`, id `local`): a
/// random id kept on the STATE partition, the same across reboots and new
/// after STATE is wiped. It tells one machine from another at one address.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, serde::Serialize)]
#[serde(rename_all = "camelCase")]
#[non_exhaustive]
pub struct NodeIdentity {
    /// The node id.
    pub node_id: String,
}

/// A volume.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, serde::Serialize)]
#[serde(rename_all = "camelCase")]
#[non_exhaustive]
pub struct VolumeStatus {
    /// Volume id, e.g. `STATE`, `EPHEMERAL`, `ETCD` (1.14).
    #[serde(skip_deserializing)]
    pub id: String,
    /// `ready`, `waiting`, `missing`, ...
    #[serde(default)]
    pub phase: String,
    /// `partition`, `disk`, `directory`, ...
    #[serde(default, rename = "type")]
    pub volume_type: String,
    /// The block device.
    #[serde(default)]
    pub location: String,
    /// Size for humans.
    #[serde(default)]
    pub pretty_size: String,
}

impl<S: Scope> Resources<S> {
    /// The machine configuration `which` (sensitive: `os:admin` only).
    pub async fn machine_config(&self, which: ConfigId) -> Result<S::Output<MachineConfig>> {
        self.per_node(|one| async move {
            let r = one
                .get_one(types::CONFIG_NAMESPACE, types::MACHINE_CONFIG, which.id())
                .await?;
            MachineConfig::decode(&r)
        })
        .await
    }

    /// The node's identity (NotFound in maintenance mode, where STATE is
    /// not in use).
    pub async fn node_identity(&self) -> Result<S::Output<NodeIdentity>> {
        self.per_node(|one| async move {
            let r = one
                .get_one(types::CLUSTER_NAMESPACE, types::IDENTITY, "local")
                .await?;
            r.decode_yaml()
        })
        .await
    }

    /// The machine's stage and readiness.
    pub async fn machine_status(&self) -> Result<S::Output<MachineStatus>> {
        self.per_node(|one| async move {
            let r = one
                .get_one(types::RUNTIME_NAMESPACE, types::MACHINE_STATUS, "machine")
                .await?;
            let spec: MachineStatusYaml = r.decode_yaml()?;
            Ok(MachineStatus {
                stage: spec.stage,
                ready: spec.status.ready,
                unmet_conditions: spec.status.unmet_conditions.unwrap_or_default(),
            })
        })
        .await
    }

    /// The Talos version (resource `version`).
    pub async fn version(&self) -> Result<S::Output<TalosVersion>> {
        self.per_node(|one| async move {
            one.get_one(types::RUNTIME_NAMESPACE, types::VERSION, "version")
                .await?
                .decode_yaml()
        })
        .await
    }

    /// The system services.
    pub async fn services(&self) -> Result<S::Output<Vec<ServiceStatus>>> {
        self.per_node(|one| async move {
            let items = one
                .list_one(types::RUNTIME_NAMESPACE, types::SERVICE)
                .await?;
            items
                .iter()
                .map(|r| {
                    let spec: ServiceYaml = r.decode_yaml()?;
                    Ok(ServiceStatus {
                        id: r.metadata.id.clone(),
                        running: spec.running,
                        healthy: spec.healthy,
                        unknown: spec.unknown,
                    })
                })
                .collect()
        })
        .await
    }

    /// The node's own etcd member id (NotFound while etcd is not running
    /// and healthy, as upstream).
    pub async fn etcd_member(&self) -> Result<S::Output<EtcdLocalMember>> {
        self.per_node(|one| async move {
            let r = one
                .get_one(types::ETCD_NAMESPACE, types::ETCD_MEMBER, "local")
                .await?;
            let spec: EtcdMemberYaml = r.decode_yaml()?;
            let member_id = spec.member_id.parse().map_err(|e| r.bad_spec(e))?;
            Ok(EtcdLocalMember { member_id })
        })
        .await
    }

    /// The cluster's members as discovery sees them.
    pub async fn cluster_members(&self) -> Result<S::Output<Vec<ClusterMember>>> {
        self.per_node(|one| async move {
            let items = one
                .list_one(types::CLUSTER_NAMESPACE, types::CLUSTER_MEMBER)
                .await?;
            with_ids(&items, |m: &mut ClusterMember, id| m.id = id)
        })
        .await
    }

    /// The addresses on the node's links.
    pub async fn address_statuses(&self) -> Result<S::Output<Vec<AddressStatus>>> {
        self.per_node(|one| async move {
            let items = one
                .list_one(types::NETWORK_NAMESPACE, types::ADDRESS_STATUS)
                .await?;
            with_ids(&items, |a: &mut AddressStatus, id| a.id = id)
        })
        .await
    }

    /// The node's volumes.
    pub async fn volume_statuses(&self) -> Result<S::Output<Vec<VolumeStatus>>> {
        self.per_node(|one| async move {
            let items = one
                .list_one(types::RUNTIME_NAMESPACE, types::VOLUME_STATUS)
                .await?;
            with_ids(&items, |v: &mut VolumeStatus, id| v.id = id)
        })
        .await
    }
}

/// Decodes every resource's YAML spec and sets its id.
fn with_ids<T: serde::de::DeserializeOwned>(
    items: &[Resource],
    set_id: impl Fn(&mut T, String),
) -> Result<Vec<T>> {
    items
        .iter()
        .map(|r| {
            let mut value: T = r.decode_yaml()?;
            set_id(&mut value, r.metadata.id.clone());
            Ok(value)
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use prost::Message as _;

    fn resource(id: &str, yaml: &str) -> Resource {
        let mut r = Resource {
            spec_yaml: yaml.into(),
            ..Resource::default()
        };
        r.metadata.id = id.into();
        r
    }

    #[test]
    fn machine_config_prefers_the_submitted_bytes() {
        let mut r = resource("v1alpha1", "|\n  other\n");
        r.spec_proto = defs::MachineConfigSpec {
            yaml_marshalled: b"version: v1alpha1\n".to_vec(),
        }
        .encode_to_vec();
        assert_eq!(
            MachineConfig::decode(&r).unwrap().yaml,
            "version: v1alpha1\n"
        );
        r.spec_proto.clear();
        r.metadata
            .annotations
            .insert("talos.dev/yaml-spec".into(), "1".into());
        assert_eq!(MachineConfig::decode(&r).unwrap().yaml, "other\n");
    }

    #[test]
    fn members_and_addresses_decode_from_upstream_yaml() {
        let r = resource(
            "cp-1",
            "nodeId: abc\naddresses:\n    - 10.5.0.2\nhostname: cp-1\nmachineType: controlplane\noperatingSystem: Talos (v1.13.9)\ncontrolPlane:\n    apiServerPort: 6443\n",
        );
        let members = with_ids(&[r], |m: &mut ClusterMember, id| m.id = id).unwrap();
        assert_eq!(
            members[0].addresses,
            vec!["10.5.0.2".parse::<IpAddr>().unwrap()]
        );
        assert_eq!(
            (members[0].id.as_str(), members[0].machine_type.as_str()),
            ("cp-1", "controlplane")
        );
        let a = resource(
            "eth0/10.5.0.10/32",
            "address: 10.5.0.10/32\nlocal: 10.5.0.10\nlinkIndex: 2\nlinkName: eth0\nfamily: inet4\nscope: global\nflags: permanent\npriority: 0\n",
        );
        let addresses = with_ids(&[a], |s: &mut AddressStatus, id| s.id = id).unwrap();
        assert_eq!(addresses[0].ip(), Some("10.5.0.10".parse().unwrap()));
        assert!(
            resource("x", "address: [")
                .decode_yaml::<AddressStatus>()
                .is_err()
        );
    }
}
