package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"slices"
	"strings"
	"time"

	"github.com/siderolabs/talos/pkg/machinery/api/cluster"
	"github.com/siderolabs/talos/pkg/machinery/api/common"
	"github.com/siderolabs/talos/pkg/machinery/api/machine"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/prototext"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/emptypb"
	"google.golang.org/protobuf/types/known/wrapperspb"
)

// route is where the caller asked the call to go.
type route struct {
	// node is the `node` metadata (one-to-one); empty with nodes.
	node string
	// nodes is the `nodes` metadata (apid aggregation).
	nodes []string
}

// routeOf checks the caller's certificate and routing metadata.
func routeOf(ctx context.Context) (route, error) {
	if err := checkAdmin(ctx); err != nil {
		return route{}, err
	}

	md, _ := metadata.FromIncomingContext(ctx)
	node, nodes := md.Get("node"), md.Get("nodes")

	switch {
	case len(node) > 0 && len(nodes) > 0:
		return route{}, status.Errorf(codes.InvalidArgument, "both node %q and nodes %q metadata sent", node, nodes)
	case len(nodes) > 0:
		return route{nodes: nodes}, nil
	case len(node) != 1:
		return route{}, status.Errorf(codes.InvalidArgument, "want exactly one node metadata value, got %q", node)
	case node[0] == deniedNode:
		return route{}, status.Errorf(codes.PermissionDenied, "not authorized for %s", deniedNode)
	case node[0] == stubNode || node[0] == failingNode:
		return route{node: node[0]}, nil
	default:
		return route{}, status.Errorf(codes.InvalidArgument, "unexpected node metadata %q", node[0])
	}
}

// checkAdmin requires the client certificate (already verified against the
// OS CA by TLS) to carry the admin role, as the generated talosconfig's does.
func checkAdmin(ctx context.Context) error {
	p, ok := peer.FromContext(ctx)
	if !ok {
		return status.Error(codes.Unauthenticated, "no peer")
	}

	info, ok := p.AuthInfo.(credentials.TLSInfo)
	if !ok || len(info.State.PeerCertificates) == 0 {
		return status.Error(codes.Unauthenticated, "no client certificate")
	}

	orgs := info.State.PeerCertificates[0].Subject.Organization
	if !slices.Contains(orgs, "os:admin") {
		return status.Errorf(codes.PermissionDenied, "client certificate roles %q lack os:admin", orgs)
	}

	return nil
}

// downMetadata is what apid puts in place of a node it could not reach:
// hostname, the error as Go formats it and the status (with details).
func downMetadata(node string, code codes.Code, msg string) *common.Metadata {
	st := status.New(code, msg)

	detailed, err := st.WithDetails(
		wrapperspb.String("detail for "+node),
		durationpb.New(1500*time.Millisecond),
	)
	if err != nil {
		panic(err)
	}

	return &common.Metadata{Hostname: node, Error: detailed.Err().Error(), Status: detailed.Proto()}
}

// aggregate builds the answer apid would give for `nodes`: the canned
// message once per node, tagged with the node's name, and for a node named
// down-* a message carrying only the error metadata.
func aggregate[T proto.Message](canned T, nodes []string) (T, error) {
	var zero T

	out, ok := proto.Clone(canned).(T)
	if !ok {
		return zero, errors.New("clone changed the message type")
	}

	r := out.ProtoReflect()
	list := r.Mutable(r.Descriptor().Fields().ByName("messages")).List()

	if list.Len() != 1 {
		return zero, fmt.Errorf("canned %s has %d messages, want 1", r.Descriptor().FullName(), list.Len())
	}

	template := proto.Clone(list.Get(0).Message().Interface()).ProtoReflect()
	list.Truncate(0)

	for _, node := range nodes {
		var (
			m    protoreflect.Message
			meta *common.Metadata
		)

		if strings.HasPrefix(node, downPrefix) {
			m = template.New()
			meta = downMetadata(node, codes.Unavailable, "connection refused by "+node)
		} else {
			m = proto.Clone(template.Interface()).ProtoReflect()
			meta = &common.Metadata{Hostname: node}
		}

		m.Set(m.Descriptor().Fields().ByName("metadata"), protoreflect.ValueOfMessage(meta.ProtoReflect()))
		list.Append(protoreflect.ValueOfMessage(m))
	}

	return out, nil
}

// mismatch reports a request that differs from the one expected.
func mismatch(got, want proto.Message) error {
	return status.Errorf(codes.InvalidArgument, "%s mismatch:\n got: %s\nwant: %s",
		want.ProtoReflect().Descriptor().FullName(), prototext.Format(got), prototext.Format(want))
}

// answer checks routing and the request, then returns the canned answer for
// the target (aggregated for `nodes`). proto.Equal also compares unknown
// fields, so a field our client sends under a number upstream does not know
// is a mismatch too.
func answer[T proto.Message](ctx context.Context, got, want proto.Message, canned T) (T, error) {
	var zero T

	r, err := routeOf(ctx)
	if err != nil {
		return zero, err
	}

	if !proto.Equal(got, want) {
		return zero, mismatch(got, want)
	}

	if len(r.nodes) == 0 {
		return canned, nil
	}

	return aggregate(canned, r.nodes)
}

// singleRoute is routeOf for streams, which the stub serves one-to-one only.
func singleRoute(ctx context.Context) (route, error) {
	r, err := routeOf(ctx)
	if err == nil && len(r.nodes) > 0 {
		err = status.Error(codes.InvalidArgument, "the stub serves streams one-to-one only")
	}

	return r, err
}

type stubService struct {
	machine.UnimplementedMachineServiceServer
}

func (s *stubService) ApplyConfiguration(ctx context.Context, req *machine.ApplyConfigurationRequest) (*machine.ApplyConfigurationResponse, error) {
	return answer(ctx, req, expectApply, cannedApply)
}

func (s *stubService) Bootstrap(ctx context.Context, req *machine.BootstrapRequest) (*machine.BootstrapResponse, error) {
	return answer(ctx, req, expectBootstrap, cannedBootstrap)
}

func (s *stubService) EtcdMemberList(ctx context.Context, req *machine.EtcdMemberListRequest) (*machine.EtcdMemberListResponse, error) {
	return answer(ctx, req, expectMemberList, cannedMembers)
}

func (s *stubService) EtcdRemoveMemberByID(ctx context.Context, req *machine.EtcdRemoveMemberByIDRequest) (*machine.EtcdRemoveMemberByIDResponse, error) {
	return answer(ctx, req, expectRemoveMember, cannedRemoveMember)
}

func (s *stubService) EtcdLeaveCluster(ctx context.Context, req *machine.EtcdLeaveClusterRequest) (*machine.EtcdLeaveClusterResponse, error) {
	return answer(ctx, req, &machine.EtcdLeaveClusterRequest{}, cannedLeave)
}

func (s *stubService) EtcdForfeitLeadership(ctx context.Context, req *machine.EtcdForfeitLeadershipRequest) (*machine.EtcdForfeitLeadershipResponse, error) {
	return answer(ctx, req, &machine.EtcdForfeitLeadershipRequest{}, cannedForfeit)
}

func (s *stubService) EtcdAlarmList(ctx context.Context, req *emptypb.Empty) (*machine.EtcdAlarmListResponse, error) {
	return answer(ctx, req, &emptypb.Empty{}, cannedAlarmList)
}

func (s *stubService) EtcdAlarmDisarm(ctx context.Context, req *emptypb.Empty) (*machine.EtcdAlarmDisarmResponse, error) {
	return answer(ctx, req, &emptypb.Empty{}, cannedAlarmDisarm)
}

func (s *stubService) EtcdDefragment(ctx context.Context, req *emptypb.Empty) (*machine.EtcdDefragmentResponse, error) {
	return answer(ctx, req, &emptypb.Empty{}, cannedDefragment)
}

func (s *stubService) EtcdStatus(ctx context.Context, req *emptypb.Empty) (*machine.EtcdStatusResponse, error) {
	return answer(ctx, req, &emptypb.Empty{}, cannedStatus)
}

func (s *stubService) Hostname(ctx context.Context, req *emptypb.Empty) (*machine.HostnameResponse, error) {
	return answer(ctx, req, &emptypb.Empty{}, cannedHostname)
}

func (s *stubService) Version(ctx context.Context, req *emptypb.Empty) (*machine.VersionResponse, error) {
	return answer(ctx, req, &emptypb.Empty{}, cannedVersion)
}

func (s *stubService) ServiceList(ctx context.Context, req *emptypb.Empty) (*machine.ServiceListResponse, error) {
	return answer(ctx, req, &emptypb.Empty{}, cannedServices)
}

func (s *stubService) Reboot(ctx context.Context, req *machine.RebootRequest) (*machine.RebootResponse, error) {
	return answer(ctx, req, expectReboot, cannedReboot)
}

func (s *stubService) Shutdown(ctx context.Context, req *machine.ShutdownRequest) (*machine.ShutdownResponse, error) {
	return answer(ctx, req, expectShutdown, cannedShutdown)
}

func (s *stubService) Reset(ctx context.Context, req *machine.ResetRequest) (*machine.ResetResponse, error) {
	return answer(ctx, req, expectReset, cannedReset)
}

// EtcdSnapshot streams the canned chunks; for failingNode it stops after
// two of them with an error frame, as apid relays a backend failure.
func (s *stubService) EtcdSnapshot(req *machine.EtcdSnapshotRequest, srv grpc.ServerStreamingServer[common.Data]) error {
	r, err := singleRoute(srv.Context())
	if err != nil {
		return err
	}

	if !proto.Equal(req, &machine.EtcdSnapshotRequest{}) {
		return mismatch(req, &machine.EtcdSnapshotRequest{})
	}

	chunks := snapshotChunks()
	if r.node == failingNode {
		chunks = append(chunks[:2], &common.Data{
			Metadata: downMetadata(failingNode, codes.Aborted, "snapshot interrupted"),
		})
	}

	for _, chunk := range chunks {
		if err = srv.Send(chunk); err != nil {
			return err
		}
	}

	return nil
}

// EtcdRecover checks the uploaded bytes against the expected pattern.
func (s *stubService) EtcdRecover(srv grpc.ClientStreamingServer[common.Data, machine.EtcdRecoverResponse]) error {
	if _, err := singleRoute(srv.Context()); err != nil {
		return err
	}

	var received []byte

	for {
		chunk, err := srv.Recv()
		if errors.Is(err, io.EOF) {
			break
		}

		if err != nil {
			return err
		}

		if chunk.Metadata != nil || len(chunk.ProtoReflect().GetUnknown()) > 0 {
			return status.Errorf(codes.InvalidArgument, "upload chunk carries more than bytes: %s", prototext.Format(chunk))
		}

		received = append(received, chunk.Bytes...)
	}

	if len(received) != recoverSize {
		return status.Errorf(codes.InvalidArgument, "received %d bytes, want %d", len(received), recoverSize)
	}

	for i, b := range received {
		if b != recoverByte(i) {
			return status.Errorf(codes.InvalidArgument, "byte %d is %#x, want %#x", i, b, recoverByte(i))
		}
	}

	return srv.SendAndClose(cannedRecover)
}

type stubCluster struct {
	cluster.UnimplementedClusterServiceServer
}

func (c *stubCluster) HealthCheck(req *cluster.HealthCheckRequest, srv grpc.ServerStreamingServer[cluster.HealthCheckProgress]) error {
	if _, err := singleRoute(srv.Context()); err != nil {
		return err
	}

	if !proto.Equal(req, expectHealthCheck) {
		return mismatch(req, expectHealthCheck)
	}

	for _, progress := range healthProgress() {
		if err := srv.Send(progress); err != nil {
			return err
		}
	}

	return nil
}
