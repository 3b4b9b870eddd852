//! Building and running the Go programs of tests/interop.
//!
//! The binaries come from `INTEROP_BIN_DIR` when build.sh built them, else
//! each test process builds them with `go build`. A missing Go toolchain or
//! an unreachable module proxy fails the test: it never skips.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::OnceLock;
use std::time::Duration;

use tokio::io::{AsyncBufReadExt as _, BufReader};
use tokio::process::{Child, Command};

/// The Go module.
pub fn module_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/interop")
}

/// The directory holding `driver` and `stubserver`.
pub fn go_binaries() -> &'static Path {
    static BUILT: OnceLock<Result<PathBuf, String>> = OnceLock::new();
    match BUILT.get_or_init(find_or_build) {
        Ok(dir) => dir,
        Err(message) => panic!("{message}"),
    }
}

const PROGRAMS: [&str; 2] = ["driver", "stubserver"];

fn find_or_build() -> Result<PathBuf, String> {
    if let Some(dir) = std::env::var_os("INTEROP_BIN_DIR") {
        let dir = PathBuf::from(dir);
        for program in PROGRAMS {
            if !dir.join(program).is_file() {
                return Err(format!(
                    "INTEROP_BIN_DIR={} lacks {program}: run tests/interop/run.sh",
                    dir.display()
                ));
            }
        }
        return Ok(dir);
    }
    let out = Path::new(env!("CARGO_TARGET_TMPDIR")).join("interop-go-bin");
    let module = module_dir();
    let go = |args: &[&str]| {
        std::process::Command::new("go")
            .args(args)
            .current_dir(&module)
            // Use the installed toolchain; never download another, never
            // rewrite go.mod or go.sum.
            .env("GOTOOLCHAIN", "local")
            .env("GOFLAGS", "-mod=readonly")
            .output()
    };
    let version = go(&["version"]).map_err(|e| {
        format!(
            "the interop tests need the Go toolchain (tests/interop is a Go module), \
             but `go` could not be run: {e}. Install Go {} or newer.",
            go_directive(&module)
        )
    })?;
    if !version.status.success() {
        return Err(format!(
            "`go version` failed: {}",
            String::from_utf8_lossy(&version.stderr)
        ));
    }
    // Built into a directory of this process's own, then renamed into
    // place: test runners that run each test in a process of its own
    // (nextest) build in several processes at once, and two `go build`s
    // writing the same file leave a truncated binary to a third that runs it.
    // A rename replaces the file whole (a process running the old one keeps
    // it); the Go build cache makes every build after the first a link.
    std::fs::create_dir_all(&out).map_err(|e| format!("create {}: {e}", out.display()))?;
    let staging = tempfile::Builder::new()
        .prefix("interop-go-build-")
        .tempdir_in(env!("CARGO_TARGET_TMPDIR"))
        .map_err(|e| {
            format!(
                "create a build directory in {}: {e}",
                env!("CARGO_TARGET_TMPDIR")
            )
        })?;
    let target = format!("{}/", staging.path().display());
    let build = go(&["build", "-o", &target, "./cmd/..."])
        .map_err(|e| format!("cannot run go build: {e}"))?;
    if !build.status.success() {
        return Err(format!(
            "building the Go interop programs failed ({}).\n\
             If modules are missing, Go downloads them from the module proxy \
             (GOPROXY={}); that proxy must be reachable.\n--- go build stderr ---\n{}",
            String::from_utf8_lossy(&version.stdout).trim(),
            go(&["env", "GOPROXY"])
                .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
                .unwrap_or_default(),
            String::from_utf8_lossy(&build.stderr)
        ));
    }
    for program in PROGRAMS {
        std::fs::rename(staging.path().join(program), out.join(program))
            .map_err(|e| format!("move {program} into {}: {e}", out.display()))?;
    }
    Ok(out)
}

/// The `go` directive of go.mod, for messages.
fn go_directive(module: &Path) -> String {
    std::fs::read_to_string(module.join("go.mod"))
        .ok()
        .and_then(|text| {
            text.lines()
                .find_map(|l| l.strip_prefix("go ").map(str::to_string))
        })
        .unwrap_or_else(|| "?".into())
}

/// A running stub server, killed when dropped (also when a test panics).
/// Its stdin is a pipe: if this process dies, the stub sees end-of-file
/// and exits by itself.
pub struct StubServer {
    pub endpoint: String,
    pub dir: tempfile::TempDir,
    _child: Child,
}

impl StubServer {
    pub fn talosconfig(&self) -> PathBuf {
        self.dir.path().join("talosconfig")
    }

    pub fn dump_dir(&self) -> PathBuf {
        self.dir.path().join("dump")
    }

    fn stderr(dir: &Path) -> String {
        std::fs::read_to_string(dir.join("stderr")).unwrap_or_default()
    }

    pub async fn start() -> StubServer {
        let dir = tempfile::tempdir().unwrap();
        let stderr = std::fs::File::create(dir.path().join("stderr")).unwrap();
        let mut child = Command::new(go_binaries().join("stubserver"))
            .arg("--talosconfig")
            .arg(dir.path().join("talosconfig"))
            .arg("--dump-dir")
            .arg(dir.path().join("dump"))
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(stderr)
            .kill_on_drop(true)
            .spawn()
            .expect("start stubserver");
        let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
        let first = tokio::time::timeout(Duration::from_secs(60), lines.next_line()).await;
        let endpoint = match first {
            Ok(Ok(Some(line))) if line.starts_with("LISTENING ") => {
                line["LISTENING ".len()..].trim().to_string()
            }
            other => panic!(
                "stubserver did not report LISTENING: {other:?}\n--- stderr ---\n{}",
                Self::stderr(dir.path())
            ),
        };
        StubServer {
            endpoint,
            dir,
            _child: child,
        }
    }
}

/// What the driver printed and how it ended.
pub struct DriverRun {
    pub success: bool,
    pub output: String,
}

/// Runs the driver to completion (killed if it outlives `timeout`).
pub async fn run_driver(args: &[std::ffi::OsString], timeout: Duration) -> DriverRun {
    let child = Command::new(go_binaries().join("driver"))
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("start driver");
    let output = match tokio::time::timeout(timeout, child.wait_with_output()).await {
        Ok(output) => output.expect("wait for driver"),
        Err(_) => panic!("the driver did not finish within {timeout:?}"),
    };
    DriverRun {
        success: output.status.success(),
        output: format!(
            "{}\n--- driver stderr ---\n{}\n(exit: {})",
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr),
            output.status
        ),
    }
}
