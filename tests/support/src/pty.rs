//! A pseudo-terminal for tests that answer a prompt as a person would:
//! the program's stdin and stderr on the terminal side, the test reading
//! what it shows and typing on the controller side.

use std::io::Read as _;
use std::os::fd::{FromRawFd as _, OwnedFd};
use std::sync::mpsc;
use std::time::{Duration, Instant};

/// A pseudo-terminal: (controller, terminal).
pub fn openpty() -> (OwnedFd, OwnedFd) {
    let (mut controller, mut terminal) = (-1, -1);
    // SAFETY: openpty writes two new descriptors into the given ints; the
    // name, termios and window size pointers may be null.
    let rc = unsafe {
        libc::openpty(
            &mut controller,
            &mut terminal,
            std::ptr::null_mut(),
            std::ptr::null(),
            std::ptr::null(),
        )
    };
    assert_eq!(rc, 0, "openpty: {}", std::io::Error::last_os_error());
    // SAFETY: both descriptors are new and owned by nobody else.
    unsafe {
        (
            OwnedFd::from_raw_fd(controller),
            OwnedFd::from_raw_fd(terminal),
        )
    }
}

/// Everything the terminal shows, read on a thread, until `needle` appears
/// or the deadline passes.
pub struct Screen {
    text: String,
    chunks: mpsc::Receiver<String>,
}

impl Screen {
    pub fn new(controller: std::fs::File) -> Screen {
        let (tx, chunks) = mpsc::channel();
        let mut controller = controller;
        std::thread::spawn(move || {
            let mut buf = [0u8; 4096];
            while let Ok(n) = controller.read(&mut buf) {
                if n == 0
                    || tx
                        .send(String::from_utf8_lossy(&buf[..n]).into_owned())
                        .is_err()
                {
                    return;
                }
            }
        });
        Screen {
            text: String::new(),
            chunks,
        }
    }

    /// Everything shown until nothing more arrives for `idle` (after the
    /// program ended, what it wrote last).
    pub fn drain(&mut self, idle: Duration) -> &str {
        while let Ok(chunk) = self.chunks.recv_timeout(idle) {
            self.text.push_str(&chunk);
        }
        &self.text
    }

    pub fn wait_for(&mut self, needle: &str, within: Duration) -> &str {
        let deadline = Instant::now() + within;
        while !self.text.contains(needle) {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.chunks.recv_timeout(left) {
                Ok(chunk) => self.text.push_str(&chunk),
                Err(_) => panic!("{needle:?} not shown within {within:?}:\n{}", self.text),
            }
        }
        &self.text
    }
}

/// Runs `command` as the foreground job of the terminal side of a new
/// pseudo-terminal, as a shell runs a command a person typed: its own
/// session, the terminal its controlling terminal and its stdin, stdout
/// and stderr. Typing Ctrl-C ([`CTRL_C`]) on the returned controller then
/// sends the process SIGINT through the terminal's line discipline.
pub fn spawn_in_terminal(
    command: &mut std::process::Command,
) -> (std::process::Child, std::fs::File) {
    use std::os::unix::process::CommandExt as _;
    use std::process::Stdio;
    let (controller, terminal) = openpty();
    command
        .stdin(Stdio::from(terminal.try_clone().unwrap()))
        .stdout(Stdio::from(terminal.try_clone().unwrap()))
        .stderr(Stdio::from(terminal));
    // SAFETY: setsid and ioctl are async-signal-safe; they only change the
    // child's session and controlling terminal (its stdin, fd 0).
    unsafe {
        command.pre_exec(|| {
            if libc::setsid() < 0 || libc::ioctl(0, libc::TIOCSCTTY, 0) < 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let child = command.spawn().expect("the command starts");
    (child, std::fs::File::from(controller))
}

/// What Ctrl-C types.
pub const CTRL_C: &[u8] = b"\x03";
