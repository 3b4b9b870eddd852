//! Showing text that someone else typed (a node, a label, a path, a name,
//! an id) inside a log line or an error message: control characters are
//! escaped, so such text can never start a line of its own or move a
//! terminal's cursor, and it is cut at a bound with a marker that gives its
//! full length, so a megabyte of input never becomes a megabyte of log.
//!
//! One function does the work, [`escape_into`]; the others choose a bound
//! and whether the text is put in quotes.

use std::fmt::{self, Display};

/// The bound for names, nodes, labels and ids: characters kept before the
/// cut.
pub const NAME_BOUND: usize = 64;

/// The bound for paths and URLs (characters kept before the cut).
pub const PATH_BOUND: usize = 1024;

/// Writes `text` into `out` with every control character (C0, DEL and C1),
/// every Unicode line or paragraph separator and every bidirectional
/// override escaped as Rust writes them (`\n`, `\u{1b}`), and, with
/// `quote`, `"` and `\` escaped and the whole in double quotes. After
/// `bound` characters the rest is cut and `... (N bytes)` says how long the
/// text was.
pub fn escape_into(
    out: &mut impl fmt::Write,
    text: &str,
    bound: usize,
    quote: bool,
) -> fmt::Result {
    if quote {
        out.write_char('"')?;
    }
    let mut cut = false;
    for (kept, c) in text.chars().enumerate() {
        if kept == bound {
            cut = true;
            break;
        }
        match c {
            '"' | '\\' if quote => {
                out.write_char('\\')?;
                out.write_char(c)?;
            }
            c if needs_escape(c) => write!(out, "{}", c.escape_default())?,
            c => out.write_char(c)?,
        }
    }
    if quote {
        out.write_char('"')?;
    }
    if cut {
        write!(out, "... ({} bytes)", text.len())?;
    }
    Ok(())
}

/// Whether `c` is escaped wherever it is shown.
fn needs_escape(c: char) -> bool {
    c.is_control()
        || matches!(
            c,
            '\u{2028}' | '\u{2029}' | '\u{200e}' | '\u{200f}' | '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}'
        )
}

/// Whether `text` can be shown as it is: no character to escape, no quote
/// or backslash, no space at either end, not empty, within `bound`.
fn plain(text: &str, bound: usize) -> bool {
    !text.is_empty()
        && text.chars().count() <= bound
        && text.trim() == text
        && !text
            .chars()
            .any(|c| needs_escape(c) || c == '"' || c == '\\')
}

/// Text shown escaped and cut (see [`escape_into`]); built by [`quoted`],
/// [`shown`], [`shown_path`] and [`escaped`].
#[derive(Debug, Clone, Copy)]
pub struct Shown<'a> {
    text: &'a str,
    bound: usize,
    quote: bool,
}

impl Display for Shown<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        escape_into(f, self.text, self.bound, self.quote)
    }
}

/// `text` in double quotes, escaped, cut after [`NAME_BOUND`] characters:
/// how names and ids appear in the daemon's logs and errors.
pub fn quoted(text: &str) -> Shown<'_> {
    Shown {
        text,
        bound: NAME_BOUND,
        quote: true,
    }
}

/// `text` as it is when it is a plain name (printable, no quotes, within
/// [`NAME_BOUND`]), else as [`quoted`] shows it: how the operations'
/// messages name the nodes, labels and files they were given.
pub fn shown(text: &str) -> Shown<'_> {
    Shown {
        text,
        bound: NAME_BOUND,
        quote: !plain(text, NAME_BOUND),
    }
}

/// As [`shown`], with the bound of a path ([`PATH_BOUND`]).
pub fn shown_path(text: &str) -> Shown<'_> {
    Shown {
        text,
        bound: PATH_BOUND,
        quote: !plain(text, PATH_BOUND),
    }
}

/// Free text (an error's words, which may quote what someone sent)
/// escaped and cut after `bound` characters, without quotes: it stays on
/// one line.
pub fn escaped(text: &str, bound: usize) -> Shown<'_> {
    Shown {
        text,
        bound,
        quote: false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn control_characters_never_reach_the_output() {
        let forged = "x\n2026-12-07T12:00:00Z  INFO audit: who=root result=\"ok\"\r\u{1b}[2J\u{7f}\u{85}\u{2028}\u{202e}";
        for shown in [
            quoted(forged).to_string(),
            shown(forged).to_string(),
            shown_path(forged).to_string(),
            escaped(forged, 4096).to_string(),
        ] {
            assert!(!shown.chars().any(needs_escape), "{shown:?}");
            assert!(shown.contains("\\n2026"), "{shown}");
            assert!(shown.contains("\\u{1b}"), "{shown}");
        }
        assert_eq!(quoted("a\"b\\c").to_string(), r#""a\"b\\c""#);
    }

    #[test]
    fn plain_names_are_shown_as_they_are_and_others_quoted() {
        assert_eq!(shown("10.5.0.2").to_string(), "10.5.0.2");
        assert_eq!(shown("cp-1").to_string(), "cp-1");
        assert_eq!(quoted("cp-1").to_string(), "\"cp-1\"");
        assert_eq!(shown("").to_string(), "\"\"");
        assert_eq!(shown(" cp-1").to_string(), "\" cp-1\"");
        assert_eq!(shown("a\tb").to_string(), "\"a\\tb\"");
        assert_eq!(shown_path("/var/lib/x y").to_string(), "/var/lib/x y");
    }

    #[test]
    fn long_text_is_cut_with_its_length() {
        let long = "é".repeat(1000);
        let q = quoted(&long).to_string();
        assert_eq!(q, format!("\"{}\"... (2000 bytes)", "é".repeat(NAME_BOUND)));
        assert_eq!(shown(&long).to_string(), q);
        let exactly = "n".repeat(NAME_BOUND);
        assert_eq!(shown(&exactly).to_string(), exactly);
        assert_eq!(escaped("abcdef", 3).to_string(), "abc... (6 bytes)");
        let path = format!("/{}", "p".repeat(PATH_BOUND));
        assert!(shown_path(&path).to_string().ends_with("... (1025 bytes)"));
    }
}
