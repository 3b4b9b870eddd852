// Command benchdriver does what talosctl does for one command, with
// upstream Talos's official Go client (pkg/machinery/client, the version
// go.mod pins), so bench/ can time it beside talosctl-rs.
//
// Usage:
//
//	benchdriver --talosconfig PATH --node IP version
//	benchdriver --talosconfig PATH --node IP members
//	benchdriver --talosconfig PATH --node IP snapshot FILE
//	benchdriver --talosconfig PATH --node IP backup s3://BUCKET/KEY AGE_RECIPIENT
//
// `snapshot` does what talosctl 1.13's `etcd snapshot` does
// (cmd/talosctl/cmd/talos/etcd.go in siderolabs/talos): the node's etcd
// snapshot streamed into FILE.part (one node in `nodes` metadata, io.Copy
// from the client's reader), fsync, the size checked for etcd's sha256
// trailer, FILE.part renamed to FILE, then etcd's snapshot status computed
// with etcdutl's snapshot package and printed as talosctl prints it.
//
// `backup` (backup.go) is the off-host pipeline of siderolabs/talos-backup
// (zstd, then age, then S3) in one stream, to time beside `talosctl-rs ops
// snapshot --to s3://... --encrypt`.
package main

import (
	"context"
	"crypto/sha256"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"time"

	"github.com/siderolabs/talos/pkg/machinery/api/machine"
	"github.com/siderolabs/talos/pkg/machinery/client"
	etcdsnapshot "go.etcd.io/etcd/etcdutl/v3/snapshot"
	"go.uber.org/zap"
)

func main() {
	talosconfig := flag.String("talosconfig", "", "talosconfig (required)")
	node := flag.String("node", "", "target node (required)")
	flag.Parse()

	if *talosconfig == "" || *node == "" || flag.NArg() < 1 {
		fmt.Fprintln(os.Stderr, "usage: benchdriver --talosconfig PATH --node IP version|members|snapshot FILE|backup s3://BUCKET/KEY AGE_RECIPIENT")
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
	case "backup":
		if len(args) != 3 {
			return errors.New("backup needs s3://BUCKET/KEY and an age recipient")
		}

		return backup(ctx, c, node, args[1], args[2])
	default:
		return fmt.Errorf("unknown command %q", args[0])
	}

	return nil
}

func snapshot(ctx context.Context, c *client.Client, node, path string) error {
	part := path + ".part"

	defer os.Remove(part) //nolint:errcheck

	f, err := os.OpenFile(part, os.O_CREATE|os.O_TRUNC|os.O_WRONLY, 0o600)
	if err != nil {
		return err
	}

	defer f.Close() //nolint:errcheck

	r, err := c.EtcdSnapshot(client.WithNodes(ctx, node), &machine.EtcdSnapshotRequest{})
	if err != nil {
		return err
	}

	defer r.Close() //nolint:errcheck

	size, err := io.Copy(f, r)
	if err != nil {
		return err
	}

	if err = f.Sync(); err != nil {
		return err
	}

	// An etcd snapshot ends with the sha256 of the database.
	if size%512 != sha256.Size {
		return fmt.Errorf("sha256 checksum not found (size %d)", size)
	}

	if err = os.Rename(part, path); err != nil {
		return err
	}

	fmt.Printf("etcd snapshot saved to %q (%d bytes)\n", path, size)

	status, err := etcdsnapshot.NewV3(zap.NewNop()).Status(path)
	if err != nil {
		return err
	}

	fmt.Printf("snapshot info: hash %08x, revision %d, total keys %d, total size %d\n",
		status.Hash, status.Revision, status.TotalKey, status.TotalSize)

	return nil
}
