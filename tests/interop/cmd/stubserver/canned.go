package main

import (
	"time"

	"github.com/siderolabs/talos/pkg/machinery/api/cluster"
	"github.com/siderolabs/talos/pkg/machinery/api/common"
	"github.com/siderolabs/talos/pkg/machinery/api/machine"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"
)

// The contract with tests/interop.rs: the Rust side builds the same values
// from its own protos and compares. Every field is set, to a value unique
// enough that a swapped field number or type shows up as a mismatch.

// Routing targets the Rust test uses in `node` metadata.
const (
	// stubNode is the one node the stub answers for with its canned answers.
	stubNode = "10.20.30.40"
	// deniedNode makes any call fail with PermissionDenied.
	deniedNode = "denied.invalid"
	// failingNode makes EtcdSnapshot end with an in-stream error frame.
	failingNode = "snapshot-fails.invalid"
	// downPrefix marks `nodes` entries that answer like an unreachable node.
	downPrefix = "down-"
	// answerHostname is metadata.hostname on every canned message.
	answerHostname = "stub-host"
)

// Snapshot and recover payloads: deterministic byte patterns.
var (
	snapshotChunkSizes = []int{1024, 1024, 777}
	recoverSize        = 5000
)

func snapshotByte(i int) byte { return byte((i*31 + 7) % 256) }

func recoverByte(i int) byte { return byte((i*13 + 5) % 256) }

func md() *common.Metadata { return &common.Metadata{Hostname: answerHostname} }

func ts(seconds int64, nanos int32) *timestamppb.Timestamp {
	return &timestamppb.Timestamp{Seconds: seconds, Nanos: nanos}
}

func memberAlarms(a, b uint64, first, second machine.EtcdMemberAlarm_AlarmType) []*machine.EtcdMemberAlarm {
	return []*machine.EtcdMemberAlarm{{MemberId: a, Alarm: first}, {MemberId: b, Alarm: second}}
}

var (
	cannedApply = &machine.ApplyConfigurationResponse{Messages: []*machine.ApplyConfiguration{{
		Metadata:    md(),
		Warnings:    []string{"apply warning one", "apply warning two"},
		Mode:        machine.ApplyConfigurationRequest_STAGED,
		ModeDetails: "apply mode details: staged for next boot",
	}}}
	cannedBootstrap = &machine.BootstrapResponse{Messages: []*machine.Bootstrap{{Metadata: md()}}}
	cannedMembers   = &machine.EtcdMemberListResponse{Messages: []*machine.EtcdMembers{{
		Metadata:      md(),
		LegacyMembers: []string{"legacy-member-a", "legacy-member-b"},
		Members: []*machine.EtcdMember{
			{
				Id:         0x8000000000000001,
				Hostname:   "member-one",
				PeerUrls:   []string{"https://10.0.1.1:2380", "https://[fd00::1]:2380"},
				ClientUrls: []string{"https://10.0.1.1:2379", "https://[fd00::1]:2379"},
				IsLearner:  false,
			},
			{
				Id:         0x0123456789abcdef,
				Hostname:   "member-two",
				PeerUrls:   []string{"https://10.0.1.2:2380", "https://[fd00::2]:2380"},
				ClientUrls: []string{"https://10.0.1.2:2379", "https://[fd00::2]:2379"},
				IsLearner:  true,
			},
		},
	}}}
	cannedRemoveMember = &machine.EtcdRemoveMemberByIDResponse{Messages: []*machine.EtcdRemoveMemberByID{{Metadata: md()}}}
	cannedLeave        = &machine.EtcdLeaveClusterResponse{Messages: []*machine.EtcdLeaveCluster{{Metadata: md()}}}
	cannedForfeit      = &machine.EtcdForfeitLeadershipResponse{Messages: []*machine.EtcdForfeitLeadership{{
		Metadata: md(),
		Member:   "member-two",
	}}}
	cannedRecover   = &machine.EtcdRecoverResponse{Messages: []*machine.EtcdRecover{{Metadata: md()}}}
	cannedAlarmList = &machine.EtcdAlarmListResponse{Messages: []*machine.EtcdAlarm{{
		Metadata:     md(),
		MemberAlarms: memberAlarms(0x8000000000000001, 0x0123456789abcdef, machine.EtcdMemberAlarm_NOSPACE, machine.EtcdMemberAlarm_CORRUPT),
	}}}
	cannedAlarmDisarm = &machine.EtcdAlarmDisarmResponse{Messages: []*machine.EtcdAlarmDisarm{{
		Metadata:     md(),
		MemberAlarms: memberAlarms(0x1111, 0x2222, machine.EtcdMemberAlarm_CORRUPT, machine.EtcdMemberAlarm_NOSPACE),
	}}}
	cannedDefragment = &machine.EtcdDefragmentResponse{Messages: []*machine.EtcdDefragment{{Metadata: md()}}}
	cannedStatus     = &machine.EtcdStatusResponse{Messages: []*machine.EtcdStatus{{
		Metadata: md(),
		MemberStatus: &machine.EtcdMemberStatus{
			StorageVersion:   "3.6.0-storage",
			MemberId:         0x0123456789abcdef,
			ProtocolVersion:  "3.6.0-protocol",
			DbSize:           1<<40 + 1,
			DbSizeInUse:      2_222_222,
			Leader:           0x8000000000000001,
			RaftIndex:        3333,
			RaftTerm:         44,
			RaftAppliedIndex: 3332,
			Errors:           []string{"status error one", "status error two"},
			IsLearner:        true,
		},
	}}}
	cannedHostname = &machine.HostnameResponse{Messages: []*machine.Hostname{{
		Metadata: md(),
		Hostname: "answered-hostname",
	}}}
	cannedVersion = &machine.VersionResponse{Messages: []*machine.Version{{
		Metadata: md(),
		Version: &machine.VersionInfo{
			Tag:       "v1.13.9-interop",
			Sha:       "sha-0123abcd",
			Built:     "built-2026-08-21T10:11:12Z",
			GoVersion: "go1.26.8-interop",
			Os:        "os-linux",
			Arch:      "arch-amd64",
		},
		Platform: &machine.PlatformInfo{Name: "platform-metal", Mode: "mode-metal"},
		Features: &machine.FeaturesInfo{Rbac: true},
	}}}
	cannedServices = &machine.ServiceListResponse{Messages: []*machine.ServiceList{{
		Metadata: md(),
		Services: []*machine.ServiceInfo{
			{
				Id:    "etcd",
				State: "Running",
				Events: &machine.ServiceEvents{Events: []*machine.ServiceEvent{
					{Msg: "Starting etcd", State: "Preparing", Ts: ts(1_700_000_001, 111)},
					{Msg: "Started etcd", State: "Running", Ts: ts(1_700_000_002, 222_000_222)},
				}},
				Health: &machine.ServiceHealth{Unknown: false, Healthy: true, LastMessage: "etcd is healthy", LastChange: ts(1_700_000_003, 333)},
			},
			{
				Id:    "apid",
				State: "Waiting",
				Events: &machine.ServiceEvents{Events: []*machine.ServiceEvent{
					{Msg: "Waiting for network", State: "Waiting", Ts: ts(1_700_000_004, 444)},
					{Msg: "Still waiting", State: "Waiting", Ts: ts(1_700_000_005, 555)},
				}},
				Health: &machine.ServiceHealth{Unknown: true, Healthy: false, LastMessage: "apid health unknown", LastChange: ts(1_700_000_006, 666)},
			},
		},
	}}}
	cannedReboot   = &machine.RebootResponse{Messages: []*machine.Reboot{{Metadata: md(), ActorId: "actor-reboot-0001"}}}
	cannedShutdown = &machine.ShutdownResponse{Messages: []*machine.Shutdown{{Metadata: md(), ActorId: "actor-shutdown-0002"}}}
	cannedReset    = &machine.ResetResponse{Messages: []*machine.Reset{{Metadata: md(), ActorId: "actor-reset-0003"}}}
)

// snapshotChunks is the streamed EtcdSnapshot answer.
func snapshotChunks() []*common.Data {
	chunks := make([]*common.Data, 0, len(snapshotChunkSizes))
	offset := 0

	for _, size := range snapshotChunkSizes {
		data := make([]byte, size)
		for i := range data {
			data[i] = snapshotByte(offset + i)
		}

		offset += size

		chunks = append(chunks, &common.Data{Metadata: md(), Bytes: data})
	}

	return chunks
}

// healthProgress is the streamed HealthCheck answer.
func healthProgress() []*cluster.HealthCheckProgress {
	return []*cluster.HealthCheckProgress{
		{Metadata: md(), Message: "health progress one"},
		{Metadata: md(), Message: "health progress two"},
		{Metadata: md(), Message: "health progress three"},
	}
}

// The requests the Rust test must send, field for field.
var (
	expectApply = &machine.ApplyConfigurationRequest{
		Data:           []byte("# interop apply-config payload\nversion: v1alpha1\n"),
		Mode:           machine.ApplyConfigurationRequest_TRY,
		DryRun:         true,
		TryModeTimeout: durationpb.New(90*time.Second + 250*time.Millisecond),
	}
	expectBootstrap    = &machine.BootstrapRequest{RecoverEtcd: true, RecoverSkipHashCheck: true}
	expectMemberList   = &machine.EtcdMemberListRequest{QueryLocal: true}
	expectRemoveMember = &machine.EtcdRemoveMemberByIDRequest{MemberId: 0xfedcba9876543210}
	expectReboot       = &machine.RebootRequest{Mode: machine.RebootRequest_POWERCYCLE}
	expectShutdown     = &machine.ShutdownRequest{Force: true}
	expectReset        = &machine.ResetRequest{
		Graceful: true,
		Reboot:   true,
		SystemPartitionsToWipe: []*machine.ResetPartitionSpec{
			{Label: "STATE", Wipe: true},
			{Label: "EPHEMERAL", Wipe: true},
		},
		UserDisksToWipe: []string{"/dev/sdb", "/dev/nvme1n1"},
		Mode:            machine.ResetRequest_SYSTEM_DISK,
	}
	expectHealthCheck = &cluster.HealthCheckRequest{
		WaitTimeout: durationpb.New(123*time.Second + 500*time.Millisecond),
		ClusterInfo: &cluster.ClusterInfo{
			ControlPlaneNodes: []string{"10.0.0.1", "10.0.0.2"},
			WorkerNodes:       []string{"10.0.0.3", "10.0.0.4"},
			ForceEndpoint:     "k8s.interop.invalid:6443",
		},
	}
)

// cannedByName names every canned answer (and expected request) for the
// completeness check and the dump.
func cannedByName() map[string]proto.Message {
	out := map[string]proto.Message{
		"ApplyConfiguration":    cannedApply,
		"Bootstrap":             cannedBootstrap,
		"EtcdMemberList":        cannedMembers,
		"EtcdRemoveMemberByID":  cannedRemoveMember,
		"EtcdLeaveCluster":      cannedLeave,
		"EtcdForfeitLeadership": cannedForfeit,
		"EtcdRecover":           cannedRecover,
		"EtcdAlarmList":         cannedAlarmList,
		"EtcdAlarmDisarm":       cannedAlarmDisarm,
		"EtcdDefragment":        cannedDefragment,
		"EtcdStatus":            cannedStatus,
		"Hostname":              cannedHostname,
		"Version":               cannedVersion,
		"ServiceList":           cannedServices,
		"Reboot":                cannedReboot,
		"Shutdown":              cannedShutdown,
		"Reset":                 cannedReset,
		"EtcdMemberList.aggregate": mustAggregate(cannedMembers,
			[]string{"node-a", downPrefix + "b", "node-c"}),
		"request.ApplyConfiguration":   expectApply,
		"request.Bootstrap":            expectBootstrap,
		"request.EtcdMemberList":       expectMemberList,
		"request.EtcdRemoveMemberByID": expectRemoveMember,
		"request.Reboot":               expectReboot,
		"request.Shutdown":             expectShutdown,
		"request.Reset":                expectReset,
		"request.HealthCheck":          expectHealthCheck,
	}

	for i, chunk := range snapshotChunks() {
		out["EtcdSnapshot."+itoa(i)] = chunk
	}

	for i, progress := range healthProgress() {
		out["HealthCheck."+itoa(i)] = progress
	}

	return out
}

func itoa(i int) string { return string(rune('0' + i)) }

func mustAggregate[T proto.Message](canned T, nodes []string) T {
	out, err := aggregate(canned, nodes)
	if err != nil {
		panic(err)
	}

	return out
}
