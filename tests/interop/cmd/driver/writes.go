package main

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/hashicorp/go-multierror"
	"github.com/siderolabs/talos/pkg/machinery/api/machine"
	"github.com/siderolabs/talos/pkg/machinery/client"
	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/emptypb"
)

// withClusterName is the machine config with another cluster name (a change
// the nodes accept without a reboot).
func (d *driver) withClusterName(name string) ([]byte, error) {
	const current = "clusterName: talos-sim"

	if !strings.Contains(d.machineConfig, current) {
		return nil, fmt.Errorf("machine config lacks %q", current)
	}

	return []byte(strings.Replace(d.machineConfig, current, "clusterName: "+name, 1)), nil
}

// dryRun applies config as a dry run through `nodes` (as talosctl 1.13 does)
// and returns the single answer.
func (d *driver) dryRun(ctx context.Context, ip string, config []byte) (*machine.ApplyConfiguration, error) {
	resp, err := d.c.ApplyConfiguration(client.WithNodes(ctx, ip), &machine.ApplyConfigurationRequest{
		Data: config, Mode: machine.ApplyConfigurationRequest_AUTO, DryRun: true,
	})
	if err != nil {
		return nil, err
	}

	if len(resp.Messages) != 1 || resp.Messages[0].GetMetadata().GetHostname() != ip {
		return nil, fmt.Errorf("want one message from %s: %v", ip, resp)
	}

	return resp.Messages[0], nil
}

func (d *driver) applyDryRun(ctx context.Context) error {
	changed, err := d.withClusterName("interop-dry-run")
	if err != nil {
		return err
	}

	m, err := d.dryRun(ctx, d.ips[0], changed)
	if err != nil {
		return err
	}

	if err = errors.Join(
		expect(strings.HasPrefix(m.ModeDetails, "Dry run summary"), "mode_details %q", m.ModeDetails),
		expect(strings.Contains(m.ModeDetails, "interop-dry-run"), "the diff lacks the new name: %q", m.ModeDetails),
		// machined reports the mode AUTO resolved to.
		expect(m.Mode == machine.ApplyConfigurationRequest_NO_REBOOT, "mode %v, want NO_REBOOT", m.Mode),
	); err != nil {
		return err
	}

	same, err := d.dryRun(ctx, d.ips[0], []byte(d.machineConfig))
	if err != nil {
		return err
	}

	return expect(strings.Contains(same.ModeDetails, "No changes."), "unchanged config: %q", same.ModeDetails)
}

// applyTry applies a config in TRY mode and waits for the rollback: after
// the timeout a dry run of the original config shows no changes. (No dry run
// is sent while the rollback is pending: upstream bug 14343 makes a dry run
// cancel it there.)
func (d *driver) applyTry(ctx context.Context) error {
	const (
		timeout = 2 * time.Second
		// How late the node's rollback timer may fire on a loaded machine.
		rollbackMargin = 5 * time.Second
	)

	changed, err := d.withClusterName("interop-try")
	if err != nil {
		return err
	}

	started := time.Now()

	resp, err := d.c.ApplyConfiguration(client.WithNode(ctx, d.ips[1]), &machine.ApplyConfigurationRequest{
		Data: changed, Mode: machine.ApplyConfigurationRequest_TRY, TryModeTimeout: durationpb.New(timeout),
	})
	if err != nil {
		return err
	}

	if len(resp.Messages) != 1 {
		return fmt.Errorf("%d messages, want 1", len(resp.Messages))
	}

	m := resp.Messages[0]
	if m.Mode != machine.ApplyConfigurationRequest_TRY || !strings.Contains(m.ModeDetails, "try") {
		return fmt.Errorf("answer mode %v, details %q; want TRY", m.Mode, m.ModeDetails)
	}

	// The rollback is a timer on the node: nothing to poll before it fires,
	// and no dry run may be sent while it is pending (in 1.13.9 that
	// cancels it), so wait well past the timeout before the first one.
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-time.After(time.Until(started.Add(timeout + rollbackMargin))):
	}

	return eventually(ctx, 20*time.Second, "the TRY config to be rolled back", func() error {
		m, err := d.dryRun(ctx, d.ips[1], []byte(d.machineConfig))
		if err != nil {
			return err
		}

		return expect(strings.Contains(m.ModeDetails, "No changes."), "still differs: %q", m.ModeDetails)
	})
}

// leader finds the etcd leader's name through the first node's status.
func (d *driver) leader(ctx context.Context, ip string) (string, error) {
	resp, err := d.c.EtcdStatus(client.WithNode(ctx, ip))
	if err != nil {
		return "", err
	}

	id := resp.Messages[0].GetMemberStatus().GetLeader()
	for name, known := range d.ids {
		if known == id {
			return name, nil
		}
	}

	return "", fmt.Errorf("leader %x is not a known member", id)
}

func (d *driver) etcdForfeitLeadership(ctx context.Context) error {
	leader, err := d.leader(ctx, d.ips[0])
	if err != nil {
		return err
	}

	leaderIP := d.ips[slices.Index(d.names, leader)]
	follower := d.ips[(slices.Index(d.names, leader)+1)%len(d.ips)]

	resp, err := d.c.EtcdForfeitLeadership(client.WithNode(ctx, follower), &machine.EtcdForfeitLeadershipRequest{})
	if err != nil {
		return fmt.Errorf("on a follower: %w", err)
	}

	if len(resp.Messages) != 1 || resp.Messages[0].Member != "" {
		return fmt.Errorf("a follower has nothing to forfeit, want an empty member: %v", resp)
	}

	// talosctl 1.13 style: the one node in `nodes`.
	resp, err = d.c.EtcdForfeitLeadership(client.WithNodes(ctx, leaderIP), &machine.EtcdForfeitLeadershipRequest{})
	if err != nil {
		return err
	}

	if len(resp.Messages) != 1 || resp.Messages[0].GetMetadata().GetHostname() != leaderIP {
		return fmt.Errorf("want one message from %s: %v", leaderIP, resp)
	}

	successor := resp.Messages[0].Member
	if successor == leader || !slices.Contains(d.names, successor) {
		return fmt.Errorf("leader %s handed over to %q", leader, successor)
	}

	return eventually(ctx, 20*time.Second, successor+" to lead", func() error {
		now, err := d.leader(ctx, d.ips[0])
		if err != nil {
			return err
		}

		return expect(now == successor, "leader is %s", now)
	})
}

func (d *driver) etcdLeaveCluster(ctx context.Context) error {
	ip, name := d.ips[2], d.names[2]

	// As talosctl 1.13 sends it: the one node in `nodes`.
	if err := d.c.EtcdLeaveCluster(client.WithNodes(ctx, ip), &machine.EtcdLeaveClusterRequest{}); err != nil {
		return err
	}

	err := eventually(ctx, 20*time.Second, name+" to leave the member list", func() error {
		resp, err := d.c.EtcdMemberList(client.WithNode(ctx, d.ips[0]), &machine.EtcdMemberListRequest{})
		if err != nil {
			return err
		}

		for _, m := range resp.Messages[0].Members {
			if m.Hostname == name {
				return fmt.Errorf("%s is still a member", name)
			}
		}

		return expect(len(resp.Messages[0].Members) == len(d.names)-1, "members: %v", resp.Messages[0].Members)
	})
	if err != nil {
		return err
	}

	// The node itself keeps answering.
	if _, err = d.c.Version(client.WithNode(ctx, ip)); err != nil {
		return fmt.Errorf("%s stopped answering after leaving: %w", ip, err)
	}

	// Removing a member can take the leader with it; membership changes wait
	// until the survivors agree on a new one (etcd drops membership
	// proposals made before the new leader has settled).
	survivors := d.ips[:len(d.ips)-1]

	err = eventually(ctx, 20*time.Second, "the survivors to agree on a leader", func() error {
		var leader uint64

		for _, survivor := range survivors {
			resp, err := d.c.EtcdStatus(client.WithNode(ctx, survivor))
			if err != nil {
				return err
			}

			got := resp.Messages[0].GetMemberStatus().GetLeader()
			if got == 0 || (leader != 0 && got != leader) {
				return fmt.Errorf("%s sees leader %x, others %x", survivor, got, leader)
			}

			leader = got
		}

		return nil
	})
	if err != nil {
		return err
	}

	// Its member is gone: removing it by id again is NotFound. A leader
	// elected after the leave drops membership proposals until it has
	// applied its whole log (raft keeps a pending configuration index from
	// its election), and a dropped proposal is never answered: the call
	// only ends at its deadline, on Talos as here. So each try gets its own
	// short deadline, as a careful script would give it.
	deadline := time.Now().Add(30 * time.Second)

	for {
		tryCtx, cancel := context.WithTimeout(ctx, 5*time.Second)
		err = d.c.EtcdRemoveMemberByID(client.WithNode(tryCtx, d.ips[0]), &machine.EtcdRemoveMemberByIDRequest{MemberId: d.ids[name]})

		cancel()

		if client.StatusCode(err) != codes.DeadlineExceeded || time.Now().After(deadline) {
			return expect(client.StatusCode(err) == codes.NotFound, "removing the departed member again: %v, want NotFound", err)
		}
	}
}

// resetPowerOff resets the third node without a reboot while the official
// client's event watch (EventsWatchV2, what talosctl's reset tracker uses)
// follows it: the reset's events carry its actor id and go through its
// sequence, phases and the stopAllServices task, then the stream ends and
// the node stops answering.
func (d *driver) resetPowerOff(ctx context.Context) error {
	ip := d.ips[2]
	nodeCtx := client.WithNode(ctx, ip)

	events := make(chan client.EventResult)
	if err := d.c.EventsWatchV2(nodeCtx, events); err != nil {
		return fmt.Errorf("watching events: %w", err)
	}

	resp, err := d.c.ResetGenericWithResponse(nodeCtx, &machine.ResetRequest{
		Graceful: false,
		Reboot:   false,
		SystemPartitionsToWipe: []*machine.ResetPartitionSpec{
			{Label: "STATE", Wipe: true},
			{Label: "EPHEMERAL", Wipe: true},
		},
	})
	if err != nil {
		return err
	}

	if len(resp.Messages) != 1 || resp.Messages[0].ActorId == "" {
		return fmt.Errorf("want one message with an actor id: %v", resp)
	}

	seen, err := resetEvents(ctx, events, resp.Messages[0].ActorId)
	if err != nil {
		return err
	}

	for _, want := range []string{
		"sequence reset START",
		"stage RESETTING",
		"phase resetSpec START",
		"task stopAllServices STOP",
		"phase shutdown STOP",
	} {
		if !slices.Contains(seen, want) {
			return fmt.Errorf("no %q among the reset's events %q", want, seen)
		}
	}

	return eventually(ctx, 30*time.Second, ip+" to power off", func() error {
		_, err := d.c.Version(client.WithNode(ctx, ip))

		return expect(client.StatusCode(err) == codes.Unavailable, "Version says %v", err)
	})
}

// resetEvents reads the watch until it ends (the node went down) and
// describes each event of the actor.
func resetEvents(ctx context.Context, events <-chan client.EventResult, actor string) ([]string, error) {
	var seen []string

	timeout := time.After(60 * time.Second)

	for {
		select {
		case <-ctx.Done():
			return seen, ctx.Err()
		case <-timeout:
			return seen, fmt.Errorf("the event stream did not end with the node: %q", seen)
		case result := <-events:
			if result.Error != nil {
				return seen, nil
			}

			if result.Event.ActorID != actor {
				return seen, fmt.Errorf("event %s has actor %q, want %q", result.Event.TypeURL, result.Event.ActorID, actor)
			}

			seen = append(seen, describeEvent(result.Event))
		}
	}
}

func describeEvent(event client.Event) string {
	switch msg := event.Payload.(type) {
	case *machine.SequenceEvent:
		return fmt.Sprintf("sequence %s %s", msg.GetSequence(), msg.GetAction())
	case *machine.PhaseEvent:
		return fmt.Sprintf("phase %s %s", msg.GetPhase(), msg.GetAction())
	case *machine.TaskEvent:
		return fmt.Sprintf("task %s %s", msg.GetTask(), msg.GetAction())
	case *machine.MachineStatusEvent:
		return fmt.Sprintf("stage %s", msg.GetStage())
	default:
		return event.TypeURL
	}
}

// nodesWithNodeDown: with `nodes`, a node that is down becomes one message
// carrying only metadata.error and status; the call itself succeeds, and
// the official client turns that message into a NodeError.
func (d *driver) nodesWithNodeDown(ctx context.Context) error {
	down := d.ips[2]
	ctx = client.WithNodes(ctx, d.ips...)

	resp, err := d.c.Version(ctx)

	var (
		multi   *multierror.Error
		nodeErr *client.NodeError
	)

	switch {
	case !errors.As(err, &multi) || len(multi.Errors) != 1:
		return fmt.Errorf("want a multierror with one node error, got %v", err)
	case !errors.As(multi.Errors[0], &nodeErr) || nodeErr.Node != down:
		return fmt.Errorf("want a NodeError for %s, got %#v", down, multi.Errors[0])
	case client.StatusCode(nodeErr.Err) != codes.Unavailable || client.StatusCode(err) != codes.Unavailable:
		return fmt.Errorf("want Unavailable, got %v", nodeErr.Err)
	case resp == nil:
		return errors.New("the answers of the nodes that are up were dropped")
	}

	if _, err = byIP(d.ips[:2], resp.Messages, func(m *machine.Version) string { return m.GetMetadata().GetHostname() }); err != nil {
		return err
	}

	raw, err := d.c.MachineClient.Version(ctx, &emptypb.Empty{})
	if err != nil {
		return fmt.Errorf("the aggregated call itself must succeed: %w", err)
	}

	byNode, err := byIP(d.ips, raw.Messages, func(m *machine.Version) string { return m.GetMetadata().GetHostname() })
	if err != nil {
		return err
	}

	m := byNode[down]
	md := m.GetMetadata()
	prefix := "rpc error: code = Unavailable desc = "

	return errors.Join(
		expect(m.Version == nil && m.Platform == nil && m.Features == nil, "stand-in message has fields: %v", m),
		expect(strings.HasPrefix(md.GetError(), prefix), "metadata.error %q", md.GetError()),
		expect(md.GetStatus().GetCode() == int32(codes.Unavailable), "metadata.status %v", md.GetStatus()),
		expect(md.GetStatus().GetMessage() == strings.TrimPrefix(md.GetError(), prefix),
			"status message %q vs error %q", md.GetStatus().GetMessage(), md.GetError()),
	)
}

// nodeDownOneToOne: with `node`, the failure is the call's own status.
func (d *driver) nodeDownOneToOne(ctx context.Context) error {
	_, err := d.c.Version(client.WithNode(ctx, d.ips[2]))

	var multi *multierror.Error

	return errors.Join(
		expect(!errors.As(err, &multi), "one-to-one failure came as a multierror: %v", err),
		expect(client.StatusCode(err) == codes.Unavailable, "want Unavailable, got %v", err),
	)
}

func (d *driver) survivorsEtcd(ctx context.Context) error {
	survivors := d.ips[:2]

	resp, err := d.c.EtcdMemberList(client.WithNodes(ctx, survivors...), &machine.EtcdMemberListRequest{})
	if err != nil {
		return err
	}

	byNode, err := byIP(survivors, resp.Messages, func(m *machine.EtcdMembers) string { return m.GetMetadata().GetHostname() })
	if err != nil {
		return err
	}

	for ip, m := range byNode {
		if len(m.Members) != 2 {
			return fmt.Errorf("node %s lists %d members, want 2", ip, len(m.Members))
		}
	}

	return nil
}
