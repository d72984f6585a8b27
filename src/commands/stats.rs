//! `stats`: the record's health at a glance, as labelled lines or one JSON object. Reads
//! counters and table metadata, not the logs (the last-hour counts scan back one hour only,
//! and can count only the audit entries retention kept: the output says when that falls
//! short of the hour).

use std::io::Write;

use super::Failure;
use crate::cli::{StatsArgs, StatsFormat};
use crate::json::Json;
use crate::model::{Outcome, OutcomeCounts, hex};
use crate::output::{num, text, time};
use crate::store::Snapshot;
use crate::store::tables::{SinkRecord, Stream};
use crate::textsafe::{escape_controls, escape_json};
use crate::timefmt::{Zone, now_ms};

/// Whether sink `r` delivers the audit log (its lag counts audit entries, and it holds the
/// audit log's retention, not the effect log's).
fn is_audit(r: &SinkRecord) -> bool {
    r.stream() == Some(Stream::Audit)
}

const HOUR_MS: u64 = 3_600_000;
/// Sources listed by the text form (JSON lists all).
const TEXT_SOURCES: usize = 20;

pub fn run(args: &StatsArgs) -> Result<(), Failure> {
    let zone = args.tz.clone().unwrap_or_else(Zone::utc);
    let config = super::config(&args.db)?;
    let (db, snap) = super::open_snapshot(&config)?;
    let text = match args.format {
        StatsFormat::Json => {
            escape_json(&Stats::read(&snap, &db, now_ms())?.to_json().to_compact()).into_owned()
                + "\n"
        }
        StatsFormat::Text => Stats::read(&snap, &db, now_ms())?.to_text(&zone),
        StatsFormat::Prometheus => prometheus(&config, &snap, &db)?,
    };
    let mut out = crate::output::stdout();
    out.write_all(text.as_bytes()).and_then(|()| out.flush())?;
    Ok(())
}

/// The store's gauges in the text format, as the metrics endpoint serves them (for
/// node_exporter's textfile collector on hosts without the listener).
fn prometheus(
    config: &crate::config::Config,
    snap: &Snapshot,
    db: &std::path::Path,
) -> Result<String, Failure> {
    let readings = crate::readings::Readings::read(snap, db, config, now_ms())?;
    Ok(crate::metrics::encode(&crate::metrics::store_families(
        &readings,
    )))
}

struct Stats {
    path: String,
    file_bytes: u64,
    created_at_ms: u64,
    now_ms: u64,
    total: Option<OutcomeCounts>,
    /// The last hour's decisions, as `total` counts them (without relay actions, which the
    /// decision counters never held).
    last_hour: OutcomeCounts,
    /// Relay actions (`relay` audit entries) in the last hour.
    relay_last_hour: u64,
    /// When the oldest audit entry retention kept was recorded (`None`: none kept).
    audit_first_at_ms: Option<u64>,
    window_entries: u64,
    oldest_in_window_ms: Option<u64>,
    quarantined: u64,
    audit_first: u64,
    audit_next: u64,
    audit_anchor: Option<(u64, [u8; 32])>,
    marks: crate::store::tables::RetentionMarks,
    sources: Vec<crate::store::tables::SourceRecord>,
    bursts: Vec<crate::store::tables::BurstRecord>,
    tables: Vec<(&'static str, u64, u64)>,
    sinks: Vec<(String, crate::store::tables::SinkRecord)>,
    head: u64,
    window_start: u64,
    identity: Option<crate::store::tables::StoreIdentity>,
    /// Per sink, the lowest event it parked that retention keeps (`None`: none).
    parked_low: Vec<Option<u64>>,
    upstream: crate::store::tables::UpstreamLosses,
}

impl Stats {
    fn read(snap: &Snapshot, path: &std::path::Path, now: u64) -> Result<Stats, Failure> {
        let meta = snap.meta()?;
        let summary = snap.summary()?;
        let audit_first = meta.audit_anchor.map_or(0, |(i, _)| i + 1);
        let hour = snap.counts_since(now.saturating_sub(HOUR_MS))?;
        Ok(Stats {
            path: path.display().to_string(),
            file_bytes: crate::readings::database_bytes(snap, path)?,
            created_at_ms: meta.created_at_ms,
            now_ms: now,
            total: snap.counters()?,
            last_hour: hour.without(Outcome::Relay),
            relay_last_hour: hour.get(Outcome::Relay),
            audit_first_at_ms: snap
                .audit_entry(audit_first)?
                .map(|e| e.record.recorded_at_ms),
            window_entries: summary.window_entries,
            oldest_in_window_ms: snap.oldest_in_window_ms()?,
            quarantined: summary.quarantined,
            audit_first,
            audit_next: meta.next_audit,
            audit_anchor: meta.audit_anchor,
            marks: snap.retention_marks()?,
            sources: snap.sources()?,
            bursts: snap.replay_bursts()?,
            tables: snap.table_sizes()?,
            sinks: snap.sink_cursors()?,
            head: meta.next_effect,
            window_start: meta.window_start,
            identity: snap.identity()?,
            upstream: snap.upstream_losses()?,
            parked_low: {
                let floor = snap.retention_marks()?.effects_floor;
                let parked = snap.sink_parked(None)?;
                snap.sink_cursors()?
                    .iter()
                    .map(|(name, _)| {
                        parked
                            .iter()
                            .filter(|p| &p.sink == name && p.offset >= floor)
                            .map(|p| p.offset)
                            .min()
                    })
                    .collect()
            },
        })
    }

    /// Whether `last_hour` counts every decision of the hour: not when retention pruned audit
    /// entries during the hour and the oldest entry it kept is from within the hour (the
    /// entries pruned just before it may be too). Entries are pruned from the oldest end, so
    /// a kept entry from before the hour, or a last pruning before it, proves the count whole.
    fn last_hour_complete(&self) -> bool {
        let since = self.now_ms.saturating_sub(HOUR_MS);
        self.audit_anchor.is_none()
            || self.marks.last_pruned_at_ms < since
            || self.audit_first_at_ms.is_some_and(|t| t < since)
    }

    /// The head of the log sink `r` delivers.
    fn head_of(&self, r: &SinkRecord) -> u64 {
        if is_audit(r) {
            self.audit_next
        } else {
            self.head
        }
    }

    /// The effects sink that holds retention back, if any: the one needing the lowest offset (its
    /// cursor, or an event it parked), when that is below the window (effects the window no
    /// longer needs are kept for it); how many, and the parked event's offset if that is
    /// what holds them.
    fn holding(&self) -> Option<(&str, u64, Option<u64>)> {
        let ((name, rec), parked) = self
            .sinks
            .iter()
            .zip(&self.parked_low)
            .filter(|((_, r), _)| !is_audit(r))
            .min_by_key(|((_, r), p)| p.map_or(r.next, |p| p.min(r.next)))?;
        let needed = parked.map_or(rec.next, |p| p.min(rec.next));
        let floor = self.marks.effects_floor.max(needed);
        let by_parked = parked.filter(|p| *p < rec.next);
        (needed < self.window_start).then(|| {
            (
                name.as_str(),
                self.window_start.saturating_sub(floor),
                by_parked,
            )
        })
    }

    fn to_json(&self) -> Json {
        let counts = |c: &OutcomeCounts| {
            let mut fields = vec![("total".to_string(), num(c.total()))];
            fields.extend(Outcome::ALL.iter().map(|o| (o.to_string(), num(c.get(*o)))));
            Json::Object(fields)
        };
        let obj = |fields: Vec<(&str, Json)>| {
            Json::Object(
                fields
                    .into_iter()
                    .map(|(k, v)| (k.to_string(), v))
                    .collect(),
            )
        };
        obj(vec![
            ("database", text(&self.path)),
            ("file_bytes", num(self.file_bytes)),
            ("created_at", time(self.created_at_ms)),
            (
                "store_id",
                self.identity
                    .as_ref()
                    .map_or(Json::Null, |i| text(&crate::store::identity::show(&i.id))),
            ),
            (
                "store_copy_of",
                self.identity
                    .as_ref()
                    .and_then(|i| i.copy.as_ref().or(i.derived_from.as_ref()))
                    .map_or(Json::Null, |c| {
                        obj(vec![
                            ("id", text(&crate::store::identity::show(&c.of))),
                            ("how", text(&c.how)),
                            ("made_at", time(c.made_at_ms)),
                            ("next_effect", num(c.next_effect)),
                            (
                                "live",
                                Json::Bool(
                                    self.identity.as_ref().is_some_and(|i| i.copy.is_none()),
                                ),
                            ),
                        ])
                    }),
            ),
            ("now", time(self.now_ms)),
            (
                "decisions_total",
                self.total.as_ref().map_or(Json::Null, counts),
            ),
            ("decisions_last_hour", counts(&self.last_hour)),
            (
                "decisions_last_hour_complete",
                Json::Bool(self.last_hour_complete()),
            ),
            ("relay_actions_last_hour", num(self.relay_last_hour)),
            (
                "window",
                obj(vec![
                    ("entries", num(self.window_entries)),
                    (
                        "oldest_at",
                        self.oldest_in_window_ms.map_or(Json::Null, time),
                    ),
                    (
                        "oldest_age_seconds",
                        self.oldest_in_window_ms
                            .map_or(Json::Null, |t| num(self.now_ms.saturating_sub(t) / 1000)),
                    ),
                ]),
            ),
            ("quarantined", num(self.quarantined)),
            (
                "audit",
                obj(vec![
                    ("first_index", num(self.audit_first)),
                    ("next_index", num(self.audit_next)),
                    (
                        "first_recorded_at",
                        self.audit_first_at_ms.map_or(Json::Null, time),
                    ),
                    (
                        "anchor",
                        self.audit_anchor.map_or(Json::Null, |(i, h)| {
                            obj(vec![("index", num(i)), ("hash", text(&hex(&h)))])
                        }),
                    ),
                ]),
            ),
            (
                "retention",
                obj(vec![
                    ("audit_pruned", num(self.marks.audit_pruned)),
                    ("effects_pruned", num(self.marks.effects_pruned)),
                    ("quarantine_pruned", num(self.marks.quarantine_pruned)),
                    ("effects_floor", num(self.marks.effects_floor)),
                    ("quarantine_floor", num(self.marks.quarantine_floor)),
                    (
                        "last_pruned_at",
                        if self.marks.last_pruned_at_ms > 0 {
                            time(self.marks.last_pruned_at_ms)
                        } else {
                            Json::Null
                        },
                    ),
                ]),
            ),
            (
                "relay",
                obj(vec![
                    (
                        "sinks",
                        Json::Array(
                            self.sinks
                                .iter()
                                .map(|(n, r)| {
                                    obj(vec![
                                        ("sink", text(n)),
                                        ("kind", text(&r.kind)),
                                        ("cursor", num(r.next)),
                                        ("lag_events", num(self.head_of(r).saturating_sub(r.next))),
                                        ("ledger_entries", num(r.ledger_len)),
                                        ("resent", num(r.resent)),
                                    ])
                                })
                                .collect(),
                        ),
                    ),
                    (
                        "holding_retention",
                        self.holding().map_or(Json::Null, |(n, k, parked)| {
                            obj(vec![
                                ("sink", text(n)),
                                ("effects_kept", num(k)),
                                ("parked_offset", parked.map_or(Json::Null, num)),
                            ])
                        }),
                    ),
                ]),
            ),
            (
                "sources",
                Json::Array(
                    self.sources
                        .iter()
                        .map(|s| {
                            obj(vec![
                                ("agency", text(&s.agency)),
                                ("source_id", text(&s.source_id)),
                                ("high_water_epoch", num(s.high_water.0)),
                                ("high_water_sequence", num(s.high_water.1)),
                                (
                                    "evicted_floor",
                                    s.evicted_floor.map_or(Json::Null, |(e, q)| {
                                        obj(vec![("epoch", num(e)), ("sequence", num(q))])
                                    }),
                                ),
                            ])
                        })
                        .collect(),
                ),
            ),
            ("upstream_losses", self.upstream_json()),
            (
                "replay_bursts",
                Json::Array(
                    self.bursts
                        .iter()
                        .map(|b| {
                            obj(vec![
                                ("connected_at", time(b.connected_at_ms)),
                                ("ended_at", time(b.ended_at_ms)),
                                ("broker", text(&b.broker)),
                                ("duplicates", num(b.duplicates)),
                            ])
                        })
                        .collect(),
                ),
            ),
            (
                "tables",
                Json::Array(
                    self.tables
                        .iter()
                        .map(|(name, stored, overhead)| {
                            obj(vec![
                                ("name", text(name)),
                                ("stored_bytes", num(*stored)),
                                ("overhead_bytes", num(*overhead)),
                            ])
                        })
                        .collect(),
                ),
            ),
        ])
    }

    /// What was lost upstream: totals, the last hour, the newest events.
    fn upstream_json(&self) -> Json {
        let u = &self.upstream;
        let hour = u.last_hour(self.now_ms);
        let recent = recent_losses(u);
        let obj = |fields: Vec<(&str, Json)>| {
            Json::Object(
                fields
                    .into_iter()
                    .map(|(k, v)| (k.to_string(), v))
                    .collect(),
            )
        };
        obj(vec![
            ("gap_events", num(u.gap_events)),
            ("missing_sequences", num(u.missing_sequences)),
            ("sessions_lost", num(u.sessions_lost)),
            (
                "last_hour",
                obj(vec![
                    ("gap_events", num(hour.gap_events)),
                    ("missing_sequences", num(hour.missing_sequences)),
                    ("sessions_lost", num(hour.sessions_lost)),
                ]),
            ),
            recent.0,
            recent.1,
        ])
    }

    /// The store's id and where it came from, in words.
    fn identity_text(&self, zone: &Zone) -> String {
        let Some(i) = &self.identity else {
            return "none yet (drawn by the next writer)".into();
        };
        let id = crate::store::identity::show(&i.id);
        match (&i.copy, &i.derived_from) {
            (Some(c), _) => format!(
                "{id}: a {} copy of that store made {} (its first writer draws a new id)",
                c.how,
                zone.show_ms(c.made_at_ms)
            ),
            (None, Some(c)) => format!(
                "{id} (from a {} of store {} made {}, offsets below {})",
                c.how,
                crate::store::identity::show(&c.of),
                zone.show_ms(c.made_at_ms),
                c.next_effect
            ),
            (None, None) => id,
        }
    }

    /// Labelled lines for people, their times in `zone`.
    fn to_text(&self, zone: &Zone) -> String {
        let mib = |b: u64| {
            if b < 1024 * 1024 {
                format!("{:.1} KiB", b as f64 / 1024.0)
            } else {
                format!("{:.1} MiB", b as f64 / (1024.0 * 1024.0))
            }
        };
        let counts = |c: &OutcomeCounts| {
            let parts: Vec<String> = Outcome::ALL
                .iter()
                .filter(|o| c.get(**o) > 0)
                .map(|o| format!("{o} {}", c.get(*o)))
                .collect();
            if parts.is_empty() {
                "0".to_string()
            } else {
                format!("{} ({})", c.total(), parts.join(", "))
            }
        };
        let mut s = String::new();
        let mut line = |label: &str, value: String| {
            s.push_str(&format!("{label:<15}{value}\n"));
        };
        line(
            "database",
            format!(
                "{} ({}, created {})",
                self.path,
                mib(self.file_bytes),
                zone.show_ms(self.created_at_ms)
            ),
        );
        line("store id", self.identity_text(zone));
        line(
            "decisions",
            self.total.as_ref().map_or_else(
                || "not counted yet (no writer of this version has opened the database)".into(),
                counts,
            ),
        );
        let relay = match self.relay_last_hour {
            0 => String::new(),
            1 => "; and 1 relay action".to_string(),
            n => format!("; and {n} relay actions"),
        };
        if self.last_hour_complete() {
            line("last hour", format!("{}{relay}", counts(&self.last_hour)));
        } else {
            let kept = self.audit_first_at_ms.map_or_else(
                || "none kept".to_string(),
                |t| format!("from {} on", zone.show_ms(t)),
            );
            line(
                "last hour",
                format!(
                    "at least {}{relay}: retained audit entries only, {kept}; the {} pruned \
                     before them may hold more of the hour",
                    counts(&self.last_hour),
                    self.audit_first
                ),
            );
        }
        line(
            "window",
            match self.oldest_in_window_ms {
                Some(t) => format!(
                    "{} entries, oldest received {} ({} s ago)",
                    self.window_entries,
                    zone.show_ms(t),
                    self.now_ms.saturating_sub(t) / 1000
                ),
                None => format!("{} entries", self.window_entries),
            },
        );
        line(
            "quarantine",
            format!("{} held for review", self.quarantined),
        );
        line(
            "audit log",
            match self.audit_anchor {
                Some((i, h)) => format!(
                    "entries {}..{} kept; earlier ones pruned, chain anchored at #{i} ({}…)",
                    self.audit_first,
                    self.audit_next,
                    &hex(&h)[..16]
                ),
                None => format!("entries 0..{} (nothing pruned)", self.audit_next),
            },
        );
        if self.marks.last_pruned_at_ms > 0 {
            line(
                "retention",
                format!(
                    "pruned audit {}, effects {}, quarantine {}; last at {}",
                    self.marks.audit_pruned,
                    self.marks.effects_pruned,
                    self.marks.quarantine_pruned,
                    zone.show_ms(self.marks.last_pruned_at_ms)
                ),
            );
        }
        if !self.sinks.is_empty() {
            let list: Vec<String> = self
                .sinks
                .iter()
                .map(|(n, r)| {
                    format!(
                        "{} ({}{}) at {} of {}, lag {}, ledger {} {}",
                        escape_controls(n),
                        escape_controls(&r.kind),
                        if is_audit(r) { ", audit log" } else { "" },
                        r.next,
                        self.head_of(r),
                        self.head_of(r).saturating_sub(r.next),
                        r.ledger_len,
                        if r.ledger_len == 1 {
                            "entry"
                        } else {
                            "entries"
                        }
                    )
                })
                .collect();
            line("relay sinks", list.join("; "));
            if let Some((n, k, parked)) = self.holding() {
                line(
                    "",
                    match parked {
                        None => format!(
                            "sink {} holds the effect log: {k} effects outside the window are \
                             kept until it delivers them (retention does not prune past its \
                             cursor)",
                            escape_controls(n)
                        ),
                        Some(p) => format!(
                            "sink {} holds the effect log: {k} effects outside the window are \
                             kept from its parked event at offset {p} on (`relay retry` or \
                             `relay discard` it)",
                            escape_controls(n)
                        ),
                    },
                );
            }
        }
        line("sources", self.sources.len().to_string());
        for src in self.sources.iter().take(TEXT_SOURCES) {
            let floor = src
                .evicted_floor
                .map_or_else(|| "-".into(), |(e, q)| format!("{e}/{q}"));
            s.push_str(&format!(
                "  {}/{}  high-water {}/{}  evicted floor {floor}\n",
                escape_controls(&src.agency),
                escape_controls(&src.source_id),
                src.high_water.0,
                src.high_water.1
            ));
        }
        if self.sources.len() > TEXT_SOURCES {
            s.push_str(&format!(
                "  … {} more (--format json lists every source)\n",
                self.sources.len() - TEXT_SOURCES
            ));
        }
        let mut line = |label: &str, value: String| {
            s.push_str(&format!("{label:<15}{value}\n"));
        };
        let u = &self.upstream;
        let hour = u.last_hour(self.now_ms);
        line(
            "upstream loss",
            format!(
                "{} gaps ({} sequences missing), {} broker sessions lost; last hour: {} \
                 missing, {} sessions lost",
                u.gap_events,
                u.missing_sequences,
                u.sessions_lost,
                hour.missing_sequences,
                hour.sessions_lost
            ),
        );
        if let Some(g) = u.recent_gaps.last() {
            s.push_str(&format!(
                "  last gap {}  {}/{} epoch {} missing {}-{}\n",
                zone.show_ms(g.at_ms),
                escape_controls(&g.agency),
                escape_controls(&g.source_id),
                g.epoch,
                g.from,
                g.to
            ));
        }
        if let Some(l) = u.recent_sessions_lost.last() {
            s.push_str(&format!(
                "  last session lost {}  {} client id {}\n",
                zone.show_ms(l.at_ms),
                escape_controls(&l.broker),
                escape_controls(&l.client_id)
            ));
        }
        let mut line = |label: &str, value: String| {
            s.push_str(&format!("{label:<15}{value}\n"));
        };
        line("replay bursts", self.bursts.len().to_string());
        for b in &self.bursts {
            s.push_str(&format!(
                "  {}  {}  {} duplicates absorbed\n",
                zone.show_ms(b.connected_at_ms),
                escape_controls(&b.broker),
                b.duplicates
            ));
        }
        let tables: Vec<String> = self
            .tables
            .iter()
            .map(|(n, stored, _)| format!("{n} {}", mib(*stored)))
            .collect();
        s.push_str(&format!("{:<15}{}\n", "tables", tables.join(", ")));
        s
    }
}

/// The newest gap events and session losses of `u` as `stats --format json` and `report
/// --format json` both print them: `recent_gaps` and `recent_sessions_lost`.
pub(crate) fn recent_losses(
    u: &crate::store::tables::UpstreamLosses,
) -> ((&'static str, Json), (&'static str, Json)) {
    let obj = |fields: Vec<(&str, Json)>| {
        Json::Object(
            fields
                .into_iter()
                .map(|(k, v)| (k.to_string(), v))
                .collect(),
        )
    };
    let gaps = u
        .recent_gaps
        .iter()
        .map(|g| {
            obj(vec![
                ("at", time(g.at_ms)),
                ("agency", text(&g.agency)),
                ("source_id", text(&g.source_id)),
                ("epoch", num(g.epoch)),
                ("missing_from", num(g.from)),
                ("missing_to", num(g.to)),
            ])
        })
        .collect();
    let lost = u
        .recent_sessions_lost
        .iter()
        .map(|l| {
            obj(vec![
                ("at", time(l.at_ms)),
                ("broker", text(&l.broker)),
                ("client_id", text(&l.client_id)),
            ])
        })
        .collect();
    (
        ("recent_gaps", Json::Array(gaps)),
        ("recent_sessions_lost", Json::Array(lost)),
    )
}
