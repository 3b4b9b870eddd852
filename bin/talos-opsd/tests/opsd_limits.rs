//! The daemon under resource pressure and extreme input: out of file
//! descriptors it backs off instead of spinning and serves again once
//! descriptors are free; bad input gets one code per cause and a short,
//! quoted echo.

mod daemon;

use std::time::Duration;

use daemon::Daemon;
use talos_opsd::proto::ListOperationsRequest;
use talos_opsd::proto::{self, start_operation_request::Kind};
use talos_test_support::sim::wait_for;

/// User plus system CPU time of `pid`, in clock ticks.
fn cpu_ticks(pid: i32) -> u64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    // The fields after the command name (which is in parentheses).
    let rest = &stat[stat.rfind(')').unwrap() + 2..];
    let fields: Vec<&str> = rest.split_whitespace().collect();
    // utime and stime are fields 14 and 15 of the whole line.
    fields[11].parse::<u64>().unwrap() + fields[12].parse::<u64>().unwrap()
}

/// Sets the soft descriptor limit of `pid` (the hard one stays, so it can
/// be raised again without privileges).
fn set_nofile(pid: i32, limit: u64) {
    let mut old = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: prlimit on a child we own, reading into a valid rlimit.
    let rc = unsafe { libc::prlimit(pid, libc::RLIMIT_NOFILE, std::ptr::null(), &mut old) };
    assert_eq!(rc, 0, "prlimit: {}", std::io::Error::last_os_error());
    let new = libc::rlimit {
        rlim_cur: limit.min(old.rlim_max),
        rlim_max: old.rlim_max,
    };
    // SAFETY: as above, with a valid rlimit and no old value.
    let rc = unsafe { libc::prlimit(pid, libc::RLIMIT_NOFILE, &new, std::ptr::null_mut()) };
    assert_eq!(rc, 0, "prlimit: {}", std::io::Error::last_os_error());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn out_of_descriptors_the_daemon_backs_off_and_recovers() {
    let dir = tempfile::tempdir().unwrap();
    let d = Daemon::start(dir.path(), "").await;
    let mut client = d.client().await;
    client
        .list_operations(ListOperationsRequest::default())
        .await
        .unwrap();
    let pid = d.child.as_ref().unwrap().id() as i32;
    let open = std::fs::read_dir(format!("/proc/{pid}/fd"))
        .unwrap()
        .count() as u64;
    set_nofile(pid, open + 4);

    // More connections than the daemon has descriptors left: the rest wait
    // in the backlog, and each accept fails with EMFILE.
    let flood: Vec<_> = (0..32)
        .map(|_| std::os::unix::net::UnixStream::connect(&d.socket).unwrap())
        .collect();
    let limit = open + 4;
    wait_for(
        "the daemon at its descriptor limit",
        Duration::from_secs(20),
        || async move {
            let now = std::fs::read_dir(format!("/proc/{pid}/fd")).ok()?.count() as u64;
            (now >= limit).then_some(())
        },
    )
    .await;

    // A measuring window (not a synchronisation): a spinning accept loop
    // burns a whole core; backing off uses next to nothing.
    let ticks_per_second = unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as u64;
    let before = cpu_ticks(pid);
    let window = Duration::from_secs(2);
    tokio::time::sleep(window).await;
    let used = cpu_ticks(pid) - before;
    let budget = ticks_per_second * window.as_secs() / 4;
    assert!(
        used < budget,
        "the daemon used {used} ticks of CPU in {window:?} (budget {budget}) while out of descriptors"
    );

    assert!(
        d.log_text().contains("out of file descriptors"),
        "{}",
        d.log_text()
    );
    drop(flood);
    set_nofile(pid, 1024);
    let socket = d.socket.clone();
    wait_for("the daemon serving again", Duration::from_secs(20), || {
        let socket = socket.clone();
        async move {
            let mut client = daemon::connect_unix(&socket).await;
            client
                .list_operations(ListOperationsRequest::default())
                .await
                .ok()
        }
    })
    .await;
}

fn snapshot_on(cluster: &str) -> proto::StartOperationRequest {
    proto::StartOperationRequest {
        cluster: cluster.into(),
        plan_fingerprint: String::new(),
        without_cluster_lock: true,
        kind: Some(Kind::Snapshot(proto::SnapshotParams { keep: 0 })),
    }
}

fn code<T: std::fmt::Debug>(r: Result<T, tonic::Status>) -> tonic::Code {
    r.unwrap_err().code()
}

/// One code per cause, in every call: an unknown cluster or id is
/// NOT_FOUND, a malformed id or state is INVALID_ARGUMENT, and ids are
/// never patterns.
#[tokio::test]
async fn one_code_per_cause_in_every_call() {
    use tonic::Code;
    let dir = tempfile::tempdir().unwrap();
    let d = Daemon::start(dir.path(), "").await;
    let mut c = d.client().await;

    assert_eq!(
        code(c.plan_operation(snapshot_on("nope")).await),
        Code::NotFound
    );
    assert_eq!(
        code(c.start_operation(snapshot_on("nope")).await),
        Code::NotFound
    );
    let list = |cluster: &str, state: &str| proto::ListOperationsRequest {
        cluster: cluster.into(),
        state: state.into(),
    };
    assert_eq!(
        code(c.list_operations(list("nope", "")).await),
        Code::NotFound
    );
    assert_eq!(
        code(
            c.list_snapshots(proto::ListSnapshotsRequest {
                cluster: "nope".into()
            })
            .await
        ),
        Code::NotFound
    );
    assert_eq!(
        code(c.list_operations(list("", "bogus")).await),
        Code::InvalidArgument
    );
    c.list_operations(list("", "needs-attention"))
        .await
        .unwrap();

    for (id, want) in [
        ("20260101T000000-abcdef", Code::NotFound),
        ("%", Code::InvalidArgument),
        ("%b77554", Code::InvalidArgument),
        ("2026_", Code::InvalidArgument),
        ("", Code::InvalidArgument),
    ] {
        let get = c
            .get_operation(proto::GetOperationRequest { id: id.into() })
            .await;
        assert_eq!(code(get), want, "get {id:?}");
        let watch = c
            .watch_operation(proto::WatchOperationRequest { id: id.into() })
            .await;
        assert_eq!(code(watch), want, "watch {id:?}");
        let cancel = c
            .cancel_operation(proto::CancelOperationRequest { id: id.into() })
            .await;
        assert_eq!(code(cancel), want, "cancel {id:?}");
    }
    let long = "a".repeat(3 << 20);
    let get = c
        .get_operation(proto::GetOperationRequest { id: long })
        .await;
    let status = get.unwrap_err();
    assert_eq!(status.code(), Code::InvalidArgument, "{}", status.message());
    assert!(status.message().len() < 200, "{}", status.message().len());
}

/// A megabyte of name or node is refused as INVALID_ARGUMENT with a short
/// message (never RESOURCE_EXHAUSTED from an oversized trailer), and the
/// audit line carries a cut, quoted form.
#[tokio::test]
async fn oversized_inputs_are_refused_short_and_logged_short() {
    use tonic::Code;
    let dir = tempfile::tempdir().unwrap();
    let d = Daemon::start(dir.path(), "").await;
    let mut c = d.client().await;
    let huge = "x".repeat(1 << 20);

    let status = c.plan_operation(snapshot_on(&huge)).await.unwrap_err();
    assert_eq!(status.code(), Code::InvalidArgument, "{}", status.message());
    assert!(status.message().len() < 300, "{}", status.message().len());

    let mut retire = snapshot_on("a");
    retire.kind = Some(Kind::Retire(proto::RetireParams {
        node: huge.clone(),
        ..Default::default()
    }));
    let status = c.start_operation(retire).await.unwrap_err();
    assert_eq!(status.code(), Code::InvalidArgument, "{}", status.message());
    assert!(status.message().contains("node"), "{}", status.message());
    assert!(status.message().len() < 300, "{}", status.message().len());

    let status = c
        .list_operations(proto::ListOperationsRequest {
            cluster: huge.clone(),
            state: String::new(),
        })
        .await
        .unwrap_err();
    assert_eq!(status.code(), Code::InvalidArgument, "{}", status.message());

    let log = d.log_text();
    assert!(log.contains("bytes)"), "{log}");
    let longest = log.lines().map(str::len).max().unwrap_or(0);
    assert!(longest < 4096, "an audit line of {longest} bytes");
}

/// A message whose field 1 is a number where a string is due.
#[derive(Clone, PartialEq, prost::Message)]
struct Undecodable {
    #[prost(uint64, tag = "1")]
    id: u64,
}

/// A request that does not decode as the call's message is malformed
/// input, `INVALID_ARGUMENT`, as every other; never `INTERNAL`.
#[tokio::test]
async fn an_undecodable_request_is_invalid_argument() {
    let dir = tempfile::tempdir().unwrap();
    let d = Daemon::start(dir.path(), "").await;
    let channel = daemon::connect_unix_channel(&d.socket).await;
    for path in [
        "/opsd.v1.Opsd/GetOperation",
        "/opsd.v1.Opsd/ListOperations",
        "/opsd.v1.Opsd/StartOperation",
    ] {
        let mut grpc = tonic::client::Grpc::new(channel.clone());
        grpc.ready().await.unwrap();
        let refused = grpc
            .unary::<_, Undecodable, _>(
                tonic::Request::new(Undecodable { id: 7 }),
                tonic::codegen::http::uri::PathAndQuery::from_static(path),
                tonic_prost::ProstCodec::default(),
            )
            .await
            .unwrap_err();
        assert_eq!(
            refused.code(),
            tonic::Code::InvalidArgument,
            "{path}: {refused:?}"
        );
        assert!(refused.message().contains("decode"), "{path}: {refused:?}");
    }
    // Still serving.
    d.client()
        .await
        .list_operations(ListOperationsRequest::default())
        .await
        .unwrap();
}

/// One HTTP/2 frame.
fn h2_frame(kind: u8, flags: u8, stream: u32, payload: &[u8]) -> Vec<u8> {
    let len = payload.len();
    let mut f = vec![(len >> 16) as u8, (len >> 8) as u8, len as u8, kind, flags];
    f.extend_from_slice(&stream.to_be_bytes());
    f.extend_from_slice(payload);
    f
}

/// A ListOperations call as grpc-python sends it (headers as HPACK
/// literals without indexing), with `authority` as its `:authority`; the
/// server's answer on stream 1: `Ok(HEADERS flags)` or `Err(RST_STREAM
/// code)`.
async fn raw_call(socket: &std::path::Path, authority: &str) -> Result<u8, u32> {
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
    let mut block = Vec::new();
    for (name, value) in [
        (":method", "POST"),
        (":scheme", "http"),
        (":path", "/opsd.v1.Opsd/ListOperations"),
        (":authority", authority),
        ("content-type", "application/grpc"),
        ("te", "trailers"),
    ] {
        block.push(0x00);
        block.push(name.len() as u8);
        block.extend_from_slice(name.as_bytes());
        block.push(value.len() as u8);
        block.extend_from_slice(value.as_bytes());
    }
    let mut out = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n".to_vec();
    out.extend(h2_frame(0x4, 0, 0, &[]));
    out.extend(h2_frame(0x1, 0x4, 1, &block));
    out.extend(h2_frame(0x0, 0x1, 1, &[0, 0, 0, 0, 0]));
    let mut conn = tokio::net::UnixStream::connect(socket).await.unwrap();
    conn.write_all(&out).await.unwrap();
    let answer = async {
        loop {
            let mut head = [0u8; 9];
            conn.read_exact(&mut head).await.unwrap();
            let len =
                (usize::from(head[0]) << 16) | (usize::from(head[1]) << 8) | usize::from(head[2]);
            let mut payload = vec![0u8; len];
            conn.read_exact(&mut payload).await.unwrap();
            let stream = u32::from_be_bytes([head[5], head[6], head[7], head[8]]);
            match (head[3], stream) {
                (0x1, 1) => return Ok(head[4]),
                (0x3, 1) => {
                    return Err(u32::from_be_bytes([
                        payload[0], payload[1], payload[2], payload[3],
                    ]));
                }
                _ => {}
            }
        }
    };
    tokio::time::timeout(Duration::from_secs(10), answer)
        .await
        .expect("an answer on stream 1")
}

/// Stock grpc-python (C-core) sends the socket's path, percent-encoded, as
/// `:authority` for `unix:/tmp/d28/opsd.sock`. HTTP/2 refuses it before the
/// API (a stream reset, PROTOCOL_ERROR), and that refusal is audited with
/// the caller and the fix; with `localhost` the same call is served.
#[tokio::test]
async fn a_socket_path_as_authority_is_refused_with_an_audit_line() {
    let dir = tempfile::tempdir().unwrap();
    let d = Daemon::start(dir.path(), "").await;
    assert_eq!(raw_call(&d.socket, "tmp%2Fd28%2Fopsd.sock").await, Err(1));
    assert!(raw_call(&d.socket, "localhost").await.is_ok());
    let log = wait_for("the audit lines", Duration::from_secs(10), || {
        let log = d.log_text();
        async move {
            (log.contains("request refused before it reached the API")
                && log.contains("list cluster="))
            .then_some(log)
        }
    })
    .await;
    let refused = log
        .lines()
        .find(|l| l.contains("request refused before it reached the API"))
        .unwrap();
    assert!(refused.contains("audit"), "{refused}");
    assert!(refused.contains("uid="), "{refused}");
    assert!(refused.contains(":authority"), "{refused}");
    assert!(refused.contains("grpc.default_authority"), "{refused}");
}

/// The largest numbers the API can carry reach no panic: every duration
/// option at `u32::MAX` seconds, and thresholds that are not a ratio, are
/// `INVALID_ARGUMENT` naming the option and its bounds (with the typed
/// reason attached); `keep` at its maximum plans; the daemon serves on and
/// the cluster is unchanged.
#[tokio::test]
async fn extreme_numbers_are_refused_by_name_and_nothing_panics() {
    use tonic::Code;
    let sim = talos_test_support::sim::SimCluster::start(3).await;
    let dir = tempfile::tempdir().unwrap();
    let tc = sim.dir.path().join("talosconfig");
    let d = Daemon::start(dir.path(), &daemon::cluster_toml("a", &tc, "")).await;
    let mut c = d.client().await;
    let on_a = |kind: Kind| proto::StartOperationRequest {
        cluster: "a".into(),
        plan_fingerprint: String::new(),
        without_cluster_lock: true,
        kind: Some(kind),
    };
    let max = u32::MAX;
    let node = sim.ip(3);
    let durations = [
        (
            "silence_timeout",
            Kind::Retire(proto::RetireParams {
                node: node.clone(),
                silence_timeout_s: max,
                ..Default::default()
            }),
        ),
        (
            "timeout",
            Kind::Join(proto::JoinParams {
                node: node.clone(),
                timeout_s: max,
                ..Default::default()
            }),
        ),
        (
            "join_timeout",
            Kind::Migrate(proto::MigrateParams {
                from: sim.ip(2),
                to: node.clone(),
                join_timeout_s: max,
                ..Default::default()
            }),
        ),
        (
            "silence_timeout",
            Kind::Migrate(proto::MigrateParams {
                from: sim.ip(2),
                to: node.clone(),
                silence_timeout_s: max,
                ..Default::default()
            }),
        ),
        (
            "try_timeout",
            Kind::Apply(proto::ApplyParams {
                nodes: vec![node.clone()],
                config_path: "/nonexistent.yaml".into(),
                try_timeout_s: max,
                ..Default::default()
            }),
        ),
        (
            "reboot_timeout",
            Kind::Apply(proto::ApplyParams {
                nodes: vec![node.clone()],
                config_path: "/nonexistent.yaml".into(),
                reboot_timeout_s: max,
                ..Default::default()
            }),
        ),
    ];
    for (option, kind) in durations {
        for start in [false, true] {
            let request = on_a(kind.clone());
            let status = if start {
                c.start_operation(request).await.unwrap_err()
            } else {
                c.plan_operation(request).await.unwrap_err()
            };
            assert_eq!(status.code(), Code::InvalidArgument, "{option}: {status:?}");
            assert!(status.message().contains(option), "{status:?}");
            assert!(
                matches!(
                    talos_opsd_api::refusal_of(&status),
                    Some(talos_client::ops::Refusal::OutOfBounds { .. })
                ),
                "{status:?}"
            );
        }
    }
    for threshold in [f64::NAN, f64::INFINITY, f64::NEG_INFINITY, -1.0, 0.0, 1e308] {
        let status = c
            .plan_operation(on_a(Kind::Defrag(proto::DefragParams {
                threshold: Some(threshold),
                ..Default::default()
            })))
            .await
            .unwrap_err();
        assert_eq!(
            status.code(),
            Code::InvalidArgument,
            "{threshold}: {status:?}"
        );
    }
    let plan = c
        .plan_operation(on_a(Kind::Snapshot(proto::SnapshotParams { keep: max })))
        .await
        .unwrap()
        .into_inner();
    assert!(!plan.steps.is_empty(), "{plan:?}");
    drop(plan);
    c.list_operations(ListOperationsRequest::default())
        .await
        .expect("the daemon still serves");
    let members = sim
        .admin()
        .node(sim.ip(1).as_str())
        .etcd_member_list(false)
        .await
        .unwrap();
    assert_eq!(members.len(), 3);
    assert!(!d.log_text().contains("panicked"), "{}", d.log_text());
}
