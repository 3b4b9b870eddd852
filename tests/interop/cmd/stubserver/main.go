// Command stubserver serves canned, field-rich answers for every call of
// talos-client's proto subset, using upstream Talos's own generated Go stubs
// (pkg/machinery/api/machine and api/cluster), and checks the requests it
// receives against the values the Rust interop test is expected to send.
// It also serves cosi.resource.State with cosi-project/runtime's own
// protobuf state server over upstream's resource types (cosi.go).
//
// Its PKI is made by upstream's code: a secrets bundle from
// config/generate/secrets, a talosconfig from the generator behind
// `talosctl gen config`, and a server certificate issued from the bundle's
// OS (Talos API) CA the way machined issues apid's.
//
// Usage:
//
//	stubserver --talosconfig PATH [--dump-dir DIR]
//
// Once serving it prints `LISTENING 127.0.0.1:PORT` on stdout. It exits when
// stdin reaches end-of-file (its parent went away) or on SIGTERM.
package main

import (
	"bufio"
	"context"
	"crypto/tls"
	stdx509 "crypto/x509"
	"flag"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"time"

	"github.com/siderolabs/crypto/x509"
	"github.com/siderolabs/talos/pkg/machinery/api/cluster"
	"github.com/siderolabs/talos/pkg/machinery/api/machine"
	"github.com/siderolabs/talos/pkg/machinery/config"
	"github.com/siderolabs/talos/pkg/machinery/config/generate"
	"github.com/siderolabs/talos/pkg/machinery/config/generate/secrets"
	"github.com/siderolabs/talos/pkg/machinery/constants"
	"github.com/siderolabs/talos/pkg/machinery/role"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/protobuf/proto"
)

// contextName is the talosconfig context (the generator names it after the
// cluster).
const contextName = "interop-stub"

func main() {
	talosconfig := flag.String("talosconfig", "", "where to write the upstream-generated talosconfig (required)")
	dumpDir := flag.String("dump-dir", "", "if set, write each canned answer there as binary protobuf")
	flag.Parse()

	if *talosconfig == "" {
		fail("--talosconfig is required")
	}

	if err := run(*talosconfig, *dumpDir); err != nil {
		fail(err.Error())
	}
}

func fail(msg string) {
	fmt.Fprintln(os.Stderr, "stubserver:", msg)
	os.Exit(1)
}

func run(talosconfigPath, dumpDir string) error {
	if err := checkCannedComplete(); err != nil {
		return fmt.Errorf("canned answers are incomplete: %w", err)
	}

	if dumpDir != "" {
		if err := dumpCanned(dumpDir); err != nil {
			return err
		}
	}

	listener, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return err
	}

	endpoint := listener.Addr().String()

	tlsConfig, err := makePKI(endpoint, talosconfigPath)
	if err != nil {
		return err
	}

	server := grpc.NewServer(
		grpc.Creds(credentials.NewTLS(tlsConfig)),
		grpc.MaxRecvMsgSize(constants.GRPCMaxMessageSize),
		grpc.MaxSendMsgSize(constants.GRPCMaxMessageSize),
	)

	stub := &stubService{}
	machine.RegisterMachineServiceServer(server, stub)
	cluster.RegisterClusterServiceServer(server, &stubCluster{})

	if err = registerCOSI(context.Background(), server); err != nil {
		return fmt.Errorf("COSI state: %w", err)
	}

	// Exit when the parent closes our stdin, so no stub outlives its test.
	go func() {
		_, _ = io.Copy(io.Discard, os.Stdin)

		server.Stop()
		os.Exit(0)
	}()

	out := bufio.NewWriter(os.Stdout)
	fmt.Fprintf(out, "LISTENING %s\n", endpoint)

	if err = out.Flush(); err != nil {
		return err
	}

	return server.Serve(listener)
}

// makePKI generates a secrets bundle and a talosconfig with upstream's code
// and returns the server's TLS configuration: a certificate from the
// bundle's OS CA for 127.0.0.1, client certificates required and verified
// against that CA, as apid does.
func makePKI(endpoint, talosconfigPath string) (*tls.Config, error) {
	bundle, err := secrets.NewBundle(secrets.NewFixedClock(time.Now()), config.TalosVersionCurrent)
	if err != nil {
		return nil, fmt.Errorf("secrets bundle: %w", err)
	}

	input, err := generate.NewInput(contextName, "https://127.0.0.1:6443", constants.DefaultKubernetesVersion,
		generate.WithSecretsBundle(bundle),
		generate.WithEndpointList([]string{endpoint}),
		generate.WithRoles(role.MakeSet(role.Admin)),
	)
	if err != nil {
		return nil, fmt.Errorf("generate input: %w", err)
	}

	talosconfig, err := input.Talosconfig()
	if err != nil {
		return nil, fmt.Errorf("talosconfig: %w", err)
	}

	if err = os.MkdirAll(filepath.Dir(talosconfigPath), 0o700); err != nil {
		return nil, err
	}

	if err = talosconfig.Save(talosconfigPath); err != nil {
		return nil, fmt.Errorf("saving talosconfig: %w", err)
	}

	osCA, err := x509.NewCertificateAuthorityFromCertificateAndKey(bundle.Certs.OS)
	if err != nil {
		return nil, fmt.Errorf("OS CA: %w", err)
	}

	serverPair, err := x509.NewKeyPair(osCA,
		x509.IPAddresses([]net.IP{net.ParseIP("127.0.0.1")}),
		x509.DNSNames([]string{"localhost"}),
		x509.CommonName("interop-stub"),
		x509.NotAfter(time.Now().Add(time.Hour)),
		x509.KeyUsage(stdx509.KeyUsageDigitalSignature),
		x509.ExtKeyUsage([]stdx509.ExtKeyUsage{stdx509.ExtKeyUsageServerAuth}),
	)
	if err != nil {
		return nil, fmt.Errorf("server certificate: %w", err)
	}

	pem := x509.NewCertificateAndKeyFromKeyPair(serverPair)

	serverCert, err := tls.X509KeyPair(pem.Crt, pem.Key)
	if err != nil {
		return nil, fmt.Errorf("server key pair: %w", err)
	}

	clientCAs := stdx509.NewCertPool()
	if !clientCAs.AppendCertsFromPEM(bundle.Certs.OS.Crt) {
		return nil, fmt.Errorf("cannot parse the OS CA certificate")
	}

	return &tls.Config{
		MinVersion:   tls.VersionTLS12,
		Certificates: []tls.Certificate{serverCert},
		ClientCAs:    clientCAs,
		ClientAuth:   tls.RequireAndVerifyClientCert,
	}, nil
}

// dumpCanned writes every canned answer as binary protobuf, named
// `<Method>.bin` (streams: `<Method>.<index>.bin`), so the Rust test can
// check that decoding with our protos loses no byte.
func dumpCanned(dir string) error {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return err
	}

	for name, message := range cannedByName() {
		data, err := proto.MarshalOptions{Deterministic: true}.Marshal(message)
		if err != nil {
			return fmt.Errorf("marshal %s: %w", name, err)
		}

		if err = os.WriteFile(filepath.Join(dir, name+".bin"), data, 0o600); err != nil {
			return err
		}
	}

	return nil
}
