package main

import (
	"context"
	"fmt"
	"slices"
	"strings"

	"github.com/cosi-project/runtime/pkg/resource"
	"github.com/cosi-project/runtime/pkg/safe"
	"github.com/siderolabs/talos/pkg/machinery/client"
	"github.com/siderolabs/talos/pkg/machinery/config/machine"
	"github.com/siderolabs/talos/pkg/machinery/resources/cluster"
	"github.com/siderolabs/talos/pkg/machinery/resources/config"
	"github.com/siderolabs/talos/pkg/machinery/resources/network"
	"github.com/siderolabs/talos/pkg/machinery/resources/runtime"
	"google.golang.org/grpc/codes"
)

// The COSI checks: upstream's client.COSI, with upstream's resource types
// registered (the imports above), reads talos-sim's resources through
// apid's `node` routing and decodes their protobuf specs as it would a real
// node's.

func (d *driver) cosiMachineConfig(ctx context.Context) error {
	for i, ip := range d.ips {
		nodeCtx := client.WithNode(ctx, ip)

		for _, id := range []resource.ID{config.ActiveID, config.PersistentID} {
			mc, err := safe.StateGetByID[*config.MachineConfig](nodeCtx, d.c.COSI, id)
			if err != nil {
				return fmt.Errorf("node %s: MachineConfig %s: %w", ip, id, err)
			}

			if name := mc.Config().Cluster().Name(); name != "talos-sim" {
				return fmt.Errorf("node %s: MachineConfig %s has cluster name %q", ip, id, name)
			}

			if mc.Config().Machine().Type() != machine.TypeControlPlane {
				return fmt.Errorf("node %s (%s): machine type %s", ip, d.names[i], mc.Config().Machine().Type())
			}
		}
	}

	if d.reader == nil {
		return nil
	}

	// MachineConfig is sensitive: a reader is refused (access.go).
	_, err := safe.StateGetByID[*config.MachineConfig](client.WithNode(ctx, d.ips[0]), d.reader.COSI, config.ActiveID)

	return expect(client.StatusCode(err) == codes.PermissionDenied, "reader MachineConfig: %v, want PermissionDenied", err)
}

func (d *driver) cosiMachineStatus(ctx context.Context) error {
	for _, ip := range d.ips {
		ms, err := safe.StateGetByID[*runtime.MachineStatus](client.WithNode(ctx, ip), d.c.COSI, runtime.MachineStatusID)
		if err != nil {
			return fmt.Errorf("node %s: %w", ip, err)
		}

		spec := ms.TypedSpec()
		if spec.Stage != runtime.MachineStageRunning || !spec.Status.Ready || len(spec.Status.UnmetConditions) != 0 {
			return fmt.Errorf("node %s: machine status %+v", ip, *spec)
		}
	}

	return nil
}

func (d *driver) cosiMembers(ctx context.Context) error {
	members, err := safe.StateListAll[*cluster.Member](client.WithNode(ctx, d.ips[1]), d.c.COSI)
	if err != nil {
		return err
	}

	var hostnames []string

	for m := range members.All() {
		spec := m.TypedSpec()
		hostnames = append(hostnames, spec.Hostname)

		i := slices.Index(d.names, spec.Hostname)
		if i < 0 || len(spec.Addresses) != 1 || spec.Addresses[0].String() != d.ips[i] {
			return fmt.Errorf("member %s: addresses %v", spec.Hostname, spec.Addresses)
		}

		if spec.MachineType != machine.TypeControlPlane || !strings.HasPrefix(spec.OperatingSystem, "Talos (") {
			return fmt.Errorf("member %s: %+v", spec.Hostname, *spec)
		}
	}

	slices.Sort(hostnames)

	return expect(slices.Equal(hostnames, d.names), "members %v, want %v", hostnames, d.names)
}

func (d *driver) cosiAddresses(ctx context.Context) error {
	for _, ip := range d.ips {
		addresses, err := safe.StateListAll[*network.AddressStatus](client.WithNode(ctx, ip), d.c.COSI)
		if err != nil {
			return fmt.Errorf("node %s: %w", ip, err)
		}

		found := false

		for a := range addresses.All() {
			if a.TypedSpec().Address.Addr().String() == ip && a.TypedSpec().LinkName != "" {
				found = true
			}
		}

		if !found {
			return fmt.Errorf("node %s: its address is not among its address statuses", ip)
		}
	}

	return nil
}
