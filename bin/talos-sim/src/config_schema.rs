//! The shape upstream's decoder holds a machine configuration to: the keys
//! each section of the v1alpha1 document may carry, and the document kinds
//! each Talos release registers (the field names of
//! pkg/machinery/config/types/v1alpha1/v1alpha1_types.go, identical in
//! v1.13.9 and v1.14.0, and the kinds registered under
//! pkg/machinery/config/types at each tag). A section whose Go type has a
//! custom decoder, a map, or a type from another package accepts any keys
//! here, as it does upstream's unknown-key check for maps. Each section
//! lists its keys in the Go struct's declaration order, which is also the
//! order upstream's encoder writes them in (used for dry-run diffs).

/// What a key's value is checked against.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Field {
    /// Not checked further.
    Any,
    /// A section with known keys.
    Struct(&'static str),
    /// A list of such sections.
    Seq(&'static str),
}

use Field::{Any, Seq, Struct};

/// Every section of the v1alpha1 document and its keys; `Config` is the
/// document itself.
#[rustfmt::skip]
pub(crate) const V1ALPHA1: &[(&str, &[(&str, Field)])] = &[
    ("Config", &[("version", Any), ("debug", Any), ("persist", Any), ("machine", Struct("MachineConfig")), ("cluster", Struct("ClusterConfig"))]),
    ("MachineConfig", &[("type", Any), ("token", Any), ("ca", Any), ("acceptedCAs", Any), ("certSANs", Any), ("controlPlane", Struct("MachineControlPlaneConfig")), ("kubelet", Struct("KubeletConfig")), ("pods", Any), ("network", Struct("NetworkConfig")), ("disks", Seq("MachineDisk")), ("install", Struct("InstallConfig")), ("files", Seq("MachineFile")), ("env", Any), ("time", Struct("TimeConfig")), ("sysctls", Any), ("sysfs", Any), ("registries", Struct("RegistriesConfig")), ("systemDiskEncryption", Struct("SystemDiskEncryptionConfig")), ("features", Struct("FeaturesConfig")), ("udev", Struct("UdevConfig")), ("logging", Struct("LoggingConfig")), ("kernel", Struct("KernelConfig")), ("seccompProfiles", Seq("MachineSeccompProfile")), ("baseRuntimeSpecOverrides", Any), ("nodeLabels", Any), ("nodeAnnotations", Any), ("nodeTaints", Any)]),
    ("MachineSeccompProfile", &[("name", Any), ("value", Any)]),
    ("ClusterConfig", &[("id", Any), ("secret", Any), ("controlPlane", Struct("ControlPlaneConfig")), ("clusterName", Any), ("network", Struct("ClusterNetworkConfig")), ("token", Any), ("aescbcEncryptionSecret", Any), ("secretboxEncryptionSecret", Any), ("ca", Any), ("acceptedCAs", Any), ("aggregatorCA", Any), ("serviceAccount", Any), ("apiServer", Struct("APIServerConfig")), ("controllerManager", Struct("ControllerManagerConfig")), ("proxy", Struct("ProxyConfig")), ("scheduler", Struct("SchedulerConfig")), ("discovery", Struct("ClusterDiscoveryConfig")), ("etcd", Struct("EtcdConfig")), ("coreDNS", Struct("CoreDNS")), ("externalCloudProvider", Struct("ExternalCloudProviderConfig")), ("extraManifests", Any), ("extraManifestHeaders", Any), ("inlineManifests", Any), ("adminKubeconfig", Struct("AdminKubeconfigConfig")), ("allowSchedulingOnMasters", Any), ("allowSchedulingOnControlPlanes", Any)]),
    ("LinuxIDMapping", &[("containerID", Any), ("hostID", Any), ("size", Any)]),
    ("ExtraMount", &[("destination", Any), ("type", Any), ("source", Any), ("options", Any), ("uidMappings", Seq("LinuxIDMapping")), ("gidMappings", Seq("LinuxIDMapping"))]),
    ("MachineControlPlaneConfig", &[("controllerManager", Struct("MachineControllerManagerConfig")), ("scheduler", Struct("MachineSchedulerConfig"))]),
    ("MachineControllerManagerConfig", &[("disabled", Any)]),
    ("MachineSchedulerConfig", &[("disabled", Any)]),
    ("KubeletConfig", &[("image", Any), ("clusterDNS", Any), ("extraArgs", Any), ("extraMounts", Seq("ExtraMount")), ("extraConfig", Any), ("credentialProviderConfig", Any), ("defaultRuntimeSeccompProfileEnabled", Any), ("registerWithFQDN", Any), ("nodeIP", Struct("KubeletNodeIPConfig")), ("skipNodeRegistration", Any), ("disableManifestsDirectory", Any)]),
    ("KubeletNodeIPConfig", &[("validSubnets", Any)]),
    ("NetworkConfig", &[("hostname", Any), ("interfaces", Any), ("nameservers", Any), ("searchDomains", Any), ("extraHostEntries", Seq("ExtraHost")), ("kubespan", Struct("NetworkKubeSpan")), ("disableSearchDomain", Any)]),
    ("InstallConfig", &[("disk", Any), ("diskSelector", Struct("InstallDiskSelector")), ("extraKernelArgs", Any), ("image", Any), ("extensions", Seq("InstallExtensionConfig")), ("bootloader", Any), ("wipe", Any), ("legacyBIOSSupport", Any), ("grubUseUKICmdline", Any)]),
    ("InstallDiskSizeMatchData", &[]),
    ("InstallDiskSelector", &[("size", Any), ("name", Any), ("model", Any), ("serial", Any), ("modalias", Any), ("uuid", Any), ("wwid", Any), ("type", Any), ("busPath", Any)]),
    ("InstallExtensionConfig", &[("image", Any)]),
    ("TimeConfig", &[("disabled", Any), ("servers", Any), ("bootTimeout", Any)]),
    ("RegistriesConfig", &[("mirrors", Any), ("config", Any)]),
    ("PodCheckpointer", &[("image", Any)]),
    ("CoreDNS", &[("disabled", Any), ("image", Any)]),
    ("ControlPlaneConfig", &[("endpoint", Any), ("localAPIServerPort", Any)]),
    ("APIServerConfig", &[("image", Any), ("extraArgs", Any), ("extraVolumes", Seq("VolumeMountConfig")), ("env", Any), ("certSANs", Any), ("disablePodSecurityPolicy", Any), ("admissionControl", Any), ("auditPolicy", Any), ("resources", Struct("ResourcesConfig")), ("authorizationConfig", Any)]),
    ("AdmissionPluginConfig", &[("name", Any), ("configuration", Any)]),
    ("AuthorizationConfigAuthorizerConfig", &[("type", Any), ("name", Any), ("webhook", Any)]),
    ("ControllerManagerConfig", &[("image", Any), ("extraArgs", Any), ("extraVolumes", Seq("VolumeMountConfig")), ("env", Any), ("resources", Struct("ResourcesConfig"))]),
    ("ProxyConfig", &[("disabled", Any), ("image", Any), ("mode", Any), ("extraArgs", Any)]),
    ("SchedulerConfig", &[("image", Any), ("extraArgs", Any), ("extraVolumes", Seq("VolumeMountConfig")), ("env", Any), ("resources", Struct("ResourcesConfig")), ("config", Any)]),
    ("EtcdConfig", &[("image", Any), ("ca", Any), ("extraArgs", Any), ("subnet", Any), ("advertisedSubnets", Any), ("listenSubnets", Any)]),
    ("ClusterNetworkConfig", &[("cni", Struct("CNIConfig")), ("dnsDomain", Any), ("podSubnets", Any), ("serviceSubnets", Any)]),
    ("CNIConfig", &[("name", Any), ("urls", Any), ("flannel", Struct("FlannelCNIConfig"))]),
    ("FlannelCNIConfig", &[("extraArgs", Any), ("kubeNetworkPoliciesEnabled", Any)]),
    ("ExternalCloudProviderConfig", &[("enabled", Any), ("manifests", Any)]),
    ("AdminKubeconfigConfig", &[("certLifetime", Any)]),
    ("MachineDisk", &[("device", Any), ("partitions", Seq("DiskPartition"))]),
    ("DiskPartition", &[("size", Any), ("mountpoint", Any)]),
    ("EncryptionConfig", &[("provider", Any), ("keys", Seq("EncryptionKey")), ("cipher", Any), ("keySize", Any), ("blockSize", Any), ("options", Any)]),
    ("EncryptionKey", &[("static", Struct("EncryptionKeyStatic")), ("nodeID", Any), ("kms", Struct("EncryptionKeyKMS")), ("slot", Any), ("tpm", Struct("EncryptionKeyTPM"))]),
    ("EncryptionKeyStatic", &[("passphrase", Any)]),
    ("EncryptionKeyKMS", &[("endpoint", Any)]),
    ("EncryptionKeyTPM", &[("checkSecurebootStatusOnEnroll", Any)]),
    ("ResourcesConfig", &[("requests", Any), ("limits", Any)]),
    ("MachineFile", &[("content", Any), ("permissions", Any), ("path", Any), ("op", Any)]),
    ("ExtraHost", &[("ip", Any), ("aliases", Any)]),
    ("Device", &[("interface", Any), ("deviceSelector", Struct("NetworkDeviceSelector")), ("addresses", Any), ("cidr", Any), ("routes", Seq("Route")), ("bond", Struct("Bond")), ("bridge", Struct("Bridge")), ("bridgePort", Struct("BridgePort")), ("vlans", Any), ("mtu", Any), ("dhcp", Any), ("ignore", Any), ("dummy", Any), ("dhcpOptions", Struct("DHCPOptions")), ("wireguard", Struct("DeviceWireguardConfig")), ("vip", Struct("DeviceVIPConfig"))]),
    ("DHCPOptions", &[("routeMetric", Any), ("ipv4", Any), ("ipv6", Any), ("duidv6", Any)]),
    ("DeviceWireguardConfig", &[("privateKey", Any), ("listenPort", Any), ("firewallMark", Any), ("peers", Seq("DeviceWireguardPeer"))]),
    ("DeviceWireguardPeer", &[("publicKey", Any), ("endpoint", Any), ("persistentKeepaliveInterval", Any), ("allowedIPs", Any)]),
    ("DeviceVIPConfig", &[("ip", Any), ("equinixMetal", Struct("VIPEquinixMetalConfig")), ("hcloud", Struct("VIPHCloudConfig"))]),
    ("VIPEquinixMetalConfig", &[("apiToken", Any)]),
    ("VIPHCloudConfig", &[("apiToken", Any)]),
    ("Bond", &[("interfaces", Any), ("deviceSelectors", Seq("NetworkDeviceSelector")), ("arpIPTarget", Any), ("mode", Any), ("xmitHashPolicy", Any), ("lacpRate", Any), ("adActorSystem", Any), ("arpValidate", Any), ("arpAllTargets", Any), ("primary", Any), ("primaryReselect", Any), ("failOverMac", Any), ("adSelect", Any), ("miimon", Any), ("updelay", Any), ("downdelay", Any), ("arpInterval", Any), ("resendIgmp", Any), ("minLinks", Any), ("lpInterval", Any), ("packetsPerSlave", Any), ("numPeerNotif", Any), ("tlbDynamicLb", Any), ("allSlavesActive", Any), ("useCarrier", Any), ("adActorSysPrio", Any), ("adUserPortKey", Any), ("peerNotifyDelay", Any)]),
    ("STP", &[("enabled", Any)]),
    ("BridgeVLAN", &[("vlanFiltering", Any)]),
    ("Bridge", &[("interfaces", Any), ("stp", Struct("STP")), ("vlan", Struct("BridgeVLAN"))]),
    ("BridgePort", &[("master", Any)]),
    ("Vlan", &[("addresses", Any), ("cidr", Any), ("routes", Seq("Route")), ("dhcp", Any), ("vlanId", Any), ("mtu", Any), ("vip", Struct("DeviceVIPConfig")), ("dhcpOptions", Struct("DHCPOptions"))]),
    ("Route", &[("network", Any), ("gateway", Any), ("source", Any), ("metric", Any), ("mtu", Any)]),
    ("RegistryMirrorConfig", &[("endpoints", Any), ("overridePath", Any), ("skipFallback", Any)]),
    ("RegistryConfig", &[("tls", Struct("RegistryTLSConfig")), ("auth", Struct("RegistryAuthConfig"))]),
    ("RegistryAuthConfig", &[("username", Any), ("password", Any), ("auth", Any), ("identityToken", Any)]),
    ("RegistryTLSConfig", &[("clientIdentity", Any), ("ca", Any), ("insecureSkipVerify", Any)]),
    ("SystemDiskEncryptionConfig", &[("state", Struct("EncryptionConfig")), ("ephemeral", Struct("EncryptionConfig"))]),
    ("FeaturesConfig", &[("rbac", Any), ("stableHostname", Any), ("kubernetesTalosAPIAccess", Struct("KubernetesTalosAPIAccessConfig")), ("apidCheckExtKeyUsage", Any), ("diskQuotaSupport", Any), ("kubePrism", Struct("KubePrism")), ("hostDNS", Struct("HostDNSConfig")), ("imageCache", Struct("ImageCacheConfig")), ("nodeAddressSortAlgorithm", Any)]),
    ("KubePrism", &[("enabled", Any), ("port", Any)]),
    ("ImageCacheConfig", &[("localEnabled", Any)]),
    ("KubernetesTalosAPIAccessConfig", &[("enabled", Any), ("allowedRoles", Any), ("allowedKubernetesNamespaces", Any)]),
    ("HostDNSConfig", &[("enabled", Any), ("forwardKubeDNSToHost", Any), ("resolveMemberNames", Any)]),
    ("VolumeMountConfig", &[("hostPath", Any), ("mountPath", Any), ("readonly", Any)]),
    ("ClusterInlineManifest", &[("name", Any), ("contents", Any)]),
    ("NetworkKubeSpan", &[("enabled", Any), ("advertiseKubernetesNetworks", Any), ("allowDownPeerBypass", Any), ("harvestExtraEndpoints", Any), ("mtu", Any), ("filters", Struct("KubeSpanFilters"))]),
    ("KubeSpanFilters", &[("endpoints", Any), ("excludeAdvertisedNetworks", Any)]),
    ("NetworkDeviceSelector", &[("busPath", Any), ("hardwareAddr", Any), ("permanentAddr", Any), ("pciID", Any), ("driver", Any), ("physical", Any)]),
    ("ClusterDiscoveryConfig", &[("enabled", Any), ("registries", Struct("DiscoveryRegistriesConfig"))]),
    ("DiscoveryRegistriesConfig", &[("kubernetes", Struct("RegistryKubernetesConfig")), ("service", Struct("RegistryServiceConfig"))]),
    ("RegistryKubernetesConfig", &[("disabled", Any)]),
    ("RegistryServiceConfig", &[("disabled", Any), ("endpoint", Any)]),
    ("UdevConfig", &[("rules", Any)]),
    ("LoggingConfig", &[("destinations", Seq("LoggingDestination"))]),
    ("LoggingDestination", &[("endpoint", Any), ("format", Any), ("extraTags", Any)]),
    ("KernelConfig", &[("modules", Seq("KernelModuleConfig"))]),
    ("KernelModuleConfig", &[("name", Any), ("parameters", Any)]),
];

/// The keys of the other documents whose shape the simulator knows, named
/// by kind (the `yaml` tags of pkg/machinery/config/types/network/
/// layer2_vip.go and hcloud_vip.go, identical in v1.13.9 and v1.14.0, and
/// k8s/service_account.go at v1.14.0; `apiVersion` and `kind` are the
/// inline meta.Meta). A registered kind not listed here accepts any keys.
#[rustfmt::skip]
pub(crate) const DOCUMENTS: &[(&str, &[(&str, Field)])] = &[
    ("Layer2VIPConfig", &[("apiVersion", Any), ("kind", Any), ("name", Any), ("link", Any)]),
    ("HCloudVIPConfig", &[("apiVersion", Any), ("kind", Any), ("name", Any), ("link", Any), ("apiToken", Any)]),
    ("KubeServiceAccountConfig", &[("apiVersion", Any), ("kind", Any), ("issuer", Struct("IssuerServiceAccountConfig")), ("accepted", Struct("AcceptedServiceAccountConfig"))]),
    ("IssuerServiceAccountConfig", &[("privateKey", Any), ("issuerURL", Any)]),
    ("AcceptedServiceAccountConfig", &[("publicKeys", Any), ("issuers", Any), ("audiences", Any)]),
];

/// The section of documents of `kind`, when the simulator knows its keys.
pub(crate) fn document_section(kind: &str) -> Option<&'static str> {
    DOCUMENTS.iter().map(|(n, _)| *n).find(|n| *n == kind)
}

/// The keys of section `name` (of the v1alpha1 document or, by kind, of
/// another document).
pub(crate) fn section(name: &str) -> Option<&'static [(&'static str, Field)]> {
    V1ALPHA1
        .iter()
        .chain(DOCUMENTS)
        .find(|(n, _)| *n == name)
        .map(|(_, f)| *f)
}

/// Document kinds Talos v1.13.9 registers (besides the v1alpha1 document).
#[rustfmt::skip]
pub(crate) const KINDS_1_13_9: &[&str] = &[
    "BlackholeRouteConfig",
    "BondConfig",
    "BridgeConfig",
    "DHCPv4Config",
    "DHCPv6Config",
    "DummyLinkConfig",
    "EnvironmentConfig",
    "EthernetConfig",
    "EventSinkConfig",
    "ExistingVolumeConfig",
    "ExtensionServiceConfig",
    "ExternalVolumeConfig",
    "HCloudVIPConfig",
    "HostnameConfig",
    "ImageVerificationConfig",
    "KmsgLogConfig",
    "KubeSpanConfig",
    "KubeSpanEndpointsConfig",
    "Layer2VIPConfig",
    "LinkAliasConfig",
    "LinkConfig",
    "NetworkDefaultActionConfig",
    "NetworkRuleConfig",
    "OOMConfig",
    "PCIDriverRebindConfig",
    "RawVolumeConfig",
    "RegistryAuthConfig",
    "RegistryMirrorConfig",
    "RegistryTLSConfig",
    "ResolverConfig",
    "RoutingRuleConfig",
    "SideroLinkConfig",
    "StaticHostConfig",
    "SwapVolumeConfig",
    "TCPProbeConfig",
    "TimeSyncConfig",
    "TrustedRootsConfig",
    "UserVolumeConfig",
    "VLANConfig",
    "VRFConfig",
    "VolumeConfig",
    "WatchdogTimerConfig",
    "WireguardConfig",
    "ZswapConfig",
];

/// Document kinds Talos v1.14.0 registers (besides the v1alpha1 document).
#[rustfmt::skip]
pub(crate) const KINDS_1_14_0: &[&str] = &[
    "BGPInstanceConfig",
    "BlackholeRouteConfig",
    "BondConfig",
    "BridgeConfig",
    "CRIBaseRuntimeSpecConfig",
    "CRICustomizationConfig",
    "ContainerConfig",
    "DHCPv4Config",
    "DHCPv6Config",
    "DiscoveryIdentityConfig",
    "DiscoveryServiceConfig",
    "DummyLinkConfig",
    "EnvironmentConfig",
    "EtcFileConfig",
    "EthernetConfig",
    "EventSinkConfig",
    "ExistingVolumeConfig",
    "ExtensionServiceConfig",
    "ExternalVolumeConfig",
    "FilesystemScrubConfig",
    "FilesystemTrimConfig",
    "HCloudVIPConfig",
    "HTTPProbeConfig",
    "HostnameConfig",
    "ImageCacheConfig",
    "ImageVerificationConfig",
    "KernelModuleConfig",
    "KmsgLogConfig",
    "KubeAPIServerCAConfig",
    "KubeAPIServerConfig",
    "KubeAdmissionControlConfig",
    "KubeAggregatorCAConfig",
    "KubeAuditPolicyConfig",
    "KubeAuthenticationConfig",
    "KubeAuthorizerConfig",
    "KubeClusterConfig",
    "KubeControllerManagerConfig",
    "KubeCoreDNSConfig",
    "KubeCredentialProviderConfig",
    "KubeEtcdEncryptionConfig",
    "KubeExternalManifestConfig",
    "KubeFlannelCNIConfig",
    "KubeInlineManifestConfig",
    "KubeNetworkConfig",
    "KubeNodeConfig",
    "KubePrismConfig",
    "KubeProxyConfig",
    "KubeSchedulerConfig",
    "KubeServiceAccountConfig",
    "KubeSpanConfig",
    "KubeSpanEndpointsConfig",
    "KubeStaticPodConfig",
    "KubeTalosAPIAccessConfig",
    "KubeletConfig",
    "LVMLogicalVolumeConfig",
    "LVMVolumeGroupConfig",
    "Layer2VIPConfig",
    "LinkAliasConfig",
    "LinkConfig",
    "NetworkDefaultActionConfig",
    "NetworkRuleConfig",
    "OOMConfig",
    "PCIDriverRebindConfig",
    "RAIDArrayConfig",
    "RawVolumeConfig",
    "RegistryAuthConfig",
    "RegistryMirrorConfig",
    "RegistryTLSConfig",
    "ResolverConfig",
    "RoutingRuleConfig",
    "SecurityProfileConfig",
    "SideroLinkConfig",
    "StaticHostConfig",
    "SwapVolumeConfig",
    "SysctlConfig",
    "SysfsConfig",
    "TCPProbeConfig",
    "TimeSyncConfig",
    "TrustedRootsConfig",
    "UdevRulesConfig",
    "UnattendedInstallConfig",
    "UserVolumeConfig",
    "VLANConfig",
    "VRFConfig",
    "VethConfig",
    "VolumeConfig",
    "WatchdogTimerConfig",
    "WireguardConfig",
    "ZswapConfig",
];
