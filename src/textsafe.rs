//! Text from outside (a receiver's answer, an operator's reason) made safe to log or print:
//! control characters escaped, so it can neither forge a line nor drive a terminal.

use std::borrow::Cow;

/// `text` with every control character (C0, DEL, C1), the Unicode line and paragraph
/// separators and the bidirectional overrides and isolates written as `\u{..}` escapes
/// (`\n`, `\r`, `\t` as themselves escaped). Printable text is returned unchanged, borrowed.
pub fn escape_controls(text: &str) -> Cow<'_, str> {
    if !text.chars().any(needs_escape) {
        return Cow::Borrowed(text);
    }
    let mut out = String::with_capacity(text.len() + 16);
    for c in text.chars() {
        match c {
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if needs_escape(c) => out.push_str(&format!("\\u{{{:x}}}", c as u32)),
            c => out.push(c),
        }
    }
    Cow::Owned(out)
}

fn needs_escape(c: char) -> bool {
    c.is_control()
        || matches!(c, '\u{2028}' | '\u{2029}' | '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}')
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn control_characters_are_escaped_and_printable_text_is_left_alone() {
        assert!(matches!(escape_controls("Engine 7 — ✓"), Cow::Borrowed(_)));
        assert_eq!(
            escape_controls("a\nb\r\tc\u{1b}[2J\u{7}\u{7f}\u{85}"),
            "a\\nb\\r\\tc\\u{1b}[2J\\u{7}\\u{7f}\\u{85}"
        );
        assert_eq!(
            escape_controls("x\u{202e}y\u{2028}z\u{2066}"),
            "x\\u{202e}y\\u{2028}z\\u{2066}"
        );
    }
}
