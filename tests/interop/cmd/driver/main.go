// Command driver runs upstream Talos's official Go client
// (pkg/machinery/client) against a running talos-sim cluster and checks what
// it sees: routing by `node` and `nodes`, hostnames in metadata, etcd calls,
// snapshots, logs, events, kernel messages, containers, apply-config,
// leave, reset and how a powered-off node's error reaches the client.
//
// Usage:
//
//	driver --talosconfig DIR/talosconfig --machine-config DIR/controlplane.yaml \
//	       --hostnames cp-1,cp-2,cp-3 [--reader-talosconfig DIR/talosconfig-reader] \
//	       [--work-dir DIR] [--control-socket DIR/control.sock]
//
// The talosconfig's endpoints are the nodes, in the order of --hostnames.
// It prints one line per check (`ok NAME` or `FAIL NAME: why`) and exits 1
// if any check failed. Destructive checks run last.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"net"
	"os"
	"strings"
	"time"

	"github.com/siderolabs/talos/pkg/machinery/client"
	clientconfig "github.com/siderolabs/talos/pkg/machinery/client/config"
)

// perCheck bounds each check; waits inside checks have shorter deadlines.
const perCheck = 90 * time.Second

type driver struct {
	cfg     *clientconfig.Config
	context *clientconfig.Context
	// all uses every endpoint of the talosconfig (the client balances
	// between them); c uses only the first node's endpoint.
	all, c *client.Client
	reader *client.Client
	// ips and names of the nodes, in endpoint order.
	ips, names []string
	// ids maps member names to etcd member ids.
	ids           map[string]uint64
	machineConfig string
	workDir       string
	// controlSocket is talos-sim's control socket (arms faults).
	controlSocket string
}

type check struct {
	name string
	run  func(ctx context.Context) error
}

func main() {
	talosconfig := flag.String("talosconfig", "", "admin talosconfig written by talos-sim (required)")
	readerConfig := flag.String("reader-talosconfig", "", "reader talosconfig written by talos-sim (optional)")
	machineConfig := flag.String("machine-config", "", "a machine config the nodes accept (controlplane.yaml; required)")
	hostnames := flag.String("hostnames", "", "comma-separated node hostnames in endpoint order (required)")
	workDir := flag.String("work-dir", os.TempDir(), "directory for the snapshot file")
	controlSocket := flag.String("control-socket", "", "talos-sim's control socket (for the truncated-snapshot check)")
	flag.Parse()

	if *talosconfig == "" || *machineConfig == "" || *hostnames == "" {
		fmt.Fprintln(os.Stderr, "driver: --talosconfig, --machine-config and --hostnames are required")
		os.Exit(2)
	}

	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()

	d, err := setup(ctx, *talosconfig, *readerConfig, *machineConfig, strings.Split(*hostnames, ","), *workDir)
	if err != nil {
		fmt.Printf("FAIL setup: %v\n", err)
		os.Exit(1)
	}

	d.controlSocket = *controlSocket

	fmt.Println("ok setup")

	failed := 0
	checks := d.checks()

	for _, c := range checks {
		checkCtx, cancelCheck := context.WithTimeout(ctx, perCheck)
		err := c.run(checkCtx)

		cancelCheck()

		if err != nil {
			failed++

			fmt.Printf("FAIL %s: %s\n", c.name, strings.ReplaceAll(err.Error(), "\n", " | "))
		} else {
			fmt.Printf("ok %s\n", c.name)
		}
	}

	fmt.Printf("checks: %d ok, %d failed\n", len(checks)-failed, failed)

	if failed > 0 {
		os.Exit(1)
	}
}

// setup loads the talosconfig with upstream's loader and makes the clients.
func setup(ctx context.Context, path, readerPath, machineConfig string, names []string, workDir string) (*driver, error) {
	cfg, err := clientconfig.Open(path)
	if err != nil {
		return nil, err
	}

	context, ok := cfg.Contexts[cfg.Context]
	if !ok {
		return nil, fmt.Errorf("current context %q is not defined", cfg.Context)
	}

	if len(context.Endpoints) != len(names) {
		return nil, fmt.Errorf("%d endpoints %q for %d hostnames", len(context.Endpoints), context.Endpoints, len(names))
	}

	ips := make([]string, len(context.Endpoints))

	for i, endpoint := range context.Endpoints {
		host, _, splitErr := net.SplitHostPort(endpoint)
		if splitErr != nil {
			return nil, fmt.Errorf("endpoint %q: %w", endpoint, splitErr)
		}

		ips[i] = host
	}

	if len(context.Nodes) != 1 || context.Nodes[0] != ips[0] {
		return nil, fmt.Errorf("context nodes are %q, want [%s]", context.Nodes, ips[0])
	}

	data, err := os.ReadFile(machineConfig)
	if err != nil {
		return nil, err
	}

	d := &driver{
		cfg: cfg, context: context, ips: ips, names: names,
		ids: map[string]uint64{}, machineConfig: string(data), workDir: workDir,
	}

	if d.all, err = client.New(ctx, client.WithConfig(cfg)); err != nil {
		return nil, err
	}

	if d.c, err = client.New(ctx, client.WithConfig(cfg), client.WithEndpoints(context.Endpoints[0])); err != nil {
		return nil, err
	}

	if readerPath != "" {
		if d.reader, err = client.New(ctx, client.WithConfigFromFile(readerPath),
			client.WithEndpoints(context.Endpoints[0])); err != nil {
			return nil, err
		}
	}

	return d, nil
}

// checks lists the checks in the order they run: reads first, then calls
// that change the cluster, ending with a node powered off.
func (d *driver) checks() []check {
	list := []check{
		{"version-context-nodes", d.versionContextNodes},
		{"version-each-endpoint", d.versionEachEndpoint},
		{"version-node", d.versionNode},
		{"hostname-nodes", d.hostnameNodes},
		{"version-nodes", d.versionNodes},
		{"nodes-targets", d.nodesTargets},
		{"etcd-member-list", d.etcdMemberList},
		{"etcd-status", d.etcdStatus},
		{"etcd-alarm-list", d.etcdAlarmList},
		{"service-list", d.serviceList},
		{"logs-etcd", d.logsEtcd},
		{"logs-follow", d.logsFollow},
		{"events-tail", d.eventsTail},
		{"dmesg", d.dmesg},
		{"containers", d.containers},
		{"cosi-machine-config", d.cosiMachineConfig},
		{"cosi-machine-status", d.cosiMachineStatus},
		{"cosi-members", d.cosiMembers},
		{"cosi-addresses", d.cosiAddresses},
		{"etcd-defragment", d.etcdDefragment},
		{"etcd-snapshot", d.etcdSnapshot},
		{"etcd-snapshot-chunks", d.etcdSnapshotChunks},
		{"etcd-snapshot-truncated", d.etcdSnapshotTruncated},
	}

	if d.reader != nil {
		list = append(list, check{"reader-roles", d.readerRoles})
	}

	return append(list,
		check{"apply-dry-run", d.applyDryRun},
		check{"apply-try", d.applyTry},
		check{"apply-try-rollback-target", d.applyTryRollbackTarget},
		check{"apply-try-cancelled", d.applyTryCancelled},
		check{"etcd-forfeit-leadership", d.etcdForfeitLeadership},
		check{"etcd-leave-cluster", d.etcdLeaveCluster},
		check{"reset-power-off", d.resetPowerOff},
		check{"nodes-with-node-down", d.nodesWithNodeDown},
		check{"node-down-one-to-one", d.nodeDownOneToOne},
		check{"survivors-etcd", d.survivorsEtcd},
	)
}

// eventually retries cond every 100ms until it succeeds or timeout passes;
// it returns the last error then.
func eventually(ctx context.Context, timeout time.Duration, what string, cond func() error) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()

	ticker := time.NewTicker(100 * time.Millisecond)
	defer ticker.Stop()

	for {
		err := cond()
		if err == nil {
			return nil
		}

		select {
		case <-ctx.Done():
			return fmt.Errorf("timed out waiting for %s: %w", what, err)
		case <-ticker.C:
		}
	}
}

func expect(cond bool, format string, args ...any) error {
	if cond {
		return nil
	}

	return fmt.Errorf(format, args...)
}

var errNoMessages = errors.New("response has no messages")
