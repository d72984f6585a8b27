//! `dump-audit`, `dump-effects`, `dump-quarantine`: stream a table of a (possibly live)
//! database as JSON lines or aligned columns.

use std::io::{self, BufWriter, Write};
use std::ops::ControlFlow;

use super::Failure;
use crate::cli::{DumpArgs, Format};
use crate::json::{self, Json};
use crate::model::{Outcome, hex};
use crate::store::{self, AuditEntry, Effect, QuarantineEntry, Snapshot};
use crate::timefmt::rfc3339_ms;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Table {
    Audit,
    Effects,
    Quarantine,
}

type Row = Vec<(String, Json)>;

pub fn run(table: Table, args: &DumpArgs) -> Result<(), Failure> {
    let (_, txn) = super::open_existing(&args.db)?;
    let mut out = BufWriter::new(io::stdout().lock());
    let result = dump(&txn, table, args.format, &mut out).and_then(|()| Ok(out.flush()?));
    match result {
        Err(Failure::Runtime(e))
            if e.downcast_ref::<io::Error>()
                .is_some_and(|e| e.kind() == io::ErrorKind::BrokenPipe) =>
        {
            Ok(())
        }
        other => other,
    }
}

/// Writes every row of `table` to `out` in `format`.
pub fn dump(
    txn: &Snapshot,
    table: Table,
    format: Format,
    out: &mut impl Write,
) -> Result<(), Failure> {
    let columns = columns(table);
    if format == Format::Table {
        write_table_row(out, columns, None)?;
    }
    let mut emit = |row: Row| -> Result<ControlFlow<()>, Failure> {
        match format {
            Format::Jsonl => writeln!(out, "{}", Json::Object(row).to_compact())?,
            Format::Table => write_table_row(out, columns, Some(&row))?,
        }
        Ok(ControlFlow::Continue(()))
    };
    match table {
        Table::Audit => txn.scan_audit(0, |e| emit(audit_row(&e))),
        Table::Effects => txn.scan_effects(0, |e| emit(effect_row(&e))),
        Table::Quarantine => txn.scan_quarantine(0, |e| emit(quarantine_row(&e))),
    }
}

fn num(n: u64) -> Json {
    Json::Number(n.to_string())
}
fn opt_num(n: Option<u64>) -> Json {
    n.map_or(Json::Null, num)
}
fn text(s: &str) -> Json {
    Json::String(s.to_string())
}
fn opt_hex(b: Option<[u8; 32]>) -> Json {
    b.map_or(Json::Null, |b| Json::String(hex(&b)))
}

/// The audit entry's hashed fields (shared with the hash chain) plus `prev_hash` and `hash`.
pub fn audit_row(e: &AuditEntry) -> Row {
    let mut row = store::audit_body_fields(e.index, &e.record);
    row.push(("prev_hash".into(), Json::String(hex(&e.record.prev_hash))));
    row.push(("hash".into(), Json::String(hex(&e.record.hash))));
    row
}

pub fn effect_row(e: &Effect) -> Row {
    let r = &e.record;
    // Effects hold payloads that parsed as JSON objects; keep a string if that ever fails.
    let message =
        json::parse(&r.payload, 128).unwrap_or_else(|_| Json::String(escape_bytes(&r.payload).0));
    vec![
        ("offset".into(), num(e.offset)),
        ("key".into(), opt_hex(Some(r.key))),
        ("agency".into(), text(&r.agency)),
        ("source_id".into(), text(&r.source_id)),
        ("epoch".into(), num(r.epoch)),
        ("sequence".into(), num(r.sequence)),
        ("topic".into(), text(&r.topic)),
        ("received_at".into(), text(&rfc3339_ms(r.received_at_ms))),
        ("late".into(), Json::Bool(r.late)),
        ("released".into(), Json::Bool(r.released)),
        ("audit_index".into(), num(r.audit_index)),
        ("message".into(), message),
    ]
}

pub fn quarantine_row(q: &QuarantineEntry) -> Row {
    let r = &q.record;
    let (payload, encoding) = escape_bytes(&r.payload);
    vec![
        ("id".into(), num(q.id)),
        (
            "outcome".into(),
            text(Outcome::from_code(r.outcome).map_or("unknown", Outcome::as_str)),
        ),
        ("reason".into(), text(&r.reason)),
        ("topic".into(), text(&r.topic)),
        ("received_at".into(), text(&rfc3339_ms(r.received_at_ms))),
        ("last_seen_at".into(), text(&rfc3339_ms(r.last_seen_ms))),
        ("deliveries".into(), num(r.deliveries)),
        ("key".into(), opt_hex(r.key)),
        ("audit_index".into(), opt_num(Some(r.audit_index))),
        ("payload_encoding".into(), text(encoding)),
        ("payload".into(), Json::String(payload)),
    ]
}

/// The payload as text: verbatim when it is UTF-8 (`"utf-8"`); otherwise `"escaped"`, where
/// `\` is written `\\` and each byte of an invalid sequence `\xNN`, which is reversible.
pub fn escape_bytes(bytes: &[u8]) -> (String, &'static str) {
    if let Ok(s) = std::str::from_utf8(bytes) {
        return (s.to_string(), "utf-8");
    }
    let mut out = String::with_capacity(bytes.len() + 16);
    for chunk in bytes.utf8_chunks() {
        out.push_str(&chunk.valid().replace('\\', "\\\\"));
        for b in chunk.invalid() {
            out.push_str(&format!("\\x{b:02x}"));
        }
    }
    (out, "escaped")
}

fn columns(table: Table) -> &'static [(&'static str, usize)] {
    match table {
        Table::Audit => &[
            ("index", 8),
            ("recorded_at", 25),
            ("outcome", 13),
            ("agency", 12),
            ("source_id", 14),
            ("epoch", 6),
            ("sequence", 10),
            ("key", 17),
            ("effect_offset", 14),
            ("quarantine_id", 14),
            ("reason", 0),
        ],
        Table::Effects => &[
            ("offset", 8),
            ("received_at", 25),
            ("agency", 12),
            ("source_id", 14),
            ("epoch", 6),
            ("sequence", 10),
            ("late", 6),
            ("key", 17),
            ("topic", 20),
            ("message", 0),
        ],
        Table::Quarantine => &[
            ("id", 6),
            ("received_at", 25),
            ("outcome", 10),
            ("deliveries", 11),
            ("key", 17),
            ("topic", 20),
            ("reason", 0),
        ],
    }
}

/// A producer-supplied string made safe for a terminal line: control characters escaped.
pub fn escape_cell(s: &str) -> String {
    cell(&Json::String(s.to_string()), 0)
}

/// One table cell. Strings come from producers: control characters are shown escaped so a
/// crafted value cannot forge rows or colour the terminal.
fn cell(v: &Json, width: usize) -> String {
    let s = match v {
        Json::Null => "-".to_string(),
        Json::String(s) if s.chars().any(char::is_control) => {
            let mut quoted = String::new();
            json::write_string(&mut quoted, s);
            quoted[1..quoted.len() - 1].replace('\u{7f}', "\\u007f")
        }
        Json::String(s) => s.clone(),
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

fn write_table_row(
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn non_utf8_payloads_are_escaped_reversibly() {
        assert_eq!(
            escape_bytes(b"{\"a\":1}"),
            ("{\"a\":1}".to_string(), "utf-8")
        );
        assert_eq!(
            escape_bytes(b"a\\b\xff"),
            ("a\\\\b\\xff".to_string(), "escaped")
        );
    }

    #[test]
    fn table_cells_escape_control_characters() {
        let forged = Json::String("X\n1  2026 applied\u{1b}[31m\u{7f}".into());
        assert_eq!(cell(&forged, 0), "X\\n1  2026 applied\\u001b[31m\\u007f");
    }
}
