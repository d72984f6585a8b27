//! Text made safe for a terminal: control characters, line and paragraph separators and bidi
//! controls shown as escapes, so printed text can neither forge lines, drive the terminal, nor
//! reorder what surrounds it. For display only: stored and hashed text is never changed.

use std::borrow::Cow;
use std::fmt::Write as _;

/// Whether `c` must not reach a terminal as is: a control character (C0, DEL, C1), the line
/// and paragraph separators U+2028/U+2029, or a bidi embedding, override or isolate
/// (U+202A..=U+202E, U+2066..=U+2069).
pub fn is_unsafe(c: char) -> bool {
    c.is_control()
        || matches!(
            c,
            '\u{2028}' | '\u{2029}' | '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}'
        )
}

/// `s` as it may be printed: unchanged (borrowed) when it holds no `is_unsafe` character;
/// otherwise each such character is escaped as JSON writes it (`\n`, `\r`, `\t`, `\b`, `\f`,
/// else `\u001b`, `\u007f`, `\u202e`), and `\` is written `\\`, so the escaped text reads back
/// exactly. Everything else, printable Unicode included, is kept.
pub fn escape_controls(s: &str) -> Cow<'_, str> {
    if !s.chars().any(is_unsafe) {
        return Cow::Borrowed(s);
    }
    let mut out = String::with_capacity(s.len() + 16);
    for c in s.chars() {
        push_char(&mut out, c, true);
    }
    Cow::Owned(out)
}

/// The printable form of the longest prefix of `bytes` (UTF-8 or not: a byte that is not is
/// shown `\xNN`) that fits in `max` characters, and how many bytes of `bytes` it shows. The
/// rule is `escape_controls`'s (a backslash is doubled only when something in `bytes` is
/// escaped); an escape is never cut in two.
pub fn printable_prefix(bytes: &[u8], max: usize) -> (String, usize) {
    let escaping = bytes
        .utf8_chunks()
        .any(|c| !c.invalid().is_empty() || c.valid().chars().any(is_unsafe));
    let mut out = String::new();
    let mut chars = 0usize;
    let mut shown = 0usize;
    for chunk in bytes.utf8_chunks() {
        for c in chunk.valid().chars() {
            let before = out.len();
            let width = push_char(&mut out, c, escaping);
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

/// Pushes `c` or its escape (`\` doubled when `escaping`); returns the characters pushed.
pub(crate) fn push_char(out: &mut String, c: char, escaping: bool) -> usize {
    let short = match c {
        '\\' if escaping => "\\\\",
        '\n' => "\\n",
        '\r' => "\\r",
        '\t' => "\\t",
        '\u{8}' => "\\b",
        '\u{c}' => "\\f",
        c if is_unsafe(c) => {
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

/// JSON text (as `Json::to_compact` writes it, which escapes only what JSON requires) with
/// every remaining `is_unsafe` character (DEL, C1, the separators, bidi controls) written
/// `\uXXXX`. These can stand only inside strings, so any JSON reader reads the same document.
pub fn escape_json(text: &str) -> Cow<'_, str> {
    if !text.chars().any(is_unsafe) {
        return Cow::Borrowed(text);
    }
    let mut out = String::with_capacity(text.len() + 16);
    for c in text.chars() {
        if is_unsafe(c) {
            let _ = write!(out, "\\u{:04x}", u32::from(c));
        } else {
            out.push(c);
        }
    }
    Cow::Owned(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn control_characters_are_escaped() {
        for (raw, shown) in [
            ("a\u{1b}[2Jb", "a\\u001b[2Jb"),
            ("a\rb", "a\\rb"),
            ("root\nadmin", "root\\nadmin"),
            ("bell\u{7}", "bell\\u0007"),
            ("del\u{7f}", "del\\u007f"),
            ("nul\u{0}", "nul\\u0000"),
            ("tab\t", "tab\\t"),
            ("\u{8}\u{c}", "\\b\\f"),
            // C1: U+0085 (NEL) and U+009B (CSI, an escape sequence by itself to some terminals).
            ("c1\u{85}\u{9b}2J", "c1\\u0085\\u009b2J"),
        ] {
            assert_eq!(escape_controls(raw), shown, "{raw:?}");
        }
    }

    #[test]
    fn separators_and_bidi_controls_are_escaped() {
        for (raw, shown) in [
            ("a\u{2028}b\u{2029}", "a\\u2028b\\u2029"),
            (
                "\u{202a}\u{202b}\u{202c}\u{202d}",
                "\\u202a\\u202b\\u202c\\u202d",
            ),
            ("admin\u{202e}nimda", "admin\\u202enimda"),
            (
                "\u{2066}\u{2067}\u{2068}\u{2069}",
                "\\u2066\\u2067\\u2068\\u2069",
            ),
        ] {
            assert_eq!(escape_controls(raw), shown, "{raw:?}");
        }
    }

    #[test]
    fn printable_text_is_borrowed_unchanged() {
        for s in [
            "",
            "alice",
            "Cal Fire/ÉMS engine 7",
            "IC confirmed \"the\" report by radio, 50% \\ done",
            "日本語 Ελληνικά עברית العربية 🚒",
            // Bidi *marks* (not embeddings or overrides) and zero-width joiners are printable.
            "\u{200e}\u{200f}\u{200d}",
        ] {
            assert!(
                matches!(escape_controls(s), Cow::Borrowed(t) if t == s),
                "{s:?}"
            );
            assert!(
                matches!(escape_json(s), Cow::Borrowed(t) if t == s),
                "{s:?}"
            );
        }
    }

    #[test]
    fn escaped_text_reads_back_exactly() {
        // Once anything is escaped, a backslash is too: `\n` typed as two characters stays
        // distinct from a line feed.
        assert_eq!(escape_controls("a\\nb\n"), "a\\\\nb\\n");
        let raw = "q\"\\\u{1b}\u{202e}\u{85}é";
        let quoted = format!("\"{}\"", escape_controls(raw).replace('"', "\\\""));
        assert_eq!(
            crate::json::parse(quoted.as_bytes(), 4).unwrap(),
            crate::json::Json::String(raw.into())
        );
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
        // The same rule as `escape_controls`.
        let s = "a\\b\u{1b}c\u{202e}";
        assert_eq!(printable_prefix(s.as_bytes(), 100).0, escape_controls(s));
        assert_eq!(printable_prefix(b"a\\b", 100).0, "a\\b");
    }

    #[test]
    fn bytes_that_are_not_utf8_show_as_hex_escapes() {
        assert_eq!(
            printable_prefix(b"a\xff\xc3b", 100),
            ("a\\xff\\xc3b".into(), 4)
        );
        assert_eq!(printable_prefix(b"a\xffb", 4), ("a".into(), 1));
        assert_eq!(
            printable_prefix(&"xé".as_bytes()[..2], 100),
            ("x\\xc3".into(), 2)
        );
    }

    #[test]
    fn json_text_keeps_its_value() {
        let value = crate::json::Json::String("a\u{1b}\u{7f}\u{85}\u{2028}\u{202e}\\\"b".into());
        let compact = value.to_compact();
        let safe = escape_json(&compact);
        assert_eq!(safe, "\"a\\u001b\\u007f\\u0085\\u2028\\u202e\\\\\\\"b\"");
        assert!(!safe.chars().any(is_unsafe));
        assert_eq!(crate::json::parse(safe.as_bytes(), 4).unwrap(), value);
    }
}
