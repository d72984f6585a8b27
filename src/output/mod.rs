//! What commands print on standard output: the row type of the listings, its one printer per
//! format (jsonl, aligned table, CSV), and standard output itself, which remembers when its
//! reader went away so that `main` ends a command whose pipe closed (`| head`) with success,
//! in one place.
//!
//! CSV is RFC 4180 (the csv crate: a header of the jsonl field names, CRLF, a field quoted
//! only when it must be, null empty, nested JSON as compact text) with two safety rules:
//! control characters are escaped as everywhere else (`textsafe::escape_controls`), and a
//! text field that a spreadsheet would read as a formula (starting with `=`, `+`, `-`, `@`,
//! a tab or a CR) is prefixed with `'`, as is one already starting with `'`, so removing
//! one leading `'` gives the value back. Numbers and booleans are never prefixed.

use std::io::{self, Write};
use std::sync::atomic::{AtomicBool, Ordering};

use crate::json::Json;
use crate::model::hex;
use crate::textsafe::{escape_controls, escape_json};

/// One listing row: (jsonl field name, value) in jsonl order.
pub type Row = Vec<(String, Json)>;

pub fn num(n: u64) -> Json {
    Json::Number(n.to_string())
}

pub fn opt_num(n: Option<u64>) -> Json {
    n.map_or(Json::Null, num)
}

pub fn text(s: &str) -> Json {
    Json::String(s.to_string())
}

pub fn opt_hex(b: Option<[u8; 32]>) -> Json {
    b.map_or(Json::Null, |b| Json::String(hex(&b)))
}

/// Set once a write to standard output found its reader gone.
static STDOUT_CLOSED: AtomicBool = AtomicBool::new(false);

/// Standard output, locked; a broken pipe is remembered (`stdout_closed`).
pub fn stdout() -> Stdout {
    Stdout(io::stdout().lock())
}

/// Whether standard output's reader went away during this command: its error then ends the
/// command with success (nothing is left to tell anyone).
pub fn stdout_closed() -> bool {
    STDOUT_CLOSED.load(Ordering::Relaxed)
}

pub struct Stdout(io::StdoutLock<'static>);

fn noted<T>(r: io::Result<T>) -> io::Result<T> {
    if let Err(e) = &r
        && e.kind() == io::ErrorKind::BrokenPipe
    {
        STDOUT_CLOSED.store(true, Ordering::Relaxed);
    }
    r
}

impl Write for Stdout {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        noted(self.0.write(buf))
    }
    fn write_all(&mut self, buf: &[u8]) -> io::Result<()> {
        noted(self.0.write_all(buf))
    }
    fn flush(&mut self) -> io::Result<()> {
        noted(self.0.flush())
    }
}

/// A field's CSV text before quoting: null empty, strings with control characters escaped and
/// the formula rule applied, nested JSON as compact text.
fn csv_field(v: Option<&Json>) -> String {
    match v {
        None | Some(Json::Null) => String::new(),
        Some(Json::String(s)) => {
            let shown = escape_controls(s);
            if s.starts_with(['=', '+', '-', '@', '\t', '\r', '\'']) {
                format!("'{shown}")
            } else {
                shown.into_owned()
            }
        }
        Some(Json::Number(n)) => n.clone(),
        Some(Json::Bool(b)) => b.to_string(),
        Some(other) => escape_json(&other.to_compact()).into_owned(),
    }
}

/// One CSV record (CRLF-terminated) of `columns` from `row`; the header when `row` is `None`.
pub fn write_csv_row(out: &mut impl Write, columns: &[&str], row: Option<&Row>) -> io::Result<()> {
    let mut w = csv::WriterBuilder::new()
        .terminator(csv::Terminator::CRLF)
        .from_writer(Vec::with_capacity(256));
    let record = columns.iter().map(|name| match row {
        None => (*name).to_string(),
        Some(row) => csv_field(row.iter().find(|(k, _)| k == name).map(|(_, v)| v)),
    });
    w.write_record(record)?;
    let bytes = w.into_inner().map_err(|e| e.into_error())?;
    out.write_all(&bytes)
}

/// One JSON line of `row` (non-ASCII and controls escaped: `textsafe::escape_json`).
pub fn write_jsonl_row(out: &mut impl Write, row: Row) -> io::Result<()> {
    writeln!(out, "{}", escape_json(&Json::Object(row).to_compact()))
}

/// One line of an aligned table: `columns` are (field, width; 0 = no padding); the header
/// (upper-case names) when `row` is `None`; a field the row lacks shows `-`.
pub fn write_table_row(
    out: &mut impl Write,
    columns: &[(&str, usize)],
    row: Option<&Row>,
) -> io::Result<()> {
    let mut line = String::new();
    for (name, width) in columns {
        let value = match row {
            None => name.to_uppercase(),
            Some(row) => row
                .iter()
                .find(|(k, _)| k == name)
                .map_or_else(|| "-".into(), |(_, v)| cell(v, *width)),
        };
        if *width == 0 {
            line.push_str(&value);
        } else {
            line.push_str(&format!("{value:<width$}"));
        }
    }
    writeln!(out, "{}", line.trim_end())
}

/// One table cell. Strings come from producers and operators: control characters are shown
/// escaped so a crafted value cannot forge rows or colour the terminal.
fn cell(v: &Json, width: usize) -> String {
    let s = match v {
        Json::Null => "-".to_string(),
        Json::String(s) => escape_controls(s).into_owned(),
        Json::Number(n) => n.clone(),
        Json::Bool(b) => b.to_string(),
        other => other.to_compact(),
    };
    if width > 1 && s.chars().count() >= width {
        let mut t: String = s.chars().take(width - 2).collect();
        t.push('…');
        t
    } else {
        s
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn csv(columns: &[&str], row: Option<&Row>) -> String {
        let mut out = Vec::new();
        write_csv_row(&mut out, columns, row).unwrap();
        String::from_utf8(out).unwrap()
    }

    #[test]
    fn csv_fields_are_quoted_only_when_needed() {
        let row: Row = vec![
            ("a".into(), Json::String("plain".into())),
            ("b".into(), Json::String("x,\"y\"\r\nz".into())),
            ("c".into(), Json::Null),
            ("d".into(), Json::Number("7".into())),
            (
                "e".into(),
                Json::Object(vec![("k".into(), Json::String("v,w".into()))]),
            ),
        ];
        let cols = ["a", "b", "c", "d", "e"];
        assert_eq!(csv(&cols, None), "a,b,c,d,e\r\n");
        assert_eq!(
            csv(&cols, Some(&row)),
            "plain,\"x,\"\"y\"\"\\r\\nz\",,7,\"{\"\"k\"\":\"\"v,w\"\"}\"\r\n"
        );
    }

    #[test]
    fn csv_fields_show_control_characters_escaped() {
        let row: Row = vec![
            ("a".into(), Json::String("ok\n1,forged\u{1b}[2J".into())),
            (
                "b".into(),
                Json::Object(vec![("k".into(), Json::String("\u{202e}x".into()))]),
            ),
        ];
        assert_eq!(
            csv(&["a", "b"], Some(&row)),
            "\"ok\\n1,forged\\u001b[2J\",\"{\"\"k\"\":\"\"\\u202ex\"\"}\"\r\n"
        );
    }

    #[test]
    fn csv_text_a_spreadsheet_would_evaluate_is_prefixed_and_reversible() {
        let cell = |s: &str| csv(&["a"], Some(&vec![("a".into(), Json::String(s.into()))]));
        assert_eq!(cell("=HYPERLINK(\"x\")"), "\"'=HYPERLINK(\"\"x\"\")\"\r\n");
        assert_eq!(cell("+1"), "'+1\r\n");
        assert_eq!(cell("-1"), "'-1\r\n");
        assert_eq!(cell("@SUM(A1)"), "'@SUM(A1)\r\n");
        assert_eq!(cell("'quoted"), "''quoted\r\n");
        assert_eq!(cell("\tx"), "'\\tx\r\n");
        assert_eq!(cell("a=b"), "a=b\r\n");
        let number = csv(&["n"], Some(&vec![("n".into(), num(5))]));
        assert_eq!(number, "5\r\n");
    }

    #[test]
    fn table_cells_escape_control_characters() {
        let forged = Json::String("X\n1  2026 applied\u{1b}[31m\u{7f}\u{202e}".into());
        assert_eq!(
            cell(&forged, 0),
            "X\\n1  2026 applied\\u001b[31m\\u007f\\u202e"
        );
    }

    #[test]
    fn table_cells_escape_controls_and_shorten_to_their_width() {
        let row: Row = vec![
            ("a".into(), Json::String("x\u{1b}[2Jy".into())),
            ("b".into(), Json::String("abcdefghij".into())),
        ];
        let mut out = Vec::new();
        write_table_row(&mut out, &[("a", 14), ("b", 6), ("c", 0)], None).unwrap();
        write_table_row(&mut out, &[("a", 14), ("b", 6), ("c", 0)], Some(&row)).unwrap();
        assert_eq!(
            String::from_utf8(out).unwrap(),
            "A             B     C\nx\\u001b[2Jy   abcd… -\n"
        );
    }
}
