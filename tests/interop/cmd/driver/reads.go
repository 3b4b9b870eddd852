package main

import (
	"bytes"
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/siderolabs/talos/pkg/machinery/api/machine"
	"github.com/siderolabs/talos/pkg/machinery/client"
	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/types/known/emptypb"
)

// nameOf is the hostname of the node with address ip.
func (d *driver) nameOf(ip string) string {
	if i := slices.Index(d.ips, ip); i >= 0 {
		return d.names[i]
	}

	return "?" + ip
}

// byIP expects exactly one message per address in ips, keyed by
// metadata.hostname, which apid sets to the node as the caller named it.
func byIP[T any](ips []string, messages []T, hostname func(T) string) (map[string]T, error) {
	out := map[string]T{}

	for _, m := range messages {
		h := hostname(m)
		if _, dup := out[h]; dup {
			return nil, fmt.Errorf("two messages with metadata.hostname %q", h)
		}

		out[h] = m
	}

	got := slices.Sorted(maps.Keys(out))
	want := slices.Sorted(slices.Values(ips))

	if !slices.Equal(got, want) {
		return nil, fmt.Errorf("metadata.hostname values %q, want %q", got, want)
	}

	return out, nil
}

func (d *driver) versionContextNodes(ctx context.Context) error {
	// talosctl 1.13 sends the context's nodes as `nodes` metadata.
	resp, err := d.all.Version(client.WithNodes(ctx, d.context.Nodes...))
	if err != nil {
		return err
	}

	if len(resp.Messages) != 1 {
		return fmt.Errorf("%d messages, want 1", len(resp.Messages))
	}

	m := resp.Messages[0]

	return errors.Join(
		expect(m.GetMetadata().GetHostname() == d.ips[0], "metadata.hostname %q, want %q", m.GetMetadata().GetHostname(), d.ips[0]),
		expect(strings.HasPrefix(m.GetVersion().GetTag(), "v"), "version tag %q", m.GetVersion().GetTag()),
		expect(m.GetPlatform() != nil, "no platform"),
	)
}

func (d *driver) versionEachEndpoint(ctx context.Context) error {
	for i, endpoint := range d.context.Endpoints {
		c, err := client.New(ctx, client.WithConfig(d.cfg), client.WithEndpoints(endpoint))
		if err != nil {
			return err
		}

		resp, err := c.Version(ctx)
		if err == nil && (len(resp.Messages) != 1 || resp.Messages[0].GetMetadata().GetHostname() != "") {
			err = fmt.Errorf("local answer should be one message without metadata.hostname: %v", resp)
		}

		var host *machine.HostnameResponse
		if err == nil {
			host, err = client.FilterMessages(c.MachineClient.Hostname(ctx, &emptypb.Empty{}))
		}

		if err == nil && host.Messages[0].Hostname != d.names[i] {
			err = fmt.Errorf("hostname %q, want %q", host.Messages[0].Hostname, d.names[i])
		}

		c.Close() //nolint:errcheck

		if err != nil {
			return fmt.Errorf("endpoint %s: %w", endpoint, err)
		}
	}

	return nil
}

func (d *driver) versionNode(ctx context.Context) error {
	ctx = client.WithNode(ctx, d.ips[1])

	resp, err := d.c.Version(ctx)
	if err != nil {
		return err
	}

	if len(resp.Messages) != 1 || resp.Messages[0].GetMetadata().GetHostname() != "" {
		return fmt.Errorf("a one-to-one answer is one message passed on verbatim (no metadata.hostname): %v", resp)
	}

	host, err := client.FilterMessages(d.c.MachineClient.Hostname(ctx, &emptypb.Empty{}))
	if err != nil {
		return err
	}

	return expect(host.Messages[0].Hostname == d.names[1], "hostname %q, want %q", host.Messages[0].Hostname, d.names[1])
}

func (d *driver) hostnameNodes(ctx context.Context) error {
	resp, err := client.FilterMessages(d.c.MachineClient.Hostname(client.WithNodes(ctx, d.ips...), &emptypb.Empty{}))
	if err != nil {
		return err
	}

	byNode, err := byIP(d.ips, resp.Messages, func(m *machine.Hostname) string { return m.GetMetadata().GetHostname() })
	if err != nil {
		return err
	}

	for ip, m := range byNode {
		if m.Hostname != d.nameOf(ip) {
			return fmt.Errorf("node %s says hostname %q, want %q", ip, m.Hostname, d.nameOf(ip))
		}
	}

	return nil
}

func (d *driver) versionNodes(ctx context.Context) error {
	resp, err := d.c.Version(client.WithNodes(ctx, d.ips...))
	if err != nil {
		return err
	}

	byNode, err := byIP(d.ips, resp.Messages, func(m *machine.Version) string { return m.GetMetadata().GetHostname() })
	if err != nil {
		return err
	}

	tag := byNode[d.ips[0]].GetVersion().GetTag()
	for ip, m := range byNode {
		if m.GetVersion().GetTag() != tag || m.GetMetadata().GetError() != "" {
			return fmt.Errorf("node %s: %v", ip, m)
		}
	}

	return nil
}

func (d *driver) etcdMemberList(ctx context.Context) error {
	resp, err := d.c.EtcdMemberList(client.WithNodes(ctx, d.ips...), &machine.EtcdMemberListRequest{})
	if err != nil {
		return err
	}

	byNode, err := byIP(d.ips, resp.Messages, func(m *machine.EtcdMembers) string { return m.GetMetadata().GetHostname() })
	if err != nil {
		return err
	}

	for ip, m := range byNode {
		names := []string{}

		for _, member := range m.Members {
			names = append(names, member.Hostname)

			if known, ok := d.ids[member.Hostname]; ok && known != member.Id {
				return fmt.Errorf("node %s lists %s with id %x, another node with %x", ip, member.Hostname, member.Id, known)
			}

			d.ids[member.Hostname] = member.Id

			if member.Id == 0 || member.IsLearner || len(member.PeerUrls) == 0 || len(member.ClientUrls) == 0 {
				return fmt.Errorf("node %s: odd member %v", ip, member)
			}
		}

		slices.Sort(names)

		if !slices.Equal(names, slices.Sorted(slices.Values(d.names))) {
			return fmt.Errorf("node %s lists members %q, want %q", ip, names, d.names)
		}
	}

	local, err := d.c.EtcdMemberList(client.WithNode(ctx, d.ips[1]), &machine.EtcdMemberListRequest{QueryLocal: true})
	if err != nil {
		return fmt.Errorf("query_local: %w", err)
	}

	return expect(len(local.Messages) == 1 && len(local.Messages[0].Members) == len(d.names),
		"query_local answer: %v", local)
}

func (d *driver) etcdStatus(ctx context.Context) error {
	resp, err := d.c.EtcdStatus(client.WithNodes(ctx, d.ips...))
	if err != nil {
		return err
	}

	byNode, err := byIP(d.ips, resp.Messages, func(m *machine.EtcdStatus) string { return m.GetMetadata().GetHostname() })
	if err != nil {
		return err
	}

	leader := byNode[d.ips[0]].GetMemberStatus().GetLeader()

	for ip, m := range byNode {
		s := m.GetMemberStatus()

		switch {
		case s.GetMemberId() != d.ids[d.nameOf(ip)]:
			return fmt.Errorf("node %s reports member id %x, member list says %x", ip, s.GetMemberId(), d.ids[d.nameOf(ip)])
		case s.GetLeader() != leader || leader == 0:
			return fmt.Errorf("node %s sees leader %x, node %s sees %x", ip, s.GetLeader(), d.ips[0], leader)
		case s.GetDbSize() <= 0 || s.GetRaftIndex() == 0 || s.GetProtocolVersion() == "":
			return fmt.Errorf("node %s: implausible status %v", ip, s)
		}
	}

	return expect(slices.Contains(slices.Collect(maps.Values(d.ids)), leader), "leader %x is not a member", leader)
}

func (d *driver) etcdAlarmList(ctx context.Context) error {
	resp, err := d.c.EtcdAlarmList(client.WithNodes(ctx, d.ips...))
	if err != nil {
		return err
	}

	if _, err = byIP(d.ips, resp.Messages, func(m *machine.EtcdAlarm) string { return m.GetMetadata().GetHostname() }); err != nil {
		return err
	}

	for _, m := range resp.Messages {
		if len(m.MemberAlarms) != 0 {
			return fmt.Errorf("unexpected alarms %v", m.MemberAlarms)
		}
	}

	return nil
}

// checkSnapshot checks etcd's integrity trailer: the last 32 bytes are the
// SHA-256 of everything before them.
func checkSnapshot(data []byte) error {
	if len(data) <= 32 || len(data)%512 != 32 {
		return fmt.Errorf("snapshot of %d bytes: size %% 512 = %d, want 32", len(data), len(data)%512)
	}

	body, trailer := data[:len(data)-32], data[len(data)-32:]
	sum := sha256.Sum256(body)

	return expect(bytes.Equal(sum[:], trailer), "sha256 trailer %x does not match contents %x", trailer, sum)
}

// etcdSnapshot saves a snapshot the way talosctl 1.13 does: one node in
// `nodes` metadata (so apid relays the stream one-to-many).
func (d *driver) etcdSnapshot(ctx context.Context) error {
	r, err := d.c.EtcdSnapshot(client.WithNodes(ctx, d.ips[0]), &machine.EtcdSnapshotRequest{})
	if err != nil {
		return err
	}

	defer r.Close() //nolint:errcheck

	path := filepath.Join(d.workDir, "interop-driver-snapshot.db")

	f, err := os.OpenFile(path, os.O_CREATE|os.O_TRUNC|os.O_WRONLY, 0o600)
	if err != nil {
		return err
	}

	_, copyErr := io.Copy(f, r)

	if err = errors.Join(copyErr, f.Sync(), f.Close()); err != nil {
		return err
	}

	data, err := os.ReadFile(path)
	if err != nil {
		return err
	}

	return checkSnapshot(data)
}

// etcdSnapshotChunks reads the raw stream: chunks of at most 1 KiB, as
// machined sends them; through `node` passed on verbatim, through `nodes`
// each frame tagged with the node.
func (d *driver) etcdSnapshotChunks(ctx context.Context) error {
	if err := d.snapshotFrames(client.WithNode(ctx, d.ips[1]), ""); err != nil {
		return fmt.Errorf("node: %w", err)
	}

	if err := d.snapshotFrames(client.WithNodes(ctx, d.ips[1]), d.ips[1]); err != nil {
		return fmt.Errorf("nodes: %w", err)
	}

	return nil
}

func (d *driver) snapshotFrames(ctx context.Context, hostname string) error {
	stream, err := d.c.MachineClient.EtcdSnapshot(ctx, &machine.EtcdSnapshotRequest{})
	if err != nil {
		return err
	}

	var (
		data    []byte
		largest int
	)

	for {
		chunk, recvErr := stream.Recv()
		if errors.Is(recvErr, io.EOF) {
			break
		}

		if recvErr != nil {
			return recvErr
		}

		if chunk.GetMetadata().GetError() != "" {
			return fmt.Errorf("error frame: %v", chunk.Metadata)
		}

		if got := chunk.GetMetadata().GetHostname(); got != hostname {
			return fmt.Errorf("frame metadata.hostname %q, want %q", got, hostname)
		}

		largest = max(largest, len(chunk.Bytes))
		data = append(data, chunk.Bytes...)
	}

	if largest != 1024 {
		return fmt.Errorf("largest chunk is %d bytes, want 1024", largest)
	}

	return checkSnapshot(data)
}

// readerRoles checks role enforcement as the client sees it.
func (d *driver) readerRoles(ctx context.Context) error {
	ctx = client.WithNode(ctx, d.ips[0])

	if _, err := d.reader.Version(ctx); err != nil {
		return fmt.Errorf("reader Version: %w", err)
	}

	_, err := d.reader.ApplyConfiguration(ctx, &machine.ApplyConfigurationRequest{
		Data: []byte(d.machineConfig), Mode: machine.ApplyConfigurationRequest_AUTO, DryRun: true,
	})
	if code := client.StatusCode(err); code != codes.PermissionDenied {
		return fmt.Errorf("reader apply-config: code %v (%v), want PermissionDenied", code, err)
	}

	r, err := d.reader.EtcdSnapshot(ctx, &machine.EtcdSnapshotRequest{})
	if err == nil {
		_, err = io.Copy(io.Discard, r)
		r.Close() //nolint:errcheck
	}

	return expect(client.StatusCode(err) == codes.PermissionDenied,
		"reader snapshot: %v, want PermissionDenied", err)
}

// serviceList: every node lists a running etcd service that turns healthy
// once its first health check has run (5 s after etcd starts, as Talos's
// etcd service health settings say).
func (d *driver) serviceList(ctx context.Context) error {
	return eventually(ctx, 60*time.Second, "healthy etcd services", func() error {
		resp, err := d.c.ServiceList(client.WithNodes(ctx, d.ips...))
		if err != nil {
			return err
		}

		byNode, err := byIP(d.ips, resp.Messages, func(m *machine.ServiceList) string { return m.GetMetadata().GetHostname() })
		if err != nil {
			return err
		}

		for ip, m := range byNode {
			i := slices.IndexFunc(m.Services, func(s *machine.ServiceInfo) bool { return s.Id == "etcd" })
			if i < 0 || m.Services[i].State != "Running" || !m.Services[i].GetHealth().GetHealthy() {
				return fmt.Errorf("node %s: no healthy running etcd service in %v", ip, m.Services)
			}
		}

		return nil
	})
}

func (d *driver) etcdDefragment(ctx context.Context) error {
	resp, err := d.c.EtcdDefragment(client.WithNode(ctx, d.ips[1]))
	if err != nil {
		return err
	}

	return expect(len(resp.Messages) == 1, "%d messages, want 1", len(resp.Messages))
}
