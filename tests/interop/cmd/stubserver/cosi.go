package main

import (
	"context"
	"fmt"
	"net/netip"

	cosiv1alpha1 "github.com/cosi-project/runtime/api/v1alpha1"
	"github.com/cosi-project/runtime/pkg/resource"
	"github.com/cosi-project/runtime/pkg/resource/meta"
	"github.com/cosi-project/runtime/pkg/state"
	"github.com/cosi-project/runtime/pkg/state/impl/inmem"
	"github.com/cosi-project/runtime/pkg/state/impl/namespaced"
	"github.com/cosi-project/runtime/pkg/state/protobuf/server"
	"github.com/cosi-project/runtime/pkg/state/registry"
	"github.com/siderolabs/talos/pkg/machinery/config/configloader"
	"github.com/siderolabs/talos/pkg/machinery/config/machine"
	"github.com/siderolabs/talos/pkg/machinery/nethelpers"
	"github.com/siderolabs/talos/pkg/machinery/resources/cluster"
	"github.com/siderolabs/talos/pkg/machinery/resources/config"
	"github.com/siderolabs/talos/pkg/machinery/resources/network"
	"github.com/siderolabs/talos/pkg/machinery/resources/runtime"
	"google.golang.org/grpc"
)

// The machine configurations the COSI state holds (the Rust test expects
// these exact bytes back).
const (
	cosiActiveConfig     = "version: v1alpha1\nmachine:\n    type: controlplane\ncluster:\n    clusterName: interop-active\n"
	cosiPersistentConfig = "version: v1alpha1\nmachine:\n    type: controlplane\ncluster:\n    clusterName: interop-saved\n"
)

// registerCOSI serves cosi.resource.State with cosi-project/runtime's own
// protobuf state server over an in-memory state holding upstream Talos's
// resource types (their definitions registered by runtime's registry), so
// our client decodes what upstream's code encodes.
func registerCOSI(ctx context.Context, grpcServer *grpc.Server) error {
	st := state.WrapCore(namespaced.NewState(inmem.Build))

	resources := registry.NewResourceRegistry(st)
	if err := resources.RegisterDefault(ctx); err != nil {
		return err
	}

	for _, r := range []meta.ResourceWithRD{
		&config.MachineConfig{}, runtime.NewMachineStatus(),
		cluster.NewMember(cluster.NamespaceName, ""), network.NewAddressStatus(network.NamespaceName, ""),
	} {
		if err := resources.Register(ctx, r); err != nil {
			return err
		}
	}

	items, err := cosiResources()
	if err != nil {
		return err
	}

	for _, r := range items {
		if err = st.Create(ctx, r); err != nil {
			return fmt.Errorf("create %s: %w", r.Metadata(), err)
		}
	}

	cosiv1alpha1.RegisterStateServer(grpcServer, server.NewState(st))

	return nil
}

func cosiResources() ([]resource.Resource, error) {
	active, err := configloader.NewFromBytes([]byte(cosiActiveConfig))
	if err != nil {
		return nil, err
	}

	persistent, err := configloader.NewFromBytes([]byte(cosiPersistentConfig))
	if err != nil {
		return nil, err
	}

	status := runtime.NewMachineStatus()
	status.TypedSpec().Stage = runtime.MachineStageBooting
	status.TypedSpec().Status.Ready = false
	status.TypedSpec().Status.UnmetConditions = []runtime.UnmetCondition{
		{Name: "etcd", Reason: "service not healthy"},
	}

	member := cluster.NewMember(cluster.NamespaceName, "stub-cp-1")
	*member.TypedSpec() = cluster.MemberSpec{
		NodeID:          "n0d3-1d",
		Addresses:       []netip.Addr{netip.MustParseAddr("10.20.30.40"), netip.MustParseAddr("fd00::40")},
		Hostname:        "stub-cp-1",
		MachineType:     machine.TypeControlPlane,
		OperatingSystem: "Talos (v1.13.9)",
		ControlPlane:    &cluster.ControlPlane{APIServerPort: 6443},
	}

	vip := network.NewAddressStatus(network.NamespaceName, "eth0/10.20.30.50/32")
	*vip.TypedSpec() = network.AddressStatusSpec{
		Address:   netip.MustParsePrefix("10.20.30.50/32"),
		Local:     netip.MustParseAddr("10.20.30.50"),
		LinkIndex: 2,
		LinkName:  "eth0",
		Family:    nethelpers.FamilyInet4,
		Scope:     nethelpers.ScopeGlobal,
		Flags:     nethelpers.AddressFlags(nethelpers.AddressPermanent),
	}

	return []resource.Resource{
		config.NewMachineConfigWithID(active, config.ActiveID),
		config.NewMachineConfigWithID(persistent, config.PersistentID),
		status, member, vip,
	}, nil
}
