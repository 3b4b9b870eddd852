package main

// Checks that talos-sim keeps the quirks of the Talos version it reports
// (v1.13.9), seen through the official client: a snapshot that fails
// part-way ends with status OK, TRY rollbacks and their cancellation, and
// how apid's one-to-many routing fails.

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"strings"
	"time"

	"github.com/hashicorp/go-multierror"
	"github.com/siderolabs/talos/pkg/machinery/api/machine"
	"github.com/siderolabs/talos/pkg/machinery/client"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"
)

// control sends one request to talos-sim's control socket and checks that
// it was carried out.
func (d *driver) control(request map[string]any) error {
	if d.controlSocket == "" {
		return errors.New("no --control-socket given")
	}

	conn, err := net.Dial("unix", d.controlSocket)
	if err != nil {
		return err
	}

	defer conn.Close() //nolint:errcheck

	line, err := json.Marshal(request)
	if err != nil {
		return err
	}

	if _, err = conn.Write(append(line, '\n')); err != nil {
		return err
	}

	reply, err := bufio.NewReader(conn).ReadString('\n')
	if err != nil {
		return err
	}

	var answer struct {
		Reply   string `json:"reply"`
		Message string `json:"message"`
	}

	if err = json.Unmarshal([]byte(reply), &answer); err != nil {
		return err
	}

	return expect(answer.Reply != "error", "talos-sim refused %v: %s", request, answer.Message)
}

// etcdSnapshotTruncated: when machined fails to read etcd's snapshot
// part-way, pkg/chunker/stream ends the stream and the handler returns nil,
// so the client reads a short snapshot to EOF without any error, through
// `node` and through `nodes` alike.
func (d *driver) etcdSnapshotTruncated(ctx context.Context) error {
	const after = 5000

	for _, routed := range []struct {
		name string
		ctx  context.Context
	}{
		{"node", client.WithNode(ctx, d.ips[1])},
		{"nodes", client.WithNodes(ctx, d.ips[1])},
	} {
		if err := d.control(map[string]any{"request": "fail-next-snapshot", "node": d.names[1], "after_bytes": after}); err != nil {
			return err
		}

		r, err := d.c.EtcdSnapshot(routed.ctx, &machine.EtcdSnapshotRequest{})
		if err != nil {
			return fmt.Errorf("%s: %w", routed.name, err)
		}

		data, readErr := io.ReadAll(r)
		r.Close() //nolint:errcheck

		if err = errors.Join(
			expect(readErr == nil, "%s: a truncated snapshot must end without an error, got %v", routed.name, readErr),
			expect(len(data) == after, "%s: read %d bytes, want the %d sent before the fault", routed.name, len(data), after),
		); err != nil {
			return err
		}
	}

	return nil
}

// restoreConfig applies the original machine config to node ip (a non-TRY
// apply, which also confirms anything tried before).
func (d *driver) restoreConfig(ctx context.Context, ip string) error {
	_, err := d.c.ApplyConfiguration(client.WithNode(ctx, ip), &machine.ApplyConfigurationRequest{
		Data: []byte(d.machineConfig), Mode: machine.ApplyConfigurationRequest_NO_REBOOT,
	})

	return err
}

// try applies config in TRY mode with the given rollback timeout and checks
// the answer names the timeout as Go formats durations.
func (d *driver) try(ctx context.Context, ip string, config []byte, timeout time.Duration) error {
	resp, err := d.c.ApplyConfiguration(client.WithNode(ctx, ip), &machine.ApplyConfigurationRequest{
		Data: config, Mode: machine.ApplyConfigurationRequest_TRY, TryModeTimeout: durationpb.New(timeout),
	})
	if err != nil {
		return err
	}

	details := resp.Messages[0].ModeDetails

	return expect(strings.HasSuffix(details, " "+timeout.String()), "TRY %v: details %q do not end with %q", timeout, details, timeout.String())
}

// sleepUntil waits until t without sending anything to the node.
func sleepUntil(ctx context.Context, t time.Time) error {
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-time.After(time.Until(t)):
		return nil
	}
}

// activeIs checks with a dry run that config is the node's active config.
func (d *driver) activeIs(ctx context.Context, ip string, config []byte) (bool, error) {
	m, err := d.dryRun(ctx, ip, config)
	if err != nil {
		return false, err
	}

	return strings.Contains(m.ModeDetails, "No changes."), nil
}

// applyTryRollbackTarget: a rollback restores the config active when the
// TRY started (after two TRY applies in a row: the first TRY's), a zero
// timeout rolls back at once, and durations read as Go writes them (µs).
func (d *driver) applyTryRollbackTarget(ctx context.Context) error {
	const margin = 3 * time.Second

	ip := d.ips[1]

	first, err := d.withClusterName("interop-try-first")
	if err != nil {
		return err
	}

	second, err := d.withClusterName("interop-try-second")
	if err != nil {
		return err
	}

	if err = d.try(ctx, ip, first, time.Minute); err != nil {
		return err
	}

	started := time.Now()

	if err = d.try(ctx, ip, second, time.Second+500*time.Microsecond); err != nil {
		return err
	}

	if err = sleepUntil(ctx, started.Add(time.Second+margin)); err != nil {
		return err
	}

	back, err := d.activeIs(ctx, ip, first)
	if err != nil {
		return err
	}

	if err = expect(back, "after the second TRY's rollback the first TRY's config is not active"); err != nil {
		return err
	}

	for _, timeout := range []time.Duration{0, 500 * time.Microsecond} {
		if err = d.restoreConfig(ctx, ip); err != nil {
			return err
		}

		started = time.Now()

		if err = d.try(ctx, ip, second, timeout); err != nil {
			return err
		}

		if err = sleepUntil(ctx, started.Add(margin)); err != nil {
			return err
		}

		// With a 1 m default instead of an immediate rollback, this dry run
		// would find the TRY config active (and cancel its rollback).
		if back, err = d.activeIs(ctx, ip, []byte(d.machineConfig)); err != nil {
			return err
		}

		if err = expect(back, "TRY with timeout %v was not rolled back at once", timeout); err != nil {
			return err
		}
	}

	return d.restoreConfig(ctx, ip)
}

// applyTryCancelled: in 1.13.9 any non-TRY request cancels a pending
// rollback before it is parsed or validated (talos#14343, fixed later):
// a dry run does, and so does an invalid config.
func (d *driver) applyTryCancelled(ctx context.Context) error {
	const (
		timeout = 2 * time.Second
		margin  = 3 * time.Second
	)

	ip := d.ips[1]

	tried, err := d.withClusterName("interop-try-cancelled")
	if err != nil {
		return err
	}

	cancellers := []struct {
		name   string
		cancel func() error
	}{
		{"a dry run", func() error {
			_, err := d.dryRun(ctx, ip, tried)

			return err
		}},
		{"an invalid config", func() error {
			_, err := d.c.ApplyConfiguration(client.WithNode(ctx, ip), &machine.ApplyConfigurationRequest{
				Data: []byte("this: is: not: a config"), Mode: machine.ApplyConfigurationRequest_NO_REBOOT,
			})

			return expect(client.StatusCode(err) == codes.InvalidArgument, "invalid config: %v, want InvalidArgument", err)
		}},
	}

	for _, c := range cancellers {
		started := time.Now()

		if err = d.try(ctx, ip, tried, timeout); err != nil {
			return err
		}

		if err = c.cancel(); err != nil {
			return fmt.Errorf("%s: %w", c.name, err)
		}

		if err = sleepUntil(ctx, started.Add(timeout+margin)); err != nil {
			return err
		}

		kept, err := d.activeIs(ctx, ip, tried)
		if err != nil {
			return err
		}

		if err = expect(kept, "%s did not cancel the pending rollback", c.name); err != nil {
			return err
		}

		if err = d.restoreConfig(ctx, ip); err != nil {
			return err
		}
	}

	return nil
}

// nodesTargets: apid refuses an empty target or one with a port for the
// whole call (Internal "invalid target"), and a node it cannot dial becomes
// that node's error, grpc-go's connection error naming host and port.
func (d *driver) nodesTargets(ctx context.Context) error {
	_, port, err := net.SplitHostPort(d.context.Endpoints[0])
	if err != nil {
		return err
	}

	for _, bad := range []string{net.JoinHostPort(d.ips[0], port), ""} {
		_, err = d.c.Version(client.WithNodes(ctx, d.ips[0], bad))

		st, _ := status.FromError(err)
		if err = expect(st.Code() == codes.Internal && st.Message() == fmt.Sprintf("invalid target %q", bad),
			"target %q: %v, want Internal invalid target", bad, err); err != nil {
			return err
		}
	}

	ip := net.ParseIP(d.ips[0]).To4()
	if ip == nil {
		return fmt.Errorf("node address %s is not IPv4", d.ips[0])
	}

	nobody := net.IPv4(ip[0], ip[1], ip[2], 200).String()

	_, err = d.c.Version(client.WithNodes(ctx, d.ips[0], nobody))

	var (
		multi   *multierror.Error
		nodeErr *client.NodeError
	)

	if !errors.As(err, &multi) || len(multi.Errors) != 1 || !errors.As(multi.Errors[0], &nodeErr) || nodeErr.Node != nobody {
		return fmt.Errorf("want one NodeError for %s, got %v", nobody, err)
	}

	want := fmt.Sprintf(`connection error: desc = "transport: Error while dialing: dial tcp %s: connect: connection refused"`,
		net.JoinHostPort(nobody, port))
	st, _ := status.FromError(nodeErr.Err)

	return expect(st.Code() == codes.Unavailable && st.Message() == want, "unreachable node: %v, want Unavailable %q", nodeErr.Err, want)
}
