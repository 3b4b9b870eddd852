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
