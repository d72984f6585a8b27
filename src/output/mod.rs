//! What commands print on standard output: the `Record` a listing is made of (its columns
//! named once), the one `Printer` of every listing (jsonl, aligned table, CSV), the row types
//! (`rows`), and standard output itself, which remembers when its reader went away so that
//! `main` ends a command whose pipe closed (`| head`) with success, in one place.
//!
//! jsonl is one object per record, its members `Record::COLUMNS` in order (then
//! `payload_error` on a damaged record), compact, with every `textsafe::is_unsafe` character
//! written `\uXXXX` (`textsafe::escape_json`).
//!
//! The table is the `Record::TABLE` columns, padded, an upper-case header first; text, and
//! nested JSON, with control characters escaped (`textsafe`), so a crafted value can neither
//! forge a row nor drive the terminal; times in the printer's zone.
//!
//! CSV is RFC 4180 (the csv crate: a header of the jsonl field names, CRLF, a field quoted
//! only when it must be, null empty, nested JSON as compact text) with two safety rules:
//! control characters are escaped as everywhere else (`textsafe::escape_controls`), and a
//! text field that a spreadsheet would read as a formula (starting with `=`, `+`, `-`, `@`,
//! a tab or a CR) is prefixed with `'`, as is one already starting with `'`, so removing
//! one leading `'` gives the value back. Numbers and booleans are never prefixed.

pub(crate) mod rows;

use std::io::{self, Write};
use std::sync::atomic::{AtomicBool, Ordering};

use crate::cli::Format;
use crate::json::Json;
use crate::model::hex;
use crate::textsafe::{escape_controls, escape_json};
use crate::timefmt::{Zone, rfc3339_ms};

/// A JSON object's members, in order.
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

pub fn opt_text(s: Option<&str>) -> Json {
    s.map_or(Json::Null, text)
}

pub fn opt_hex(b: Option<[u8; 32]>) -> Json {
    b.map_or(Json::Null, |b| Json::String(hex(&b)))
}

/// A time in milliseconds as RFC 3339 text, UTC (how every output carries times).
pub fn time(ms: u64) -> Json {
    Json::String(rfc3339_ms(ms))
}

/// The member a record gains, only when its stored payload should be JSON and is not (the
/// record was damaged or edited): the parser's error.
pub const PAYLOAD_ERROR: &str = "payload_error";

/// One listed thing: its fields named once, in `COLUMNS`, and its values in the same order.
pub trait Record {
    /// The fields, in jsonl order: the CSV header, and the names of `values`.
    const COLUMNS: &'static [&'static str];
    /// The aligned table's columns: a field of `COLUMNS` and its width (0: no padding, the
    /// last column). None: the record is not listed as a table.
    const TABLE: &'static [(&'static str, usize)] = &[];
    /// The table columns holding a time (UTC RFC 3339 text): shown in the printer's zone,
    /// five characters wider when that zone is not UTC (`+01:00` for `Z`).
    const TIMES: &'static [&'static str] = &[];

    /// One value per `COLUMNS` field, in that order.
    fn values(&self) -> Vec<Json>;

    /// The parser's error when the stored payload should be JSON and is not, and the field
    /// the table and CSV (whose columns are fixed) flag it in front of.
    fn damage(&self) -> Option<(&'static str, &str)> {
        None
    }

    /// The record as JSON members: `COLUMNS` with their values, then `payload_error` when
    /// damaged.
    fn fields(&self) -> Row {
        let values = self.values();
        debug_assert_eq!(values.len(), Self::COLUMNS.len());
        let mut row: Row = Self::COLUMNS
            .iter()
            .map(|name| (*name).to_string())
            .zip(values)
            .collect();
        if let Some((_, error)) = self.damage() {
            row.push((PAYLOAD_ERROR.into(), text(error)));
        }
        row
    }
}

/// Prints one listing in one format: the header (table, CSV) when it starts, then one line
/// per record.
pub struct Printer<'z, W: Write> {
    format: Format,
    zone: &'z Zone,
    out: W,
}

impl<'z, W: Write> Printer<'z, W> {
    /// Starts a listing of `R` on `out`, writing its header (table and CSV; jsonl has none).
    /// `zone` is the table's zone for `R::TIMES`; jsonl and CSV are always UTC.
    pub fn start<R: Record>(format: Format, zone: &'z Zone, out: W) -> io::Result<Self> {
        let mut printer = Printer { format, zone, out };
        match format {
            Format::Jsonl => {}
            Format::Table => {
                let header: Vec<String> = R::TABLE
                    .iter()
                    .map(|(name, _)| name.to_uppercase())
                    .collect();
                printer.table_line::<R>(header)?;
            }
            Format::Csv => write_csv(&mut printer.out, R::COLUMNS.iter().map(|n| (*n).into()))?,
        }
        Ok(printer)
    }

    pub fn print<R: Record>(&mut self, record: &R) -> io::Result<()> {
        if self.format == Format::Jsonl {
            let doc = Json::Object(record.fields()).to_compact();
            return writeln!(self.out, "{}", escape_json(&doc));
        }
        let mut values = record.values();
        debug_assert_eq!(values.len(), R::COLUMNS.len());
        if let Some((column, error)) = record.damage()
            && let Some(v) = column_of::<R>(column).and_then(|i| values.get_mut(i))
        {
            let shown = match &*v {
                Json::String(s) => s.clone(),
                other => other.to_compact(),
            };
            *v = Json::String(format!("[payload damaged: {error}] {shown}"));
        }
        match self.format {
            Format::Csv => write_csv(&mut self.out, values.iter().map(csv_field)),
            Format::Jsonl | Format::Table => {
                let cells = R::TABLE
                    .iter()
                    .map(|(name, width)| {
                        let Some(v) = column_of::<R>(name).and_then(|i| values.get(i)) else {
                            return "-".to_string();
                        };
                        match v {
                            // A view only: the record (and any hash input) keeps UTC text.
                            Json::String(t) if R::TIMES.contains(name) && !self.zone.is_utc() => {
                                cell(
                                    &Json::String(self.zone.show(t)),
                                    self.width::<R>(name, *width),
                                )
                            }
                            v => cell(v, self.width::<R>(name, *width)),
                        }
                    })
                    .collect();
                self.table_line::<R>(cells)
            }
        }
    }

    /// The writer, for lines a listing adds between records (`gaps`' table summaries).
    pub fn out(&mut self) -> &mut W {
        &mut self.out
    }

    pub fn flush(&mut self) -> io::Result<()> {
        self.out.flush()
    }

    fn width<R: Record>(&self, name: &str, width: usize) -> usize {
        if !self.zone.is_utc() && R::TIMES.contains(&name) {
            width + 5
        } else {
            width
        }
    }

    /// One table line of `cells` (one per `R::TABLE` column), padded to the columns' widths.
    fn table_line<R: Record>(&mut self, cells: Vec<String>) -> io::Result<()> {
        let mut line = String::new();
        for ((name, width), value) in R::TABLE.iter().zip(cells) {
            let width = self.width::<R>(name, *width);
            if width == 0 {
                line.push_str(&value);
            } else {
                line.push_str(&format!("{value:<width$}"));
            }
        }
        writeln!(self.out, "{}", line.trim_end())
    }
}

fn column_of<R: Record>(name: &str) -> Option<usize> {
    R::COLUMNS.iter().position(|c| *c == name)
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
fn csv_field(v: &Json) -> String {
    match v {
        Json::Null => String::new(),
        Json::String(s) => {
            let shown = escape_controls(s);
            if s.starts_with(['=', '+', '-', '@', '\t', '\r', '\'']) {
                format!("'{shown}")
            } else {
                shown.into_owned()
            }
        }
        Json::Number(n) => n.clone(),
        Json::Bool(b) => b.to_string(),
        other => escape_json(&other.to_compact()).into_owned(),
    }
}

/// One CSV record (CRLF-terminated) of `fields`, quoted where RFC 4180 needs it.
fn write_csv(out: &mut impl Write, fields: impl Iterator<Item = String>) -> io::Result<()> {
    let mut w = csv::WriterBuilder::new()
        .terminator(csv::Terminator::CRLF)
        .from_writer(Vec::with_capacity(256));
    w.write_record(fields)?;
    let bytes = w.into_inner().map_err(|e| e.into_error())?;
    out.write_all(&bytes)
}

/// One table cell. Strings come from producers and operators: control characters are shown
/// escaped so a crafted value cannot forge rows or colour the terminal; nested JSON (an
/// effect's message) is compact JSON text with the characters JSON leaves raw (DEL, C1, the
/// separators, bidi controls) written `\uXXXX`, as jsonl writes them.
fn cell(v: &Json, width: usize) -> String {
    let s = match v {
        Json::Null => "-".to_string(),
        Json::String(s) => escape_controls(s).into_owned(),
        Json::Number(n) => n.clone(),
        Json::Bool(b) => b.to_string(),
        other => escape_json(&other.to_compact()).into_owned(),
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

    /// A record of given values under the columns a to e.
    struct Test(Vec<Json>);

    impl Record for Test {
        const COLUMNS: &'static [&'static str] = &["a", "b", "c", "d", "e"];
        const TABLE: &'static [(&'static str, usize)] = &[("a", 14), ("b", 6), ("c", 0)];
        fn values(&self) -> Vec<Json> {
            self.0.clone()
        }
    }

    /// A record with a time column, a table and a damaged payload.
    struct Timed {
        at: &'static str,
        damaged: Option<&'static str>,
    }

    impl Record for Timed {
        const COLUMNS: &'static [&'static str] = &["id", "at", "message"];
        const TABLE: &'static [(&'static str, usize)] = &[("id", 4), ("at", 25), ("message", 0)];
        const TIMES: &'static [&'static str] = &["at"];
        fn values(&self) -> Vec<Json> {
            vec![num(7), text(self.at), text("{\"a\":")]
        }
        fn damage(&self) -> Option<(&'static str, &str)> {
            self.damaged.map(|e| ("message", e))
        }
    }

    fn strings(values: &[&str]) -> Test {
        Test(values.iter().map(|s| text(s)).collect())
    }

    fn printed<R: Record>(format: Format, zone: &Zone, records: &[R]) -> String {
        let mut printer = Printer::start::<R>(format, zone, Vec::new()).unwrap();
        for r in records {
            printer.print(r).unwrap();
        }
        String::from_utf8(printer.out).unwrap()
    }

    fn csv(records: &[Test]) -> String {
        printed(Format::Csv, &Zone::utc(), records)
    }

    /// The CSV line of one `a` field (`b` to `e` empty).
    fn csv_cell(v: Json) -> String {
        let line = csv(&[Test(vec![
            v,
            Json::Null,
            Json::Null,
            Json::Null,
            Json::Null,
        ])]);
        line.strip_prefix("a,b,c,d,e\r\n")
            .and_then(|l| l.strip_suffix(",,,,\r\n"))
            .unwrap()
            .to_string()
            + "\r\n"
    }

    #[test]
    fn the_header_is_printed_once_even_for_no_records() {
        let zone = Zone::utc();
        assert_eq!(csv(&[]), "a,b,c,d,e\r\n");
        let two = csv(&[
            strings(&["1", "", "", "", ""]),
            strings(&["2", "", "", "", ""]),
        ]);
        assert_eq!(two, "a,b,c,d,e\r\n1,,,,\r\n2,,,,\r\n");
        assert_eq!(
            printed::<Test>(Format::Table, &zone, &[]),
            "A             B     C\n"
        );
        assert_eq!(printed::<Test>(Format::Jsonl, &zone, &[]), "");
    }

    #[test]
    fn csv_fields_are_quoted_only_when_needed() {
        let row = Test(vec![
            Json::String("plain".into()),
            Json::String("x,\"y\"\r\nz".into()),
            Json::Null,
            Json::Number("7".into()),
            Json::Object(vec![("k".into(), Json::String("v,w".into()))]),
        ]);
        assert_eq!(
            csv(&[row]),
            "a,b,c,d,e\r\nplain,\"x,\"\"y\"\"\\r\\nz\",,7,\"{\"\"k\"\":\"\"v,w\"\"}\"\r\n"
        );
    }

    #[test]
    fn csv_fields_show_control_characters_escaped() {
        let row = Test(vec![
            Json::String("ok\n1,forged\u{1b}[2J".into()),
            Json::Object(vec![("k".into(), Json::String("\u{202e}x".into()))]),
            Json::Null,
            Json::Null,
            Json::Null,
        ]);
        assert_eq!(
            csv(&[row]),
            "a,b,c,d,e\r\n\"ok\\n1,forged\\u001b[2J\",\"{\"\"k\"\":\"\"\\u202ex\"\"}\",,,\r\n"
        );
    }

    #[test]
    fn csv_text_a_spreadsheet_would_evaluate_is_prefixed_and_reversible() {
        let cell = |s: &str| csv_cell(Json::String(s.into()));
        assert_eq!(cell("=HYPERLINK(\"x\")"), "\"'=HYPERLINK(\"\"x\"\")\"\r\n");
        assert_eq!(cell("+1"), "'+1\r\n");
        assert_eq!(cell("-1"), "'-1\r\n");
        assert_eq!(cell("@SUM(A1)"), "'@SUM(A1)\r\n");
        assert_eq!(cell("'quoted"), "''quoted\r\n");
        assert_eq!(cell("\tx"), "'\\tx\r\n");
        assert_eq!(cell("\rx"), "'\\rx\r\n");
        assert_eq!(cell("a=b"), "a=b\r\n");
        assert_eq!(csv_cell(num(5)), "5\r\n");
        assert_eq!(csv_cell(Json::Number("-5".into())), "-5\r\n");
        assert_eq!(csv_cell(Json::Bool(true)), "true\r\n");
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
    fn table_cells_of_nested_json_escape_what_json_leaves_raw() {
        let message = Json::Object(vec![(
            "note".into(),
            text("\u{202e}abc\u{2028}\u{85}\u{7f}\n é"),
        )]);
        assert_eq!(
            cell(&message, 0),
            "{\"note\":\"\\u202eabc\\u2028\\u0085\\u007f\\n é\"}"
        );
    }

    #[test]
    fn table_cells_escape_controls_and_shorten_to_their_width() {
        let row = Test(vec![
            text("x\u{1b}[2Jy"),
            text("abcdefghij"),
            Json::Null,
            Json::Null,
            Json::Null,
        ]);
        assert_eq!(
            printed(Format::Table, &Zone::utc(), &[row]),
            "A             B     C\nx\\u001b[2Jy   abcd… -\n"
        );
    }

    #[test]
    fn jsonl_members_are_the_columns_in_order_with_unsafe_characters_escaped() {
        let row = strings(&["1", "\u{202e}x\u{85}", "é", "\n", "z"]);
        let out = printed(Format::Jsonl, &Zone::utc(), &[row]);
        assert_eq!(
            out,
            "{\"a\":\"1\",\"b\":\"\\u202ex\\u0085\",\"c\":\"é\",\"d\":\"\\n\",\"e\":\"z\"}\n"
        );
    }

    #[test]
    fn a_damaged_record_is_flagged_in_jsonl_by_a_member_and_in_table_and_csv_in_front() {
        let zone = Zone::utc();
        let damaged = Timed {
            at: "2026-11-30T02:52:14.123Z",
            damaged: Some("invalid JSON at byte 5"),
        };
        assert_eq!(
            printed(Format::Jsonl, &zone, &[damaged]),
            "{\"id\":7,\"at\":\"2026-11-30T02:52:14.123Z\",\"message\":\"{\\\"a\\\":\",\
             \"payload_error\":\"invalid JSON at byte 5\"}\n"
        );
        let damaged = Timed {
            at: "2026-11-30T02:52:14.123Z",
            damaged: Some("invalid JSON at byte 5"),
        };
        assert_eq!(
            printed(Format::Csv, &zone, &[damaged]),
            "id,at,message\r\n7,2026-11-30T02:52:14.123Z,\
             \"[payload damaged: invalid JSON at byte 5] {\"\"a\"\":\"\r\n"
        );
    }

    #[test]
    fn table_times_are_shown_in_the_zone_and_their_column_is_wider() {
        let berlin = Zone::parse("Europe/Berlin").unwrap();
        let r = Timed {
            at: "2026-11-30T02:52:14.123Z",
            damaged: None,
        };
        assert_eq!(
            printed(Format::Table, &berlin, &[r]),
            "ID  AT                            MESSAGE\n\
             7   2026-11-30T03:52:14.123+01:00 {\"a\":\n"
        );
        let r = Timed {
            at: "2026-11-30T02:52:14.123Z",
            damaged: None,
        };
        // jsonl and CSV stay UTC.
        assert_eq!(
            printed(Format::Csv, &berlin, &[r]),
            "id,at,message\r\n7,2026-11-30T02:52:14.123Z,\"{\"\"a\"\":\"\r\n"
        );
    }
}
