//! The report's JSON twin (`replay-guard.report.v1`): the same content as the HTML, one
//! object written with `json::Json`, every time UTC. The book's report page documents each
//! field.

use super::{BurstProofs, Gap, Listed, Marker, Proof, Report, SCHEMA, SourceRow};
use crate::json::Json;
use crate::model::{Outcome, OutcomeCounts, hex};
use crate::output::{Record, num, opt_hex, opt_num, text, time};

fn obj(fields: Vec<(&str, Json)>) -> Json {
    Json::Object(
        fields
            .into_iter()
            .map(|(k, v)| (k.to_string(), v))
            .collect(),
    )
}

/// `{"total": n, "applied": n, ...}` over every outcome.
pub fn counts(c: &OutcomeCounts) -> Json {
    let mut fields = vec![("total".to_string(), num(c.total()))];
    fields.extend(Outcome::ALL.iter().map(|o| (o.to_string(), num(c.get(*o)))));
    Json::Object(fields)
}

fn listed<T>(l: &Listed<T>, item: impl Fn(&T) -> Json) -> Json {
    obj(vec![
        ("total", num(l.total())),
        ("listed", Json::Array(l.items.iter().map(item).collect())),
        ("left_off", num(l.left_off)),
    ])
}

fn source_name(s: &Option<(String, String)>) -> (Json, Json) {
    match s {
        Some((a, s)) => (text(a), text(s)),
        None => (Json::Null, Json::Null),
    }
}

fn gap(g: &Gap) -> Json {
    obj(vec![
        ("epoch", num(g.epoch)),
        ("lowest", num(g.lowest)),
        ("highest", num(g.highest)),
        ("missing_from", num(g.from)),
        ("missing_to", num(g.to)),
    ])
}

fn source(r: &SourceRow) -> Json {
    let (agency, source_id) = source_name(&r.source);
    obj(vec![
        ("agency", agency),
        ("source_id", source_id),
        ("name", text(&r.name())),
        ("counts", counts(&r.counts)),
        ("quarantine_open", num(r.open)),
        ("missing", num(r.missing())),
        ("gaps_total", num(r.gaps_total)),
        ("gaps_left_off", num(r.gaps_total - r.gaps.len() as u64)),
        (
            "high_water",
            r.high_water.map_or(Json::Null, |(e, q)| {
                obj(vec![("epoch", num(e)), ("sequence", num(q))])
            }),
        ),
        ("gaps", Json::Array(r.gaps.iter().map(gap).collect())),
    ])
}

fn marker(m: &Marker) -> Json {
    obj(vec![
        ("kind", text(m.kind.as_str())),
        ("at", time(m.at_ms)),
        ("until", m.until_ms.map_or(Json::Null, time)),
        ("label", text(&m.label)),
    ])
}

fn entry_ref(e: &crate::store::AuditEntry) -> Json {
    obj(vec![
        ("index", num(e.index)),
        ("recorded_at", time(e.record.recorded_at_ms)),
        (
            "outcome",
            text(Outcome::from_code(e.record.outcome).map_or("unknown", Outcome::as_str)),
        ),
        ("topic", text(&e.record.topic)),
    ])
}

fn proof(p: &Proof) -> Json {
    let r = &p.entry.record;
    obj(vec![
        ("index", num(p.entry.index)),
        ("recorded_at", time(r.recorded_at_ms)),
        ("key", opt_hex(r.key)),
        ("digest", opt_hex(r.digest)),
        ("agency", r.agency.as_deref().map_or(Json::Null, text)),
        ("source_id", r.source_id.as_deref().map_or(Json::Null, text)),
        ("epoch", opt_num(r.epoch)),
        ("sequence", opt_num(r.sequence)),
        ("effect_offset", opt_num(p.effect_offset)),
        (
            "effect_received_at",
            p.effect_received_ms.map_or(Json::Null, time),
        ),
        (
            "applied_by",
            p.applying.as_ref().map_or(Json::Null, entry_ref),
        ),
        ("story", text(&p.story_utc)),
        (
            "applied_story",
            p.applying_story_utc.as_deref().map_or(Json::Null, text),
        ),
    ])
}

fn burst(b: &BurstProofs) -> Json {
    obj(vec![
        ("broker", text(&b.burst.broker)),
        ("connected_at", time(b.burst.connected_at_ms)),
        ("ended_at", time(b.burst.ended_at_ms)),
        ("duplicates", num(b.burst.duplicates)),
        ("duplicates_in_range", num(b.duplicates_seen)),
        (
            "samples",
            Json::Array(b.samples.iter().map(proof).collect()),
        ),
    ])
}

/// What `run` recorded as lost upstream: totals since the store was made, the newest gap
/// events and session losses (all of them kept, whatever the range).
fn upstream(r: &Report) -> Json {
    let u = &r.upstream;
    let recent = crate::commands::stats::recent_losses(u);
    obj(vec![
        ("gap_events", num(u.gap_events)),
        ("missing_sequences", num(u.missing_sequences)),
        ("sessions_lost", num(u.sessions_lost)),
        ("sessions_lost_in_range", num(r.sessions_lost_in_range())),
        recent.0,
        recent.1,
    ])
}

/// The whole report as one JSON object.
pub fn report(r: &Report) -> Json {
    let (missing, gaps, gappy) = r.missing();
    let o = &r.options;
    let v = &r.verify;
    let sinks_verified = v
        .sinks
        .iter()
        .map(|s| {
            let a = &s.accounting;
            obj(vec![
                ("sink", text(&s.name)),
                ("stream", text(s.stream.as_str())),
                ("cursor", num(s.next)),
                ("unrecorded", Json::Bool(a.unrecorded)),
                ("from", num(a.from)),
                ("delivered", num(a.delivered)),
                ("parked", num(a.parked)),
                ("retried", num(a.retried)),
                ("skipped", num(a.skipped)),
                ("discarded", num(a.discarded)),
                ("adopted", num(a.adopted)),
                ("not_selected", num(a.not_selected)),
                ("parked_checked", num(s.parked_checked)),
                ("parked_unprovable", num(s.parked_unprovable)),
            ])
        })
        .collect();
    obj(vec![
        ("schema", text(SCHEMA)),
        ("version", text(r.version)),
        ("made_at", time(o.made_at_ms)),
        (
            "store",
            obj(vec![
                ("backend", text(r.backend)),
                ("name", text(&o.store_name)),
            ]),
        ),
        (
            "range",
            obj(vec![
                ("since", o.since_ms.map_or(Json::Null, time)),
                ("until", o.until_ms.map_or(Json::Null, time)),
                (
                    "sources",
                    Json::Array(
                        o.sources
                            .iter()
                            .map(|(a, s)| text(&format!("{a}/{s}")))
                            .collect(),
                    ),
                ),
                ("first_entry_at", r.first_ms.map_or(Json::Null, time)),
                ("last_entry_at", r.last_ms.map_or(Json::Null, time)),
            ]),
        ),
        (
            "verify",
            obj(vec![
                ("ok", Json::Bool(v.violation.is_none())),
                ("verdict", text(r.verdict())),
                ("violation", v.violation.as_deref().map_or(Json::Null, text)),
                ("audit_entries", num(v.audit_entries)),
                ("audit_from", num(v.audit_from)),
                ("effects", num(v.effects)),
                ("quarantined", num(v.quarantined)),
                ("counts", counts(&v.counts)),
                ("sinks", Json::Array(sinks_verified)),
            ]),
        ),
        ("chain_head", text(&hex(&r.chain_head))),
        (
            "retention_anchor",
            r.anchor.map_or(Json::Null, |(i, h)| {
                obj(vec![("index", num(i)), ("hash", text(&hex(&h)))])
            }),
        ),
        ("pruned_entries", num(r.pruned())),
        ("upstream_losses", upstream(r)),
        (
            "summary",
            obj(vec![
                ("genuine_applied", num(r.genuine())),
                (
                    "duplicates_suppressed",
                    num(r.counts.get(Outcome::Duplicate)),
                ),
                ("quarantined", num(r.quarantined())),
                ("quarantine_open", num(r.open.total())),
                ("missing_sequences", num(missing)),
                ("gaps", num(gaps)),
                ("sources_with_gaps", num(gappy)),
                (
                    "undelivered",
                    r.undelivered_words().map_or(Json::Null, |w| text(&w)),
                ),
                ("words", text(&r.words())),
            ]),
        ),
        ("counts", counts(&r.counts)),
        (
            "timeline",
            obj(vec![
                ("interval_ms", num(r.timeline.interval_ms)),
                ("start", time(r.timeline.origin_ms)),
                (
                    "bars",
                    Json::Array(
                        r.timeline
                            .bars
                            .iter()
                            .enumerate()
                            .map(|(i, b)| {
                                obj(vec![
                                    (
                                        "start",
                                        time(
                                            r.timeline.origin_ms
                                                + i as u64 * r.timeline.interval_ms,
                                        ),
                                    ),
                                    ("counts", counts(b)),
                                    ("gap_events", num(r.timeline.gaps[i].0)),
                                    ("missing", num(r.timeline.gaps[i].1)),
                                ])
                            })
                            .collect(),
                    ),
                ),
                (
                    "markers",
                    Json::Array(r.markers.iter().map(marker).collect()),
                ),
                ("markers_left_off", num(r.markers_left_off)),
            ]),
        ),
        (
            "sources",
            Json::Array(r.sources.iter().take(super::LISTED).map(source).collect()),
        ),
        ("sources_left_off", num(r.sources_left_off())),
        (
            "quarantine",
            obj(vec![
                (
                    "open",
                    listed(&r.open, |q| {
                        let (agency, source_id) = source_name(&q.source);
                        obj(vec![
                            ("id", num(q.id)),
                            ("received_at", time(q.received_at_ms)),
                            ("when", text(q.when.as_str())),
                            (
                                "outcome",
                                text(q.outcome.map_or("unknown", Outcome::as_str)),
                            ),
                            ("agency", agency),
                            ("source_id", source_id),
                            ("reason", text(&q.reason)),
                            ("key", opt_hex(q.key)),
                            ("deliveries", num(q.deliveries)),
                        ])
                    }),
                ),
                (
                    "resolutions",
                    listed(&r.resolutions, |x| {
                        obj(vec![
                            ("index", num(x.index)),
                            ("at", time(x.at_ms)),
                            ("outcome", text(x.outcome.as_str())),
                            ("quarantine_id", opt_num(x.quarantine_id)),
                            ("operator", x.operator.as_deref().map_or(Json::Null, text)),
                            ("why", text(&x.why)),
                            ("recorded", text(&x.recorded)),
                        ])
                    }),
                ),
            ]),
        ),
        ("proofs", Json::Array(r.proofs.iter().map(burst).collect())),
        (
            "delivery",
            obj(vec![
                (
                    "sinks",
                    Json::Array(r.sinks.iter().map(|s| Json::Object(s.fields())).collect()),
                ),
                (
                    "actions",
                    listed(&r.relay_actions, |a| {
                        obj(vec![
                            ("index", num(a.index)),
                            ("at", time(a.at_ms)),
                            ("sink", text(&a.sink)),
                            ("reason", text(&a.reason)),
                        ])
                    }),
                ),
            ]),
        ),
        (
            "commands",
            Json::Array(
                r.commands()
                    .into_iter()
                    .map(|(what, cmd)| obj(vec![("what", text(&what)), ("command", text(&cmd))]))
                    .collect(),
            ),
        ),
    ])
}
