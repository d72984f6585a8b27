//! Text from outside (a producer's fields, a receiver's answer, a program's stderr) made safe to
//! show on a terminal or in a log line: one escaping rule for every printer and message.
//!
//! Escaped, JSON style so that the text stays one line and cannot move the cursor, colour the
//! terminal or forge a row: `\n`, `\r`, `\t`, `\b`, `\f`, every other C0 control, DEL and the
//! C1 controls as `\u00xx` (lowercase hex), and the bidirectional overrides and isolates
//! (U+202A..U+202E, U+2066..U+2069, which reorder what follows them on the line) and the line
//! and paragraph separators (U+2028, U+2029) as `\u20xx`.
//! A byte that is not UTF-8 shows as `\xNN`. Everything else, `"` and `\` included, is kept as
//! is: the result is for reading, not for parsing back.

use std::borrow::Cow;
use std::fmt::Write as _;

/// `s` with its control characters escaped (the module's rule); borrowed when there is none.
pub fn escape_controls(s: &str) -> Cow<'_, str> {
    if s.chars().any(escaped) {
        Cow::Owned(printable(s))
    } else {
        Cow::Borrowed(s)
    }
}

/// Whether the module's rule escapes `c`.
fn escaped(c: char) -> bool {
    c.is_control() || matches!(c, '\u{2028}'..='\u{202e}' | '\u{2066}'..='\u{2069}')
}

/// `s` with its control characters escaped (the module's rule).
pub fn printable(s: &str) -> String {
    printable_prefix(s.as_bytes(), usize::MAX).0
}

/// The printable form of the longest prefix of `bytes` (UTF-8 or not) that fits in `max`
/// characters, and how many bytes of `bytes` it shows. An escape is never cut in two.
pub fn printable_prefix(bytes: &[u8], max: usize) -> (String, usize) {
    let mut out = String::new();
    let mut chars = 0usize;
    let mut shown = 0usize;
    for chunk in bytes.utf8_chunks() {
        for c in chunk.valid().chars() {
            let before = out.len();
            let width = push_char(&mut out, c);
            if chars.saturating_add(width) > max {
                out.truncate(before);
                return (out, shown);
            }
            chars += width;
            shown += c.len_utf8();
        }
        for b in chunk.invalid() {
            if chars.saturating_add(4) > max {
                return (out, shown);
            }
            let _ = write!(out, "\\x{b:02x}");
            chars += 4;
            shown += 1;
        }
    }
    (out, shown)
}

/// Pushes `c` or its escape; returns the characters pushed (an escape is ASCII).
fn push_char(out: &mut String, c: char) -> usize {
    let short = match c {
        '\n' => "\\n",
        '\r' => "\\r",
        '\t' => "\\t",
        '\u{8}' => "\\b",
        '\u{c}' => "\\f",
        // C0, DEL and C1 (`char::is_control`), the line and paragraph separators, and the
        // bidi overrides and isolates.
        c if escaped(c) => {
            let _ = write!(out, "\\u{:04x}", u32::from(c));
            return 6;
        }
        c => {
            out.push(c);
            return 1;
        }
    };
    out.push_str(short);
    short.len()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn terminal_controls_are_escaped_and_the_rest_is_kept() {
        assert_eq!(
            printable("ok\n\u{1b}[31mred\r\u{7}\t\u{8}\u{c}\u{0}\u{7f}"),
            "ok\\n\\u001b[31mred\\r\\u0007\\t\\b\\f\\u0000\\u007f"
        );
        // C1 CSI (a terminal may take it for ESC [) and a right-to-left override.
        assert_eq!(printable("a\u{9b}2Jb\u{202e}c"), "a\\u009b2Jb\\u202ec");
        assert_eq!(printable("é \"quoted\" \\ 日本"), "é \"quoted\" \\ 日本");
        assert_eq!(printable(""), "");
        assert_eq!(printable("a\u{2028}b\u{2029}"), "a\\u2028b\\u2029");
        assert!(matches!(escape_controls("Engine 7 — ✓"), Cow::Borrowed(_)));
        assert_eq!(escape_controls("a\u{1b}[2J"), "a\\u001b[2J");
    }

    #[test]
    fn a_prefix_fits_its_limit_without_cutting_an_escape_and_counts_its_bytes() {
        assert_eq!(printable_prefix(b"abcdef", 4), ("abcd".into(), 4));
        assert_eq!(printable_prefix(b"abcdef", 100), ("abcdef".into(), 6));
        // "ab\n" would be 4 characters: the escape is left out whole.
        assert_eq!(printable_prefix(b"ab\ncd", 3), ("ab".into(), 2));
        assert_eq!(printable_prefix(b"ab\ncd", 4), ("ab\\n".into(), 3));
        // A multi-byte character is one character of the limit, its bytes all shown.
        assert_eq!(printable_prefix("é日x".as_bytes(), 2), ("é日".into(), 5));
        assert_eq!(printable_prefix(b"", 0), (String::new(), 0));
    }

    #[test]
    fn bytes_that_are_not_utf8_show_as_hex_escapes() {
        assert_eq!(
            printable_prefix(b"a\xff\xc3b", 100),
            ("a\\xff\\xc3b".into(), 4)
        );
        assert_eq!(printable_prefix(b"a\xffb", 4), ("a".into(), 1));
        // A character cut at the end of the kept bytes.
        assert_eq!(
            printable_prefix(&"xé".as_bytes()[..2], 100),
            ("x\\xc3".into(), 2)
        );
    }
}
