package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"maps"
	"regexp"
	"slices"
	"strings"
	"time"

	"github.com/siderolabs/talos/pkg/machinery/api/common"
	"github.com/siderolabs/talos/pkg/machinery/api/machine"
	"github.com/siderolabs/talos/pkg/machinery/client"
	"google.golang.org/grpc/codes"
)

// dataStream is what Logs and Dmesg return.
type dataStream interface {
	Recv() (*common.Data, error)
}

// readAll reads a stream of common.Data to its end and groups the bytes
// by metadata.hostname; a message carrying an error fails.
func readAll(stream dataStream) (map[string][]byte, error) {
	out := map[string][]byte{}

	for {
		data, err := stream.Recv()
		if errors.Is(err, io.EOF) {
			return out, nil
		}

		if err != nil {
			return nil, err
		}

		if data.GetMetadata().GetError() != "" {
			return nil, fmt.Errorf("%s: %s", data.GetMetadata().GetHostname(), data.GetMetadata().GetError())
		}

		host := data.GetMetadata().GetHostname()
		out[host] = append(out[host], data.GetBytes()...)
	}
}

// logsEtcd: `talosctl logs etcd --tail 2` through apid's one-to-many
// proxying: every node's last two lines of etcd's log (JSON from etcd's
// logger), each message tagged with its node.
func (d *driver) logsEtcd(ctx context.Context) error {
	stream, err := d.c.Logs(client.WithNodes(ctx, d.ips...), "system", common.ContainerDriver_CONTAINERD, "etcd", false, 2)
	if err != nil {
		return err
	}

	byNode, err := readAll(stream)
	if err != nil {
		return err
	}

	for _, ip := range d.ips {
		lines := strings.Split(strings.TrimSuffix(string(byNode[ip]), "\n"), "\n")
		if len(lines) != 2 {
			return fmt.Errorf("%s: %d lines, want 2: %q", ip, len(lines), byNode[ip])
		}

		for _, line := range lines {
			if !strings.HasPrefix(line, `{"level":`) {
				return fmt.Errorf("%s: not etcd's log line: %q", ip, line)
			}
		}
	}

	if len(byNode) != len(d.ips) {
		return fmt.Errorf("answers from %d hosts, want %d: %v", len(byNode), len(d.ips), slices.Collect(maps.Keys(byNode)))
	}

	return nil
}

// logsFollow: a followed log sends what is there, then waits; cancelling
// the context ends the stream with Canceled, as talosctl stops on Ctrl-C.
func (d *driver) logsFollow(ctx context.Context) error {
	ctx, cancel := context.WithCancel(client.WithNode(ctx, d.ips[0]))
	defer cancel()

	stream, err := d.c.Logs(ctx, "system", common.ContainerDriver_CONTAINERD, "etcd", true, 1)
	if err != nil {
		return err
	}

	first, err := stream.Recv()
	if err != nil {
		return fmt.Errorf("first message: %w", err)
	}

	if len(first.GetBytes()) == 0 {
		return errors.New("the first message is empty")
	}

	cancel()

	for {
		if _, err = stream.Recv(); err != nil {
			break
		}
	}

	if client.StatusCode(err) != codes.Canceled {
		return fmt.Errorf("after cancel: %v, want Canceled", err)
	}

	return nil
}

// eventsTail: `talosctl events --tail 3` gets the hello event and the
// last three events at once, decoded by the client's own UnmarshalEvent.
func (d *driver) eventsTail(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(client.WithNodes(ctx, d.ips[0]), 5*time.Second)
	defer cancel()

	stream, err := d.c.Events(ctx, client.WithTailEvents(3))
	if err != nil {
		return err
	}

	var decoded []*client.Event

	for len(decoded) < 3 {
		event, err := stream.Recv()
		if err != nil {
			return fmt.Errorf("after %d events: %w", len(decoded), err)
		}

		if event.GetMetadata().GetHostname() != d.ips[0] {
			return fmt.Errorf("event from %q, want %s", event.GetMetadata().GetHostname(), d.ips[0])
		}

		ev, err := client.UnmarshalEvent(event)
		if err != nil {
			if _, ok := errors.AsType[client.EventNotSupportedError](err); ok && event.GetData().GetTypeUrl() == "" && len(decoded) == 0 {
				continue // the hello event
			}

			return err
		}

		decoded = append(decoded, ev)
	}

	last, ok := decoded[2].Payload.(*machine.MachineStatusEvent)
	if !ok || last.GetStage() != machine.MachineStatusEvent_RUNNING || !last.GetStatus().GetReady() {
		return fmt.Errorf("the last event is %v, want the machine running and ready", decoded[2].Payload)
	}

	return nil
}

var dmesgLine = regexp.MustCompile(`^[a-z]+: +[a-z]+: \[\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d+)?Z\]: `)

// dmesg: every node's kernel messages, one message a line in machined's
// format, from every node.
func (d *driver) dmesg(ctx context.Context) error {
	stream, err := d.c.Dmesg(client.WithNodes(ctx, d.ips...), false, false)
	if err != nil {
		return err
	}

	byNode, err := readAll(stream)
	if err != nil {
		return err
	}

	for _, ip := range d.ips {
		text := string(byNode[ip])
		if !strings.Contains(text, "hostname set to "+d.nameOf(ip)) {
			return fmt.Errorf("%s: no hostname message in %q", ip, text)
		}

		for line := range strings.Lines(text) {
			if !dmesgLine.MatchString(line) {
				return fmt.Errorf("%s: %q is not in machined's format", ip, line)
			}
		}
	}

	return nil
}

// containers: the system namespace of every control-plane node lists
// etcd at the image Talos 1.13.9 runs, with a process id.
func (d *driver) containers(ctx context.Context) error {
	resp, err := d.c.Containers(client.WithNodes(ctx, d.ips...), "system", common.ContainerDriver_CONTAINERD)
	if err != nil {
		return err
	}

	byNode, err := byIP(d.ips, resp.GetMessages(), func(m *machine.Container) string { return m.GetMetadata().GetHostname() })
	if err != nil {
		return err
	}

	for ip, m := range byNode {
		i := slices.IndexFunc(m.GetContainers(), func(c *machine.ContainerInfo) bool { return c.GetId() == "etcd" })
		if i < 0 {
			return fmt.Errorf("%s: no etcd container in %v", ip, m.GetContainers())
		}

		etcd := m.GetContainers()[i]
		if etcd.GetImage() != "registry.k8s.io/etcd:v3.6.12" || etcd.GetPid() == 0 || etcd.GetStatus() != "RUNNING" {
			return fmt.Errorf("%s: etcd container %v", ip, etcd)
		}
	}

	_, err = d.c.Containers(client.WithNode(ctx, d.ips[0]), "", common.ContainerDriver_CONTAINERD)
	if client.StatusCode(err) != codes.InvalidArgument {
		return fmt.Errorf("an empty namespace: %v, want InvalidArgument", err)
	}

	return nil
}
