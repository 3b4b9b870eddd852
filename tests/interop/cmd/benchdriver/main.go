// Command benchdriver does what talosctl does for one command, with
// upstream Talos's official Go client (pkg/machinery/client, the version
// go.mod pins), so bench/ can time it beside talosctl-rs.
//
// Usage:
//
//	benchdriver --talosconfig PATH --node IP version
//	benchdriver --talosconfig PATH --node IP members
//	benchdriver --talosconfig PATH --node IP snapshot FILE
//
// `snapshot` streams the node's etcd snapshot into FILE as talosctl 1.13's
// `etcd snapshot` does (one node in `nodes` metadata, io.Copy from the
// client's reader, fsync); it does not compute etcd's status afterwards.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"time"

	"github.com/siderolabs/talos/pkg/machinery/api/machine"
	"github.com/siderolabs/talos/pkg/machinery/client"
)

func main() {
	talosconfig := flag.String("talosconfig", "", "talosconfig (required)")
	node := flag.String("node", "", "target node (required)")
	flag.Parse()

	if *talosconfig == "" || *node == "" || flag.NArg() < 1 {
		fmt.Fprintln(os.Stderr, "usage: benchdriver --talosconfig PATH --node IP version|members|snapshot FILE")
		os.Exit(2)
	}

	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()

	if err := run(ctx, *talosconfig, *node, flag.Args()); err != nil {
		fmt.Fprintln(os.Stderr, "benchdriver:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, talosconfig, node string, args []string) error {
	c, err := client.New(ctx, client.WithConfigFromFile(talosconfig))
	if err != nil {
		return err
	}

	defer c.Close() //nolint:errcheck

	switch args[0] {
	case "version":
		resp, err := c.Version(client.WithNode(ctx, node))
		if err != nil {
			return err
		}

		fmt.Println(resp.Messages[0].Version.Tag)
	case "members":
		resp, err := c.EtcdMemberList(client.WithNode(ctx, node), &machine.EtcdMemberListRequest{})
		if err != nil {
			return err
		}

		for _, m := range resp.Messages[0].Members {
			fmt.Printf("%016x %s\n", m.Id, m.Hostname)
		}
	case "snapshot":
		if len(args) != 2 {
			return errors.New("snapshot needs a FILE")
		}

		return snapshot(ctx, c, node, args[1])
	default:
		return fmt.Errorf("unknown command %q", args[0])
	}

	return nil
}

func snapshot(ctx context.Context, c *client.Client, node, path string) error {
	r, err := c.EtcdSnapshot(client.WithNodes(ctx, node), &machine.EtcdSnapshotRequest{})
	if err != nil {
		return err
	}

	defer r.Close() //nolint:errcheck

	f, err := os.OpenFile(path, os.O_CREATE|os.O_TRUNC|os.O_WRONLY, 0o600)
	if err != nil {
		return err
	}

	n, copyErr := io.Copy(f, r)

	if err = errors.Join(copyErr, f.Sync(), f.Close()); err != nil {
		return err
	}

	fmt.Printf("%d bytes\n", n)

	return nil
}
