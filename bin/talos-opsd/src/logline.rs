//! One event, one line: the text log's writer escapes every control
//! character an event's text holds (but the line's own end), whatever put
//! it there, so no field or message can start a line of its own, forge an
//! audit line or move a terminal's cursor. The operator-supplied strings
//! in the daemon's messages are already quoted and escaped where they are
//! written ([`talos_client::text`]); this is the guarantee for the rest.

use std::io::{self, Write};

use tracing_subscriber::fmt::MakeWriter;

/// The text log's writer: standard error, one line per event.
#[derive(Debug, Clone, Copy)]
pub struct OneLine {
    /// Colours are on (a terminal): their escape character is kept.
    ansi: bool,
}

impl OneLine {
    /// A writer to standard error; `ansi` when colours are written.
    pub fn new(ansi: bool) -> OneLine {
        OneLine { ansi }
    }

    /// `event` (one formatted event, ending in a newline) with every
    /// control character escaped but its last newline (and, with colours,
    /// the escape character that starts them).
    pub fn clean(&self, event: &str) -> String {
        let (body, end) = match event.strip_suffix('\n') {
            Some(body) => (body, "\n"),
            None => (event, ""),
        };
        let mut out = String::with_capacity(event.len() + 8);
        let mut pieces = if self.ansi {
            body.split('\u{1b}').collect::<Vec<_>>()
        } else {
            vec![body]
        };
        let last = pieces.pop().unwrap_or_default();
        for piece in pieces {
            let _ = talos_client::text::escape_into(&mut out, piece, usize::MAX, false);
            out.push('\u{1b}');
        }
        let _ = talos_client::text::escape_into(&mut out, last, usize::MAX, false);
        out.push_str(end);
        out
    }
}

impl<'a> MakeWriter<'a> for OneLine {
    type Writer = OneLineWriter;
    fn make_writer(&'a self) -> OneLineWriter {
        OneLineWriter(*self)
    }
}

/// Writes one event at a time to standard error.
#[derive(Debug)]
pub struct OneLineWriter(OneLine);

impl Write for OneLineWriter {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let clean = self.0.clean(&String::from_utf8_lossy(buf));
        io::stderr().lock().write_all(clean.as_bytes())?;
        Ok(buf.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        io::stderr().flush()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_event_stays_one_line() {
        let forged = "INFO audit: reason=x\n2026-12-07T12:00:00Z  INFO audit: who=root result=\"ok\"\r\u{1b}[2J\n";
        let plain = OneLine::new(false).clean(forged);
        assert_eq!(plain.matches('\n').count(), 1, "{plain:?}");
        assert!(plain.ends_with("[2J\n"), "{plain:?}");
        assert!(!plain.contains('\u{1b}'), "{plain:?}");
        let coloured = OneLine::new(true).clean("\u{1b}[32mINFO\u{1b}[0m a\nb\n");
        assert_eq!(coloured, "\u{1b}[32mINFO\u{1b}[0m a\\nb\n");
    }
}
