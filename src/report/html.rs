//! The report as one self-contained HTML page: inline CSS and the inline SVG timeline, no
//! script, font, image or link to anything elsewhere; a print stylesheet (each section on a
//! new page, table heads repeated, long hashes wrapped). Every text from outside goes through
//! `escape_html`. Numbers carry stable `id`/`data-*` attributes so a test can read them.

use std::fmt::Write as _;

use super::{Report, SourceRow, escape_html as e};
use crate::model::{Outcome, hex};

const CSS: &str = "
:root{--ink:#1a1a1a;--muted:#555;--line:#ccc;--ok:#0b6e4f;--bad:#b00020}
*{box-sizing:border-box}
body{font:14px/1.45 system-ui,-apple-system,'Segoe UI',Roboto,'Helvetica Neue',Arial,sans-serif;color:var(--ink);margin:0 auto;max-width:1180px;padding:16px 20px}
h1{font-size:22px;margin:8px 0}h2{font-size:18px;margin:18px 0 8px;border-bottom:2px solid var(--ink)}
.banner{padding:10px 14px;border-radius:4px;font-size:16px;margin:0 0 10px;color:#fff}
.banner.failed{background:var(--bad)}.banner.ok{background:var(--ok)}.banner.missing{background:#F5B400;color:#1a1a1a}
.words{font-size:16px;font-weight:600}
dl.facts{display:grid;grid-template-columns:max-content 1fr;gap:2px 14px;margin:8px 0}
dl.facts dt{color:var(--muted)}dl.facts dd{margin:0}
table{border-collapse:collapse;width:100%;margin:6px 0 12px}
th,td{border:1px solid var(--line);padding:3px 6px;text-align:left;vertical-align:top;overflow-wrap:anywhere;word-break:break-word}
th{background:#f0f0f0;overflow-wrap:normal;word-break:normal;hyphens:manual}td.n,th.n{text-align:right;font-variant-numeric:tabular-nums;white-space:nowrap;overflow-wrap:normal;word-break:normal}
table#counts{width:auto;min-width:320px}
code,.h{font:12px/1.35 ui-monospace,'DejaVu Sans Mono',Menlo,Consolas,monospace;overflow-wrap:anywhere;word-break:break-all}
tr.attention td:first-child{border-left:4px solid #D55E00}
tr.before-range td{background:#f6f6f6}
ul.gaps{margin:0;padding:0;list-style:none}ul.gaps li{display:inline}ul.gaps li+li::before{content:', '}
td.gaps{min-width:12em}td.name{min-width:7em;overflow-wrap:normal;word-break:normal}
p.more-gaps{margin:2px 0 0}
ol.markers{margin:4px 0 0;padding-left:28px}
svg.timeline{width:100%;height:auto;display:block}
.muted{color:var(--muted)}
pre.cmd{background:#f6f6f6;border:1px solid var(--line);padding:3px 8px;white-space:pre-wrap;overflow-wrap:anywhere;margin:1px 0 6px}
p.what{margin:6px 0 0}
@page{margin:14mm 12mm}
@media print{
 body{max-width:none;padding:0;font-size:10pt}
 table{font-size:9pt}
 code,.h,pre.cmd{font-size:8pt}
 section{break-before:page}
 thead{display:table-header-group}
 tr,figure,pre.cmd{break-inside:avoid}
 h2{break-after:avoid}
 .banner,th,svg,tr.attention td:first-child{-webkit-print-color-adjust:exact;print-color-adjust:exact}
}
";

/// Unix milliseconds shown in the report's zone.
fn t(r: &Report, ms: u64) -> String {
    e(&r.options.zone.show_ms(ms))
}

/// A number with its stable id.
fn n(id: &str, v: u64) -> String {
    format!("<span id=\"{id}\" data-value=\"{v}\">{v}</span>")
}

/// The whole page.
pub fn page(r: &Report) -> String {
    let mut s = String::with_capacity(64 * 1024);
    let _ = write!(
        s,
        "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">\
         <meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\
         <meta name=\"generator\" content=\"replay-guard {}\">\
         <title>After-action report: {}</title><style>{CSS}</style></head><body>\n",
        e(r.version),
        e(&r.options.store_name)
    );
    verdict(&mut s, r);
    timeline(&mut s, r);
    sources(&mut s, r);
    quarantine(&mut s, r);
    proofs(&mut s, r);
    delivery(&mut s, r);
    commands(&mut s, r);
    s.push_str("</body></html>\n");
    s
}

fn verdict(s: &mut String, r: &Report) {
    let v = &r.verify;
    let ok = v.violation.is_none();
    let _ = write!(
        s,
        "<header id=\"verdict\" data-verify=\"{}\" data-verdict=\"{}\">",
        if ok { "ok" } else { "failed" },
        r.verdict()
    );
    match &v.violation {
        Some(why) => {
            let _ = write!(
                s,
                "<div class=\"banner failed\" id=\"verify-failed\" role=\"alert\"><strong>VERIFY \
                 FAILED</strong>: the record cannot be trusted as it stands. {}</div>",
                e(why)
            );
        }
        None => {
            let (class, head) = if let Some(words) = r.undelivered_words() {
                let missing = if r.missing().0 > 0 || r.sessions_lost_in_range() > 0 {
                    format!(" Also upstream: {}.", e(&r.missing_words()))
                } else {
                    String::new()
                };
                (
                    "banner missing",
                    format!(
                        "<strong>Verified, but not everything reached the receivers</strong>: \
                         {}.{missing} The record below is intact; <code>relay status</code> and <code>relay \
                         parked</code> show each sink.<br>",
                        e(&words)
                    ),
                )
            } else if r.verdict() == "missing" {
                let lost = r.sessions_lost_in_range();
                let words = match (r.missing().0 > 0, lost > 0) {
                    (true, false) => format!(
                        "<strong>Verified, but sequences are missing upstream</strong>: {}. \
                         The record below is intact; what never reached it is listed per \
                         source.",
                        e(&r.missing_words())
                    ),
                    (missing, _) => format!(
                        "<strong>Verified, but a broker lost replay-guard's session</strong> \
                         ({lost} time{} in range): anything published while replay-guard was \
                         away may never have reached it{}. The record below is intact.",
                        if lost == 1 { "" } else { "s" },
                        if missing {
                            format!("; {}", e(&r.missing_words()))
                        } else {
                            String::new()
                        }
                    ),
                };
                ("banner missing", format!("{words}<br>"))
            } else {
                ("banner ok", "<strong>Verified</strong>: ".to_string())
            };
            let _ = write!(
                s,
                "<div class=\"{class}\" id=\"verify-ok\">{head}Hash chain \
                 intact over {} audit entries {}; {} effects and {} quarantine records proven \
                 against their audit entries; every relay sink's offsets accounted for.</div>",
                v.audit_entries,
                if v.audit_from == 0 {
                    "from the first entry".to_string()
                } else {
                    format!("from the retention anchor (entry #{})", v.audit_from)
                },
                v.effects,
                v.quarantined
            );
        }
    }
    if ok && !v.sinks.is_empty() {
        s.push_str("<ul class=\"accounting\">");
        for sink in &v.sinks {
            let _ = write!(
                s,
                "<li>{}</li>",
                e(&crate::commands::verify::sink_line(sink))
            );
        }
        s.push_str("</ul>");
    }
    s.push_str("<h1>After-action report</h1>");
    let _ = write!(s, "<p class=\"words\" id=\"words\">{}</p>", e(&r.words()));
    let in_range = r.sessions_lost_in_range();
    let _ = write!(
        s,
        "<p id=\"upstream\" data-gap-events=\"{}\" data-missing=\"{}\" data-sessions-lost=\"{}\" \
         data-sessions-lost-in-range=\"{in_range}\"><strong>Upstream losses</strong> (what \
         <code>run</code> recorded): {}{}.</p>",
        r.upstream.gap_events,
        r.upstream.missing_sequences,
        r.upstream.sessions_lost,
        e(&r.upstream_words()),
        if in_range > 0 {
            format!(
                "; {in_range} broker session{} lost in range, marked on the timeline",
                if in_range == 1 { "" } else { "s" }
            )
        } else {
            String::new()
        }
    );
    let o = &r.options;
    let range = match (o.since_ms, o.until_ms) {
        (None, None) => "everything retained".to_string(),
        (Some(a), None) => format!("from {}", o.zone.show_ms(a)),
        (None, Some(b)) => format!("before {}", o.zone.show_ms(b)),
        (Some(a), Some(b)) => format!("from {} to before {}", o.zone.show_ms(a), o.zone.show_ms(b)),
    };
    let entries = match (r.first_ms, r.last_ms) {
        (Some(a), Some(b)) => format!(
            "decisions recorded {} to {}",
            o.zone.show_ms(a),
            o.zone.show_ms(b)
        ),
        _ => "no decisions in range".into(),
    };
    let sources = if o.sources.is_empty() {
        "all".to_string()
    } else {
        o.sources
            .iter()
            .map(|(a, s)| format!("{a}/{s}"))
            .collect::<Vec<_>>()
            .join(", ")
    };
    let _ = write!(
        s,
        "<dl class=\"facts\"><dt>Store</dt><dd id=\"store\" data-backend=\"{}\"><code>{}</code> \
         ({})</dd><dt>Range</dt><dd id=\"range\">{}; {}</dd><dt>Sources</dt><dd>{}</dd>\
         <dt>Chain head</dt><dd><code class=\"h\" id=\"chain-head\">{}</code></dd>\
         <dt>Retention anchor</dt><dd>{}</dd><dt>Made</dt><dd id=\"made-at\">{}</dd>\
         <dt>replay-guard</dt><dd id=\"version\">{}</dd></dl>",
        r.backend,
        e(&o.store_name),
        if r.backend == "postgres" {
            "PostgreSQL schema"
        } else {
            "redb file"
        },
        e(&range),
        e(&entries),
        e(&sources),
        hex(&r.chain_head),
        match r.anchor {
            Some((i, h)) => format!(
                "entry #{i}, hash <code class=\"h\" id=\"anchor\">{}</code>: <span \
                 id=\"pruned\" data-value=\"{}\">{}</span> entries (#0 to #{i}) pruned by \
                 retention before the oldest retained one{}",
                hex(&h),
                r.pruned(),
                r.pruned(),
                match o.since_ms {
                    Some(since) if r.first_kept_ms.is_some_and(|f| f <= since) => {
                        ", all before the range".to_string()
                    }
                    None => "; the report covers what is retained".to_string(),
                    Some(_) => format!(
                        "; the range reaches back past it, so its earliest decisions are gone{}",
                        r.first_kept_ms.map_or(String::new(), |f| format!(
                            " (the oldest retained is from {})",
                            o.zone.show_ms(f)
                        ))
                    ),
                }
            ),
            None => "none: nothing pruned, the chain starts at the first entry".into(),
        },
        t(r, o.made_at_ms),
        e(r.version)
    );
    s.push_str(
        "<table id=\"counts\"><thead><tr><th>Decisions in range</th><th class=\"n\">Count</th>\
         </tr></thead><tbody>",
    );
    for o in Outcome::ALL {
        let _ = write!(
            s,
            "<tr><td>{o}</td><td class=\"n\">{}</td></tr>",
            n(&format!("count-{o}"), r.counts.get(o))
        );
    }
    let _ = write!(
        s,
        "<tr><th>total</th><th class=\"n\">{}</th></tr></tbody></table>",
        n("count-total", r.counts.total())
    );
    let _ = write!(
        s,
        "<p class=\"muted\">Summary: {} genuine, {} duplicates, {} quarantined, {} still open.</p>",
        n("genuine", r.genuine()),
        n("duplicates", r.counts.get(Outcome::Duplicate)),
        n("quarantined", r.quarantined()),
        n("quarantine-open", r.open.total())
    );
    s.push_str("</header>\n");
}

fn timeline(s: &mut String, r: &Report) {
    s.push_str("<section id=\"timeline\"><h2>Timeline</h2><figure>");
    s.push_str(&super::svg::timeline(
        &r.timeline,
        &r.markers,
        &r.options.zone,
    ));
    let bursts = r
        .markers
        .iter()
        .filter(|m| m.kind == super::MarkerKind::Burst)
        .count();
    let lost = r.sessions_lost_in_range();
    let (events, missing) = r
        .timeline
        .gaps
        .iter()
        .fold((0, 0), |(a, b), (e, m)| (a + e, b + m));
    let _ = write!(
        s,
        "<figcaption class=\"muted\">Decisions per {}, stacked by outcome. {} failover replay \
         burst{} shaded{}; {} broker session{} lost (ticks). Under the bars, two strips with \
         their own scales: <strong>held</strong>, the deliveries quarantined per bar \
         (conflict, stale, malformed), and <strong>gaps</strong>, the gap events per bar (an \
         applied sequence jumping past its source's highest + 1): <span id=\"gap-events\" \
         data-value=\"{events}\">{events}</span> in range, leaving {missing} sequences \
         missing when they arrived.</figcaption>",
        super::svg::interval_words(r.timeline.interval_ms),
        bursts,
        if bursts == 1 { "" } else { "s" },
        if bursts > 0 {
            " (labelled with the broker and the duplicates it absorbed)"
        } else {
            ""
        },
        lost,
        if lost == 1 { "" } else { "s" },
    );
    // The strips' scales, printed (the chart carries them only as attributes).
    let busiest = |values: &mut dyn Iterator<Item = u64>| {
        values
            .enumerate()
            .max_by_key(|(i, v)| (*v, std::cmp::Reverse(*i)))
            .filter(|(_, v)| *v > 0)
            .map(|(i, v)| (v, r.timeline.origin_ms + i as u64 * r.timeline.interval_ms))
    };
    let scale = |what: &str, top: Option<(u64, u64)>| match top {
        Some((v, at)) => format!("{what}: full height {v} per bar (at {})", t(r, at)),
        None => format!("{what}: none"),
    };
    let held = busiest(&mut (0..r.timeline.bars.len()).map(|i| r.timeline.held(i)));
    let gaps = busiest(&mut r.timeline.gaps.iter().map(|g| g.0));
    s.push_str("</figure>");
    let _ = write!(
        s,
        "<p class=\"muted\" id=\"strip-scales\">Strip scales: {}; {}.</p>",
        scale("held", held),
        scale("gaps", gaps)
    );
    if !r.markers.is_empty() {
        s.push_str("<ol class=\"markers\">");
        for m in &r.markers {
            let when = match m.until_ms {
                Some(u) => format!("{} to {}", t(r, m.at_ms), t(r, u)),
                None => t(r, m.at_ms),
            };
            let _ = write!(
                s,
                "<li class=\"marker\" data-kind=\"{}\">{when}: {}</li>",
                m.kind.as_str(),
                e(&m.label)
            );
        }
        s.push_str("</ol>");
        left_off(s, r.markers_left_off, "stats --format json");
    }
    s.push_str("</section>\n");
}

fn source_row(s: &mut String, r: &SourceRow) {
    let c = &r.counts;
    let attention = r.open > 0 || r.gaps_total > 0;
    let _ = write!(
        s,
        "<tr class=\"source{}\" data-source=\"{}\" data-applied=\"{}\" data-applied-late=\"{}\" \
         data-duplicate=\"{}\" data-conflict=\"{}\" data-stale=\"{}\" data-malformed=\"{}\" \
         data-open=\"{}\" data-missing=\"{}\" data-gaps=\"{}\"><td class=\"name\">{}</td>",
        if attention { " attention" } else { "" },
        e(&r.name()),
        c.get(Outcome::Applied),
        c.get(Outcome::AppliedLate),
        c.get(Outcome::Duplicate),
        c.get(Outcome::Conflict),
        c.get(Outcome::Stale),
        c.get(Outcome::Malformed),
        r.open,
        r.missing(),
        r.gaps_total,
        e(&r.name())
    );
    for o in [
        Outcome::Applied,
        Outcome::AppliedLate,
        Outcome::Duplicate,
        Outcome::Conflict,
        Outcome::Stale,
        Outcome::Malformed,
    ] {
        let _ = write!(s, "<td class=\"n\">{}</td>", c.get(o));
    }
    let _ = write!(s, "<td class=\"n\">{}</td><td class=\"gaps\">", r.open);
    if r.gaps.is_empty() {
        s.push_str(if r.source.is_some() { "none" } else { "-" });
    } else {
        s.push_str("<ul class=\"gaps\">");
        // Inline, the epoch named where it changes: 20 gaps take a few lines, not a page.
        let mut epoch = None;
        for g in &r.gaps {
            let range = if g.from == g.to {
                g.from.to_string()
            } else {
                format!("{}..{} ({})", g.from, g.to, g.to - g.from + 1)
            };
            let _ = write!(
                s,
                "<li class=\"gap\" data-epoch=\"{}\" data-from=\"{}\" data-to=\"{}\">{}{range}</li>",
                g.epoch,
                g.from,
                g.to,
                if epoch == Some(g.epoch) {
                    String::new()
                } else {
                    format!("epoch {}: ", g.epoch)
                }
            );
            epoch = Some(g.epoch);
        }
        s.push_str("</ul>");
        let more = r.gaps_total - r.gaps.len() as u64;
        if more > 0 {
            let _ = write!(
                s,
                "<p class=\"more-gaps\" data-value=\"{more}\">… {more} more ({} missing in \
                 all {} gaps): <code>replay-guard gaps --source {}</code></p>",
                r.missing,
                r.gaps_total,
                e(&super::shell_quote(&r.name()))
            );
        }
    }
    let _ = write!(
        s,
        "</td><td>{}</td></tr>",
        r.high_water
            .map_or("-".to_string(), |(ep, q)| format!("{ep}/{q}"))
    );
}

fn sources(s: &mut String, r: &Report) {
    s.push_str(
        "<section id=\"sources\"><h2>Per source</h2><p class=\"muted\">Sources with a record \
         still held in quarantine or a sequence missing come first. Gaps are the sequences \
         missing between the lowest and highest seen in an epoch in range, as <code>gaps</code> \
         lists them (the first 20 per source; <code>gaps --source</code> lists them all); the \
         high-water mark is epoch/sequence.</p><table><thead><tr><th>Source</th>\
         <th class=\"n\">applied</th><th class=\"n\">applied late</th><th class=\"n\">\
         duplicates</th><th class=\"n\">conflicts</th><th class=\"n\">stale</th><th \
         class=\"n\">malformed</th><th class=\"n\">open</th><th>gaps (missing)</th><th>high-water</th>\
         </tr></thead><tbody>",
    );
    if r.sources.is_empty() {
        s.push_str("<tr><td colspan=\"10\">no decisions in range</td></tr>");
    }
    for row in r.sources.iter().take(super::LISTED) {
        source_row(s, row);
    }
    s.push_str("</tbody></table>");
    left_off(s, r.sources_left_off(), "stats --format json");
    s.push_str("</section>\n");
}

fn quarantine(s: &mut String, r: &Report) {
    let _ = write!(
        s,
        "<section id=\"quarantine\"><h2>Quarantine</h2><h3>Still open: {}</h3><p \
         class=\"muted\">Every record still held, whenever it was received (shaded: received \
         before the range); its source is read from its own stored message.</p>",
        r.open.total()
    );
    if r.open.items.is_empty() {
        s.push_str("<p>Nothing is held.</p>");
    } else {
        s.push_str(
            "<table><thead><tr><th class=\"n\">id</th><th>received</th><th>outcome</th>\
             <th>source</th><th>reason</th><th>key</th><th class=\"n\">deliveries</th></tr>\
             </thead><tbody>",
        );
        for q in &r.open.items {
            let _ = write!(
                s,
                "<tr class=\"open{}\" data-id=\"{}\" data-when=\"{}\"><td class=\"n\">{}</td>\
                 <td>{}{}</td><td>{}</td><td>{}</td><td>{}</td><td><code class=\"h\">{}</code></td>\
                 <td class=\"n\">{}</td></tr>",
                if q.when == super::InRange::Before {
                    " before-range"
                } else {
                    ""
                },
                q.id,
                q.when.as_str(),
                q.id,
                t(r, q.received_at_ms),
                match q.when {
                    super::InRange::Before => " (before the range)",
                    super::InRange::After => " (after the range)",
                    super::InRange::In => "",
                },
                q.outcome.map_or("unknown", Outcome::as_str),
                q.source
                    .as_ref()
                    .map_or("(unparseable)".to_string(), |(a, src)| e(&format!(
                        "{a}/{src}"
                    ))),
                e(&q.reason),
                q.key.map_or("-".to_string(), |k| hex(&k)),
                q.deliveries
            );
        }
        s.push_str("</tbody></table>");
        left_off(s, r.open.left_off, "dump-quarantine");
    }
    let _ = write!(
        s,
        "<h3>Released or discarded by an operator: {}</h3>",
        r.resolutions.total()
    );
    if r.resolutions.items.is_empty() {
        s.push_str("<p>None in range.</p>");
    } else {
        s.push_str(
            "<table><thead><tr><th class=\"n\">entry</th><th>when</th><th>decision</th><th \
             class=\"n\">quarantine id</th><th>operator</th><th>reason</th></tr></thead><tbody>",
        );
        for x in &r.resolutions.items {
            let _ = write!(
                s,
                "<tr class=\"resolution\" data-index=\"{}\"><td class=\"n\">#{}</td><td>{}</td>\
                 <td>{}</td><td class=\"n\">{}</td><td>{}</td><td>{}</td></tr>",
                x.index,
                x.index,
                t(r, x.at_ms),
                x.outcome,
                x.quarantine_id.map_or("-".to_string(), |i| i.to_string()),
                x.operator.as_deref().map_or("-".to_string(), e),
                e(&x.why)
            );
        }
        s.push_str("</tbody></table>");
        left_off(s, r.resolutions.left_off, "dump-audit --outcome released");
    }
    s.push_str("</section>\n");
}

fn left_off(s: &mut String, n: u64, command: &str) {
    if n > 0 {
        let _ = write!(
            s,
            "<p class=\"muted\">… and {n} more: <code>{}</code> lists them all.</p>",
            e(command)
        );
    }
}

fn proofs(s: &mut String, r: &Report) {
    s.push_str(
        "<section id=\"proofs\"><h2>Sample proofs</h2><p class=\"muted\">For each failover \
         replay burst, up to three of the duplicates recorded inside it, each with the effect \
         it matched (same key, same digest) and the entry that applied that effect, in \
         <code>explain</code>'s words. An effect shows two times: when its message was \
         <em>received</em> (the effect's time, in the duplicate's sentence) and when the audit \
         entry that applied it was <em>recorded</em> (the entry's time, under \"applied by\"); \
         they differ by the time the decision took.</p>",
    );
    if r.proofs.is_empty() {
        s.push_str("<p>No replay burst in range.</p>");
    }
    for b in &r.proofs {
        let _ = write!(
            s,
            "<h3 class=\"burst-proof\" data-duplicates=\"{}\">Burst from {} at {}: {} duplicates \
             absorbed ({} in range)</h3>",
            b.burst.duplicates,
            e(&b.burst.broker),
            t(r, b.burst.connected_at_ms),
            b.burst.duplicates,
            b.duplicates_seen
        );
        if b.samples.is_empty() {
            s.push_str("<p>No duplicate of it is in range.</p>");
            continue;
        }
        s.push_str(
            "<table><thead><tr><th>duplicate</th><th>key / digest</th><th class=\"n\">effect</th>\
             <th>applied by</th></tr></thead><tbody>",
        );
        for p in &b.samples {
            let rec = &p.entry.record;
            let _ = write!(
                s,
                "<tr class=\"proof\"><td>#{} {}<br>{}</td><td><code class=\"h\">key {}</code><br>\
                 <code class=\"h\">digest {}</code></td><td class=\"n\">{}</td><td>{}</td></tr>",
                p.entry.index,
                match (&rec.agency, &rec.source_id, rec.epoch, rec.sequence) {
                    (Some(a), Some(src), Some(ep), Some(q)) => e(&format!("{a}/{src} {ep}/{q}")),
                    _ => String::new(),
                },
                e(&p.story_local),
                rec.key.map_or("-".to_string(), |k| hex(&k)),
                rec.digest.map_or("-".to_string(), |d| hex(&d)),
                match (p.effect_offset, p.effect_received_ms) {
                    (Some(o), Some(at)) => format!(
                        "#{o}<br><span class=\"received\">message received {}</span>",
                        t(r, at)
                    ),
                    (Some(o), None) => format!("#{o}"),
                    _ => "-".into(),
                },
                match (&p.applying, &p.applying_story_local) {
                    (Some(a), Some(story)) => format!(
                        "entry #{}, <span class=\"recorded\">entry recorded {}</span>: {}",
                        a.index,
                        t(r, a.record.recorded_at_ms),
                        e(story)
                    ),
                    _ => "pruned by retention".into(),
                }
            );
        }
        s.push_str("</tbody></table>");
    }
    s.push_str("</section>\n");
}

fn delivery(s: &mut String, r: &Report) {
    s.push_str("<section id=\"delivery\"><h2>Delivery</h2>");
    if r.sinks.is_empty() {
        s.push_str("<p>No relay sink: none configured, none with a cursor.</p>");
    } else {
        s.push_str(
            "<table><thead><tr><th>sink</th><th>kind</th><th>stream</th><th>state</th><th \
             class=\"n\">delivered</th><th class=\"n\">parked</th><th class=\"n\" title=\"offered \
             to the receiver again, same id: it may hold them twice\">resent</th><th \
             class=\"n\">lag</th><th class=\"n\">lag (s)</th><th>last error</th></tr></thead><tbody>",
        );
        for k in &r.sinks {
            let _ = write!(
                s,
                "<tr class=\"sink\" data-sink=\"{}\" data-stream=\"{}\" data-delivered=\"{}\" \
                 data-parked=\"{}\" data-resent=\"{}\" data-lag=\"{}\"><td>{}</td><td>{}</td><td>{}</td>\
                 <td>{}</td><td class=\"n\">{}</td><td class=\"n\">{}</td><td class=\"n\">{}</td>\
                 <td class=\"n\">{}</td><td class=\"n\">{}</td><td>{}</td></tr>",
                e(&k.sink),
                e(&k.stream),
                k.delivered,
                k.parked,
                k.resent,
                k.lag_events.map_or("-".to_string(), |l| l.to_string()),
                e(&k.sink),
                e(&k.kind),
                e(&k.stream),
                k.state,
                k.delivered,
                k.parked,
                k.resent,
                k.lag_events.map_or("-".to_string(), |l| format!(
                    "{l} {}",
                    if k.stream == "audit" {
                        "entries"
                    } else {
                        "effects"
                    }
                )),
                k.lag_seconds.map_or("-".to_string(), |l| l.to_string()),
                k.last_error
                    .as_ref()
                    .map_or("-".to_string(), |(at, what)| format!(
                        "{}: {}",
                        t(r, *at),
                        e(what)
                    ))
            );
        }
        s.push_str("</tbody></table>");
    }
    let _ = write!(
        s,
        "<h3>Operator actions on the sinks: {}</h3>",
        r.relay_actions.total()
    );
    if r.relay_actions.items.is_empty() {
        s.push_str("<p>None in range.</p>");
    } else {
        s.push_str(
            "<table><thead><tr><th class=\"n\">entry</th><th>when</th><th>sink</th><th>what, \
             who and why</th></tr></thead><tbody>",
        );
        for a in &r.relay_actions.items {
            let _ = write!(
                s,
                "<tr class=\"relay-action\"><td class=\"n\">#{}</td><td>{}</td><td>{}</td>\
                 <td>{}</td></tr>",
                a.index,
                t(r, a.at_ms),
                e(&a.sink),
                e(&a.reason)
            );
        }
        s.push_str("</tbody></table>");
        left_off(s, r.relay_actions.left_off, "dump-audit --outcome relay");
    }
    s.push_str("</section>\n");
}

fn commands(s: &mut String, r: &Report) {
    s.push_str(
        "<section id=\"check\"><h2>Check it yourself</h2><p class=\"muted\">Each number above \
         comes from the store; these commands show the same from the same store (read-only, \
         safe while <code>run</code> writes), each saying what it reproduces. \
         <code>dump-audit</code> takes the report's range and one source at a time; \
         <code>gaps</code> has no range and covers the whole retained log.</p>",
    );
    for (what, cmd) in r.commands() {
        let _ = write!(
            s,
            "<p class=\"what\">{}:</p><pre class=\"cmd\">{}</pre>",
            e(&what),
            e(&cmd)
        );
    }
    s.push_str("</section>\n");
}
