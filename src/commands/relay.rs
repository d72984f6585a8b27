//! `relay`: the standalone relay (every `[[sink]]` of the config, until SIGTERM), and the
//! operator's view of the sinks: `status`, `parked`, `retry`, `discard`, `rewind`, `skip`,
//! `forget`.

use std::io::{BufWriter, Write as _};
use std::time::{Duration, Instant};

use anyhow::anyhow;

use super::Failure;
use super::quarantine::who_and_why;
use crate::cli::{DbArgs, Format, ParkedAction, RelayAction, RelayArgs, StatusFormat};
use crate::config::Config;
use crate::config::StoreLocation;
use crate::json::Json;
use crate::notify::Notifier;
use crate::output::rows::{ParkedRow, SinkStatusRow};
use crate::output::{Printer, Record, num, text};
use crate::store::relay::Parked;
use crate::store::relay::RelayStore;
use crate::store::tables::{SinkRecord, Stream};
use crate::store::{Backend, Snapshot, StoreError};
use crate::textsafe::{escape_controls, escape_json};
use crate::timefmt::{Zone, now_ms};

pub fn run(args: &RelayArgs) -> Result<(), Failure> {
    match &args.action {
        None => standalone(args),
        Some(RelayAction::Status { db, format }) => status(db, *format),
        Some(RelayAction::Parked { db, sink, format }) => parked(db, sink, *format),
        Some(RelayAction::Retry(p)) => retry(p),
        Some(RelayAction::Rewind(m)) => {
            let a = &m.action;
            rewind(&a.db, &a.sink, m.to, &a.reason, a.operator.as_deref())
        }
        Some(RelayAction::Skip { cursor: m, yes }) => {
            let a = &m.action;
            skip(&a.db, &a.sink, m.to, &a.reason, a.operator.as_deref(), *yes)
        }
        Some(RelayAction::Discard(p)) => discard(p),
        Some(RelayAction::Forget(a)) => forget(&a.db, &a.sink, &a.reason, a.operator.as_deref()),
    }
}

fn standalone(args: &RelayArgs) -> Result<(), Failure> {
    let config = Config::resolve(args.config.as_deref(), args.db.as_deref())?;
    if config.relay.sinks.is_empty() {
        return Err(Failure::Usage(anyhow!(
            "no [[sink]] in the config: nothing to relay (see README \"Relaying effects\")"
        )));
    }
    let db = match config.location()? {
        StoreLocation::File(db) => {
            super::require_database(db, " (`run` or `ingest` creates it)")?;
            db.display().to_string()
        }
        StoreLocation::Postgres(pg) => pg.pg_config()?.target(),
    };
    let stop = crate::signals::stop_flag().map_err(|e| {
        Failure::Runtime(anyhow::Error::new(e).context("cannot install signal handlers"))
    })?;
    let relay = crate::relay::spawn(&config, None, None)?
        .ok_or_else(|| Failure::Usage(anyhow!("no [[sink]] in the config")))?;
    tracing::info!(%db, sinks = config.relay.sinks.len(), "relay started");
    // The store's gauges (the sinks' lag and parked events among them); no feed counters.
    let _endpoint = crate::metrics::endpoint::Endpoint::for_config(&config, None).map_err(|e| {
        Failure::Runtime(anyhow::Error::new(e).context("cannot start the metrics thread"))
    })?;
    let notifier = Notifier::from_env();
    notifier.notify("READY=1\nSTATUS=relay started");
    let watchdog = Notifier::watchdog_interval();
    let mut last_status = Instant::now();
    while !stop.requested() && relay.is_running() {
        std::thread::sleep(Duration::from_millis(50));
        if last_status.elapsed() >= watchdog.unwrap_or(Duration::from_secs(5)) {
            last_status = Instant::now();
            let wd = if watchdog.is_some() {
                "WATCHDOG=1\n"
            } else {
                ""
            };
            notifier.notify(&format!("{wd}STATUS={}", relay.status_line()));
        }
    }
    notifier.notify("STOPPING=1");
    if !relay.is_running() {
        // Stopped on its own: a storage error, logged by the sink that met it.
        return relay
            .join()
            .map_err(|e| Failure::Runtime(e.into()))
            .and(Err(Failure::Runtime(anyhow!("the relay stopped"))));
    }
    tracing::info!("stopping the relay");
    relay
        .stop_or_cut(config.shutdown_timeout, &|| stop.forced())
        .map_err(|e| Failure::Runtime(e.into()))?;
    if stop.forced() {
        return Err(Failure::Forced(anyhow!(
            "stopped at once by a second signal: a delivery in progress is made again after \
             the restart"
        )));
    }
    Ok(())
}

fn status(db: &DbArgs, format: StatusFormat) -> Result<(), Failure> {
    let config = super::config(db)?;
    let (_, snap) = super::open_snapshot(&config)?;
    let rows = status_rows(&snap, &config, now_ms())?;
    let mut out = BufWriter::new(crate::output::stdout());
    match format {
        StatusFormat::Json => {
            let doc = Json::Object(vec![(
                "sinks".into(),
                Json::Array(rows.iter().map(|r| Json::Object(r.fields())).collect()),
            )]);
            writeln!(out, "{}", escape_json(&doc.to_compact()))?;
        }
        StatusFormat::Text => {
            if rows.is_empty() {
                writeln!(out, "no sinks: none configured, none with a cursor")?;
            }
            for row in rows {
                let row = row.fields();
                let get = |k: &str| {
                    row.iter()
                        .find(|(n, _)| n == k)
                        .map_or("-".to_string(), |(_, v)| match v {
                            Json::String(s) => escape_controls(s).into_owned(),
                            Json::Null => "-".into(),
                            other => other.to_compact(),
                        })
                };
                let audit = get("stream") == "audit";
                writeln!(
                    out,
                    "{} ({}{}): {} — cursor {} of {}, lag {} {} / {} s, parked {}, delivered {}, \
                     resent {}",
                    get("sink"),
                    get("kind"),
                    if audit { ", audit log" } else { "" },
                    get("state"),
                    get("cursor"),
                    get("head"),
                    get("lag_events"),
                    if audit { "entries" } else { "events" },
                    get("lag_seconds"),
                    get("parked"),
                    get("delivered"),
                    get("resent"),
                )?;
                if let Some(line) = row
                    .iter()
                    .find(|(n, _)| n == "accounting")
                    .and_then(|(_, a)| accounting_text(a))
                {
                    writeln!(out, "  {line}")?;
                }
                if get("last_error") != "-" {
                    writeln!(
                        out,
                        "  last error at {}: {}",
                        get("last_error_at"),
                        get("last_error")
                    )?;
                }
            }
        }
    }
    out.flush()?;
    Ok(())
}

/// One row per sink with a cursor, then per configured sink without one yet.
pub fn status_rows(
    snap: &Snapshot,
    config: &Config,
    now_ms: u64,
) -> Result<Vec<SinkStatusRow>, StoreError> {
    let meta = snap.meta()?;
    let parked = snap.sink_parked(None)?;
    let mut rows = Vec::new();
    let cursors = snap.sink_cursors()?;
    for (name, rec) in &cursors {
        let stream = rec.stream();
        let head = match stream {
            Some(Stream::Audit) => meta.next_audit,
            _ => meta.next_effect,
        };
        let configured = config.relay.sink(name).is_some();
        let mine: Vec<&Parked> = parked.iter().filter(|p| &p.sink == name).collect();
        let blocked = mine
            .iter()
            .any(|p| p.offset == rec.next && p.record.blocking);
        let lag = crate::readings::SinkLag::of(snap, &meta, (name, rec), &parked, now_ms)?;
        rows.push(SinkStatusRow {
            sink: name.clone(),
            kind: rec.kind.clone(),
            stream: stream.map_or_else(
                || format!("unknown ({})", rec.stream),
                |s| s.as_str().into(),
            ),
            configured,
            state: crate::relay::reported_state(rec, head, blocked, lag.parked, configured),
            cursor: Some(rec.next),
            head,
            lag_events: Some(lag.events),
            lag_seconds: Some(lag.age_s),
            parked: lag.parked,
            retry_requested: mine
                .iter()
                .filter(|p| p.record.retry_requested_at_ms.is_some())
                .count() as u64,
            delivered: rec.delivered,
            resent: rec.resent,
            generation: Some(rec.generation),
            advanced_at_ms: Some(rec.advanced_at_ms),
            last_error: rec.last_error.clone(),
            accounting: accounting_json(snap, name, rec)?,
        });
    }
    for s in config.relay.named() {
        if cursors.iter().all(|(n, _)| n != &s.name) {
            rows.push(SinkStatusRow {
                sink: s.name.clone(),
                kind: s.kind.name().to_string(),
                stream: s.stream.as_str().into(),
                configured: true,
                state: "not_started",
                cursor: None,
                head: match s.stream {
                    Stream::Audit => meta.next_audit,
                    Stream::Effects => meta.next_effect,
                },
                lag_events: None,
                lag_seconds: None,
                parked: 0,
                retry_requested: 0,
                delivered: 0,
                resent: 0,
                generation: None,
                advanced_at_ms: None,
                last_error: None,
                accounting: Json::Null,
            });
        }
    }
    Ok(rows)
}

/// What the sink's ledger accounts for below its cursor (as `verify` checks it), or the
/// problem with it.
fn accounting_json(snap: &Snapshot, name: &str, rec: &SinkRecord) -> Result<Json, StoreError> {
    Ok(match snap.sink_accounting(name, rec)? {
        Ok(a) => Json::Object(vec![
            ("from".into(), num(a.from)),
            ("to".into(), num(rec.next)),
            ("delivered".into(), num(a.delivered)),
            ("parked".into(), num(a.parked)),
            ("retried".into(), num(a.retried)),
            ("skipped".into(), num(a.skipped)),
            ("adopted".into(), num(a.adopted)),
            ("discarded".into(), num(a.discarded)),
            ("not_selected".into(), num(a.not_selected)),
            (
                "began".into(),
                a.began_words(rec.stream().unwrap_or(Stream::Effects))
                    .map_or(Json::Null, |w| text(&w)),
            ),
            (
                "recorded_since".into(),
                text(if a.unrecorded {
                    "not yet (a cursor from before ledgers)"
                } else if a.legacy {
                    "upgrade"
                } else {
                    "start"
                }),
            ),
            ("problem".into(), Json::Null),
        ]),
        Err(p) => Json::Object(vec![("problem".into(), text(&p))]),
    })
}

/// The accounting object of a status row in words.
fn accounting_text(a: &Json) -> Option<String> {
    let Json::Object(m) = a else { return None };
    let get = |k: &str| m.iter().find(|(n, _)| n == k).map(|(_, v)| v);
    if let Some(Json::String(p)) = get("problem") {
        return Some(format!(
            "ACCOUNTING DOES NOT HOLD: {} (`verify` fails)",
            escape_controls(p)
        ));
    }
    let n = |k: &str| match get(k) {
        Some(Json::Number(v)) => v.clone(),
        _ => "0".into(),
    };
    let since = match get("recorded_since") {
        Some(Json::String(s)) if s == "upgrade" => " (recorded since the upgrade to ledgers)",
        Some(Json::String(s)) if s.starts_with("not yet") => {
            return Some(
                "accounted: not yet (a cursor from before ledgers; recorded from its next move)"
                    .into(),
            );
        }
        _ => "",
    };
    let not_selected = match n("not_selected").as_str() {
        "0" => String::new(),
        k => format!(", {k} not selected by outcomes"),
    };
    let began = match get("began") {
        Some(Json::String(w)) => format!("; {}", escape_controls(w)),
        _ => String::new(),
    };
    Some(format!(
        "accounted: offsets {} to {}{since}: {} delivered, {} parked, {} delivered after retry, \
         {} skipped by an operator, {} discarded by an operator, {} found in the sink's own \
         store{not_selected}{began}",
        n("from"),
        n("to"),
        n("delivered"),
        n("parked"),
        n("retried"),
        n("skipped"),
        n("discarded"),
        n("adopted")
    ))
}

fn parked(db: &DbArgs, sink: &str, format: Format) -> Result<(), Failure> {
    let (_, snap) = super::open_existing(db)?;
    if snap.sink_cursor(sink)?.is_none() {
        return Err(Failure::Usage(anyhow!(
            "no sink named {sink:?} has a cursor in this database (`relay status` lists them)"
        )));
    }
    let list = snap.sink_parked(Some(sink))?;
    let zone = Zone::utc();
    let out = BufWriter::new(crate::output::stdout());
    let mut printer = Printer::start::<ParkedRow>(format, &zone, out)?;
    for p in &list {
        printer.print(&ParkedRow(p))?;
    }
    printer.flush()?;
    Ok(())
}

fn operator_store(db: &DbArgs) -> Result<(Config, Backend), Failure> {
    let config = super::config(db)?;
    let store = super::open_operator(&config)?;
    Ok((config, store))
}

fn refused(e: StoreError) -> Failure {
    match e {
        StoreError::Refused(why) => Failure::Usage(anyhow!(why)),
        other => Failure::from(other),
    }
}

/// The store, the parked event named (`None`: `--all`), the operator and the reason of an
/// action on parked events.
fn open_parked(p: &ParkedAction) -> Result<(Backend, Option<u64>, String, String), Failure> {
    let a = &p.action;
    let (operator, reason) = who_and_why(&a.reason, a.operator.as_deref())?;
    let (_, store) = operator_store(&a.db)?;
    let offset = parked_offset(&store, &a.sink, p.event.as_deref(), p.all)?;
    Ok((store, offset, operator, reason))
}

fn retry(p: &ParkedAction) -> Result<(), Failure> {
    let sink = p.action.sink.as_str();
    let (mut store, offset, operator, reason) = open_parked(p)?;
    let n = store
        .relay_retry(sink, offset, &operator, &reason, now_ms())
        .map_err(refused)?;
    let _ = writeln!(
        crate::output::stdout(),
        "sink {sink}: {n} parked event{} marked for retry; the running relay delivers {} within a \
         second (`relay parked` shows what is still refused)",
        if n == 1 { "" } else { "s" },
        if n == 1 { "it" } else { "them" }
    );
    store.close()?;
    Ok(())
}

/// The parked event an operator names, by effect offset or event id (`None`: `--all`).
fn parked_offset(
    store: &Backend,
    sink: &str,
    event: Option<&str>,
    all: bool,
) -> Result<Option<u64>, Failure> {
    Ok(match (event, all) {
        (_, true) => None,
        (Some(e), false) => Some(match e.parse::<u64>() {
            Ok(o) => o,
            // An event id: find its offset among the sink's parked events.
            Err(_) => store
                .reader()?
                .sink_parked(Some(sink))?
                .iter()
                .find(|p| p.record.id == e)
                .map(|p| p.offset)
                .ok_or_else(|| {
                    Failure::Usage(anyhow!(
                        "sink {sink:?} has no parked event with id {e:?} (`relay parked --sink {sink}`)"
                    ))
                })?,
        }),
        (None, false) => return Err(Failure::Usage(anyhow!("name an event or pass --all"))),
    })
}

fn discard(p: &ParkedAction) -> Result<(), Failure> {
    let sink = p.action.sink.as_str();
    let (mut store, offset, operator, reason) = open_parked(p)?;
    let n = store
        .relay_discard(sink, offset, &operator, &reason, now_ms())
        .map_err(refused)?;
    let _ = writeln!(
        crate::output::stdout(),
        "sink {sink}: {n} parked event{} discarded: not to be delivered, recorded in the audit \
         log; retention no longer keeps {} for the sink",
        if n == 1 { "" } else { "s" },
        if n == 1 {
            "its effect"
        } else {
            "their effects"
        }
    );
    store.close()?;
    Ok(())
}

fn rewind(
    db: &DbArgs,
    sink: &str,
    to: u64,
    reason: &str,
    operator: Option<&str>,
) -> Result<(), Failure> {
    let (operator, reason) = who_and_why(reason, operator)?;
    let (_, mut store) = operator_store(db)?;
    let (before, after) = store
        .relay_rewind(sink, to, &operator, &reason, now_ms())
        .map_err(refused)?;
    let _ = writeln!(
        crate::output::stdout(),
        "sink {sink}: cursor moved from {} to {} (generation {}); events from offset {to} are \
         delivered again with the same ids",
        before.next,
        after.next,
        after.generation
    );
    store.close()?;
    Ok(())
}

fn skip(
    db: &DbArgs,
    sink: &str,
    to: u64,
    reason: &str,
    operator: Option<&str>,
    yes: bool,
) -> Result<(), Failure> {
    let (operator, reason) = who_and_why(reason, operator)?;
    let (_, snap) = super::open_existing(db)?;
    let (rec, plan) = crate::store::relay::plan_skip(&snap, sink, to).map_err(refused)?;
    drop(snap);
    let audit = rec.stream() == Some(Stream::Audit);
    let things = |n: u64| match (audit, n == 1) {
        (false, true) => "effect",
        (false, false) => "effects",
        (true, true) => "audit entry",
        (true, false) => "audit entries",
    };
    let what = format!(
        "sink {sink}: skipping from offset {} to {to} passes over {} undelivered {} ({}), \
         which the sink will never deliver{}{}",
        rec.next,
        plan.passed,
        things(plan.passed),
        crate::store::ledger::range_text(rec.next, to),
        plan.offered_text(),
        if plan.blocking_parked {
            format!(
                "; the blocking event at offset {} stays parked for `relay retry`",
                rec.next
            )
        } else {
            String::new()
        }
    );
    if !yes {
        return Err(Failure::Usage(anyhow!(
            "{what}: nothing was changed; pass --yes to do it"
        )));
    }
    let (_, mut store) = operator_store(db)?;
    let (before, after, done) = store
        .relay_skip(sink, to, &operator, &reason, now_ms())
        .map_err(refused)?;
    let _ = writeln!(
        crate::output::stdout(),
        "sink {sink}: cursor moved from {} to {} (generation {}); {} undelivered {} passed \
         over{}, recorded in the audit log",
        before.next,
        after.next,
        after.generation,
        done.passed,
        things(2),
        done.offered_text()
    );
    store.close()?;
    Ok(())
}

fn forget(db: &DbArgs, sink: &str, reason: &str, operator: Option<&str>) -> Result<(), Failure> {
    let (operator, reason) = who_and_why(reason, operator)?;
    if db.config.is_none() {
        return Err(Failure::Usage(anyhow!(
            "forget needs --config: the config the relay runs with, to show the sink is no \
             longer in it"
        )));
    }
    let (config, mut store) = operator_store(db)?;
    // A relay still delivering it would make its cursor again at once. On PostgreSQL the
    // forget's transaction itself checks that no member holds the sink.
    let _lock = match config.location()? {
        StoreLocation::File(path) => Some(crate::store::relay::lock_sinks(path, &[sink])?),
        StoreLocation::Postgres(_) => None,
    };
    if config.relay.sink(sink).is_some() {
        return Err(Failure::Usage(anyhow!(
            "sink {sink:?} is still in the config: remove its [[sink]] table (and restart the \
             relay) before forgetting its cursor"
        )));
    }
    let f = store
        .relay_forget(sink, &operator, &reason, now_ms())
        .map_err(refused)?;
    let _ = writeln!(
        crate::output::stdout(),
        "sink {sink} forgotten: its cursor was at offset {} ({} parked events removed); \
         retention no longer keeps effects for it",
        f.record.next,
        f.parked
    );
    store.close()?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::{Store, StoreOptions};

    #[test]
    fn the_parked_csv_columns_are_the_jsonl_fields_in_order() {
        let mut s = Store::open_in_memory(StoreOptions::default()).unwrap();
        crate::testing::feed(&mut s, 1..=1, crate::testing::T0);
        let (offset, record) = crate::testing::parked(&s.reader().unwrap(), 0, false);
        let parked = Parked {
            sink: "cop".into(),
            offset,
            record,
        };
        let row = ParkedRow(&parked).fields();
        let names: Vec<&str> = row.iter().map(|(k, _)| k.as_str()).collect();
        assert_eq!(names, ParkedRow::COLUMNS);
        assert_eq!(row[11].0, "event");
        assert!(matches!(row[11].1, Json::Object(_)), "{:?}", row[11].1);
    }
}
