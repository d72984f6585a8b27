//! `report`: the after-action report's model and the one pass that gathers it from a read
//! snapshot: `verify`'s result and what `run` recorded as lost upstream, a timeline of
//! decisions per interval (with the gap events and quarantined deliveries counted per bar, the
//! replay bursts and lost broker sessions marked), per-source counts and gaps (capped, totals
//! whole), every open quarantine record, sample proofs of suppressed replays, the relay sinks
//! and the commands that reproduce every number. The renderers (`html`, `svg`, `json`) take
//! the model and return text: no I/O.
//!
//! This pass adds little to `verify`'s memory (which keeps one key per applied entry): the
//! audit log is read once (`Snapshot::scan_audit`) into per-interval and per-source counters,
//! seen sequences as ranges (`RangeSet`, growing with the gaps), and capped lists; no entry is
//! kept beyond a few samples per burst.

pub(crate) mod html;
pub(crate) mod json;
pub(crate) mod svg;

use std::collections::HashMap;
use std::ops::ControlFlow;

use crate::config::Config;
use crate::model::{Outcome, OutcomeCounts};
use crate::output::rows::SinkStatusRow;
use crate::rangeset::RangeSet;
use crate::store::verify::VerifyReport;
use crate::store::{AuditEntry, Snapshot, StoreError};
use crate::timefmt::{Zone, rfc3339_ms};

/// The schema name the JSON twin carries.
pub const SCHEMA: &str = "replay-guard.report.v1";
/// Suppressed replays shown per burst.
pub const SAMPLES_PER_BURST: usize = 3;
/// Rows a capped list (open quarantine records, resolutions, relay actions, session losses)
/// keeps; the rest are counted and named by the command that lists them all.
pub const LISTED: usize = 1000;
/// Gaps a source's row lists (the rest are counted and `gaps --source` lists them all).
pub const GAPS_LISTED: usize = 20;
/// Bars the timeline aims at, at most.
const MAX_BARS: u64 = 200;
/// The round intervals a bar may cover, shortest first (then whole days); below a second for
/// a short range (a demo, a test).
const INTERVALS_MS: [u64; 14] = [
    10, 50, 100, 500, 1_000, 5_000, 10_000, 30_000, 60_000, 300_000, 900_000, 3_600_000,
    21_600_000, 86_400_000,
];
const DAY_MS: u64 = 86_400_000;

/// What the report covers and how it was asked for.
#[derive(Debug, Clone)]
pub struct Options {
    /// Inclusive lower bound on `recorded_at`, Unix milliseconds.
    pub since_ms: Option<u64>,
    /// Exclusive upper bound.
    pub until_ms: Option<u64>,
    /// Only these producers (none: all, malformed deliveries included).
    pub sources: Vec<(String, String)>,
    /// When the report is made.
    pub made_at_ms: u64,
    /// The store as the operator named it: a file path or the PostgreSQL target.
    pub store_name: String,
    /// How the commands in "Check it yourself" name the store (`--db PATH`, `--config FILE`),
    /// shell-quoted.
    pub locator: String,
    /// The zone the HTML shows times in (JSON stays UTC).
    pub zone: Zone,
}

impl Options {
    fn in_range(&self, t: u64) -> bool {
        self.since_ms.is_none_or(|s| t >= s) && self.until_ms.is_none_or(|u| t < u)
    }

    fn wants(&self, source: Option<(&str, &str)>) -> bool {
        self.sources.is_empty()
            || source.is_some_and(|(a, s)| self.sources.iter().any(|(x, y)| x == a && y == s))
    }
}

/// What is drawn over the timeline's bars: a band (`until_ms` set) or a tick; numbered on
/// the chart and listed under it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Marker {
    pub at_ms: u64,
    pub until_ms: Option<u64>,
    pub kind: MarkerKind,
    pub label: String,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MarkerKind {
    /// A failover replay burst (a band: connected until its replay ended).
    Burst,
    /// A broker session `run` found lost at a (re)connect (a tick): whatever the broker
    /// queued for it is gone.
    SessionLost,
    /// Any other (re)connect of `run` to a broker (a lighter tick): a broker switch or a
    /// reconnect, its session kept or new.
    Connect,
}

impl MarkerKind {
    pub fn as_str(self) -> &'static str {
        match self {
            MarkerKind::Burst => "burst",
            MarkerKind::SessionLost => "session_lost",
            MarkerKind::Connect => "connect",
        }
    }
}

/// Decisions per interval: bar `i` covers `[origin_ms + i * interval_ms, + interval_ms)`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Timeline {
    pub origin_ms: u64,
    pub interval_ms: u64,
    pub bars: Vec<OutcomeCounts>,
    /// Per bar: gap events (an applied sequence jumping past its source's highest seen + 1)
    /// and the sequences they left missing.
    pub gaps: Vec<(u64, u64)>,
}

impl Timeline {
    /// Bars of a round interval over `[first_ms, last_ms]`, aligned to round times in a zone
    /// `offset_ms` east of UTC (a 1 h bar starts on the hour there).
    pub fn new(first_ms: u64, last_ms: u64, offset_ms: i64) -> Timeline {
        let span = last_ms.saturating_sub(first_ms);
        let interval_ms = interval_for(span);
        let origin_ms = align_down(first_ms, interval_ms, offset_ms);
        let n = (last_ms.saturating_sub(origin_ms) / interval_ms + 1).max(1);
        Timeline {
            origin_ms,
            interval_ms,
            bars: vec![OutcomeCounts::default(); n as usize],
            gaps: vec![(0, 0); n as usize],
        }
    }

    /// The bar `t` falls in (a time outside the bars: the nearest one).
    fn bar(&self, t: u64) -> usize {
        let i = (t.saturating_sub(self.origin_ms) / self.interval_ms) as usize;
        i.min(self.bars.len() - 1)
    }

    /// Counts `outcome` at `t`.
    fn add(&mut self, t: u64, outcome: Outcome) {
        let i = self.bar(t);
        self.bars[i].add(outcome);
    }

    /// Counts a gap event at `t` leaving `missing` sequences missing.
    fn add_gap(&mut self, t: u64, missing: u64) {
        let i = self.bar(t);
        let g = &mut self.gaps[i];
        g.0 += 1;
        g.1 = g.1.saturating_add(missing);
    }

    /// Deliveries quarantined (conflict, stale, malformed) in bar `i`.
    pub fn held(&self, i: usize) -> u64 {
        let b = &self.bars[i];
        b.get(Outcome::Conflict) + b.get(Outcome::Stale) + b.get(Outcome::Malformed)
    }

    pub fn end_ms(&self) -> u64 {
        self.origin_ms + self.interval_ms * self.bars.len() as u64
    }
}

/// The shortest round interval giving at most `MAX_BARS` bars over `span_ms` (whole days
/// beyond a day).
pub fn interval_for(span_ms: u64) -> u64 {
    INTERVALS_MS
        .iter()
        .copied()
        .find(|i| span_ms / i < MAX_BARS)
        .unwrap_or_else(|| (span_ms / MAX_BARS / DAY_MS + 1) * DAY_MS)
}

/// The latest time at or before `t` that is a multiple of `step` in a zone `offset_ms` east
/// of UTC.
pub fn align_down(t: u64, step: u64, offset_ms: i64) -> u64 {
    let local = i128::from(t) + i128::from(offset_ms);
    let step = i128::from(step);
    let aligned = local.div_euclid(step) * step - i128::from(offset_ms);
    u64::try_from(aligned.max(0)).unwrap_or(0)
}

/// One missing range of a source's sequences in one epoch (as `gaps` lists it).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Gap {
    pub epoch: u64,
    pub lowest: u64,
    pub highest: u64,
    pub from: u64,
    pub to: u64,
}

/// One producer's row; `source: None` is the row of unparseable (malformed) deliveries.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SourceRow {
    pub source: Option<(String, String)>,
    pub counts: OutcomeCounts,
    /// Quarantine records of it still open.
    pub open: u64,
    /// (epoch, sequence), from the store's source marks.
    pub high_water: Option<(u64, u64)>,
    /// The first `GAPS_LISTED` gaps by epoch and sequence.
    pub gaps: Vec<Gap>,
    /// All its gaps and the sequences missing in them (uncapped).
    pub gaps_total: u64,
    pub missing: u64,
}

impl SourceRow {
    pub fn missing(&self) -> u64 {
        self.missing
    }

    pub fn name(&self) -> String {
        match &self.source {
            Some((a, s)) => format!("{a}/{s}"),
            None => "(unparseable)".into(),
        }
    }
}

/// Where a time falls relative to the report's range.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum InRange {
    Before,
    In,
    After,
}

impl InRange {
    pub fn as_str(self) -> &'static str {
        match self {
            InRange::Before => "before_range",
            InRange::In => "in_range",
            InRange::After => "after_range",
        }
    }
}

/// A quarantine record still open (whenever it was received: one open from before the range
/// is still open in it).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OpenRecord {
    pub id: u64,
    pub received_at_ms: u64,
    pub when: InRange,
    pub outcome: Option<Outcome>,
    /// From its stored payload, decoded under the feed contract (`None`: it does not
    /// decode, a malformed message).
    pub source: Option<(String, String)>,
    pub reason: String,
    pub key: Option<[u8; 32]>,
    pub deliveries: u64,
}

/// An operator's release or discard of a quarantined message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Resolution {
    pub index: u64,
    pub at_ms: u64,
    pub outcome: Outcome,
    pub quarantine_id: Option<u64>,
    /// Who, and why, as the audit entry's reason words them (`None`: not in that form).
    pub operator: Option<String>,
    pub why: String,
    /// The audit entry's reason, verbatim.
    pub recorded: String,
}

/// An audited operator action on a relay sink (outcome `relay`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RelayAction {
    pub index: u64,
    pub at_ms: u64,
    pub sink: String,
    pub reason: String,
}

/// A suppressed replay and the effect it matched, as `explain` tells it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Proof {
    pub entry: AuditEntry,
    pub effect_offset: Option<u64>,
    /// When the matched effect's message was received (`None`: its record is gone).
    pub effect_received_ms: Option<u64>,
    /// The entry that applied the matched effect (`None`: pruned by retention).
    pub applying: Option<AuditEntry>,
    /// `explain`'s sentences for the duplicate and the applying entry, UTC and in the zone.
    pub story_utc: String,
    pub story_local: String,
    pub applying_story_utc: Option<String>,
    pub applying_story_local: Option<String>,
}

/// One replay burst with up to `SAMPLES_PER_BURST` of the duplicates it absorbed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BurstProofs {
    pub burst: crate::store::tables::BurstRecord,
    /// Duplicate entries recorded inside the burst's band in the report's range.
    pub duplicates_seen: u64,
    pub samples: Vec<Proof>,
}

/// A capped list and how many it left out.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Listed<T> {
    pub items: Vec<T>,
    pub left_off: u64,
}

impl<T> Default for Listed<T> {
    fn default() -> Self {
        Listed {
            items: Vec::new(),
            left_off: 0,
        }
    }
}

impl<T> Listed<T> {
    fn push(&mut self, item: T) {
        if self.items.len() < LISTED {
            self.items.push(item);
        } else {
            self.left_off += 1;
        }
    }
    pub fn total(&self) -> u64 {
        self.items.len() as u64 + self.left_off
    }
}

/// Everything the report says.
pub struct Report {
    pub options: Options,
    pub version: &'static str,
    pub backend: &'static str,
    /// The times of the first and the last audit entry in range (`None`: none).
    pub first_ms: Option<u64>,
    pub last_ms: Option<u64>,
    pub verify: VerifyReport,
    pub chain_head: [u8; 32],
    pub anchor: Option<(u64, [u8; 32])>,
    /// When the oldest retained audit entry was recorded (`None`: none is).
    pub first_kept_ms: Option<u64>,
    /// Audit entries in range (of the selected sources) per outcome.
    pub counts: OutcomeCounts,
    pub timeline: Timeline,
    /// Bursts, then the broker sessions lost in range (capped at `LISTED`;
    /// `markers_left_off` more).
    pub markers: Vec<Marker>,
    pub markers_left_off: u64,
    /// What `run` recorded as lost upstream (`Snapshot::upstream_losses`): totals since the
    /// store was made, and the newest events.
    pub upstream: crate::store::tables::UpstreamLosses,
    /// Sources with something open or missing first, then by name; the unparseable row last.
    pub sources: Vec<SourceRow>,
    pub open: Listed<OpenRecord>,
    pub resolutions: Listed<Resolution>,
    pub proofs: Vec<BurstProofs>,
    pub sinks: Vec<SinkStatusRow>,
    pub relay_actions: Listed<RelayAction>,
}

impl Report {
    /// Sequences missing, gaps and sources with a gap, over the range (uncapped).
    pub fn missing(&self) -> (u64, u64, u64) {
        let gappy = self.sources.iter().filter(|s| s.gaps_total > 0);
        (
            crate::decide::total_missing(gappy.clone().map(|s| s.missing)),
            gappy.clone().map(|s| s.gaps_total).sum(),
            gappy.count() as u64,
        )
    }

    /// "X sequences missing in Y gaps across Z sources" (or that none is).
    pub fn missing_words(&self) -> String {
        let (x, y, z) = self.missing();
        if x == 0 {
            return "no sequence missing".into();
        }
        let implausible = self
            .sources
            .iter()
            .flat_map(|s| &s.gaps)
            .any(|g| g.to - g.from >= crate::decide::PLAUSIBLE_GAP);
        format!(
            "{x} sequence{} missing in {y} gap{} across {z} source{}{}",
            plural(x),
            plural(y),
            plural(z),
            if implausible {
                format!(
                    " (one an implausible jump of over {} sequences: a producer that \
                     restarted its counter without a new epoch, or a forged sequence)",
                    crate::decide::PLAUSIBLE_GAP
                )
            } else {
                String::new()
            }
        )
    }

    /// Broker sessions lost in range (as `run` recorded them; the newest only).
    pub fn sessions_lost_in_range(&self) -> u64 {
        self.markers
            .iter()
            .filter(|m| m.kind == MarkerKind::SessionLost)
            .count() as u64
            + self.markers_left_off
    }

    /// What `run` recorded as lost upstream since the store was made, in words.
    pub fn upstream_words(&self) -> String {
        let u = &self.upstream;
        format!(
            "{} gap{} confirmed by run ({} sequence{}), {} broker session{} lost, since the \
             store was made",
            u.gap_events,
            plural(u.gap_events),
            u.missing_sequences,
            plural(u.missing_sequences),
            u.sessions_lost,
            plural(u.sessions_lost)
        )
    }

    /// Source rows beyond the `LISTED` the page and the JSON show (the totals count them all).
    pub fn sources_left_off(&self) -> u64 {
        self.sources.len().saturating_sub(LISTED) as u64
    }

    /// How many audit entries retention pruned (all before the oldest retained one).
    pub fn pruned(&self) -> u64 {
        self.anchor.map_or(0, |(i, _)| i + 1)
    }

    /// The banner: `failed` (verify found a violation), `undelivered` (verified, but a sink's
    /// receiver has not received everything: events parked, behind, or not started),
    /// `missing` (verified, but sequences are missing upstream in range) or `ok`.
    pub fn verdict(&self) -> &'static str {
        if self.verify.violation.is_some() {
            "failed"
        } else if !self.undelivered().is_empty() {
            "undelivered"
        } else if self.missing().0 > 0 || self.sessions_lost_in_range() > 0 {
            "missing"
        } else {
            "ok"
        }
    }

    /// The sinks whose receivers have not received every event up to the head: some parked
    /// (refused by the receiver, never reached it), some not yet delivered, or none at all
    /// (a configured sink without a cursor).
    pub fn undelivered(&self) -> Vec<&SinkStatusRow> {
        self.sinks.iter().filter(|s| !delivered_all(s)).collect()
    }

    /// The undelivered sinks in words ("cop: 0 delivered, 60 parked (never reached the
    /// receiver)"), or `None` when every sink's receiver has everything.
    pub fn undelivered_words(&self) -> Option<String> {
        let sinks = self.undelivered();
        (!sinks.is_empty()).then(|| {
            sinks
                .iter()
                .map(|s| sink_words(s))
                .collect::<Vec<_>>()
                .join("; ")
        })
    }

    /// Applied once: applied, applied late, or released by an operator.
    pub fn genuine(&self) -> u64 {
        self.counts.get(Outcome::Applied)
            + self.counts.get(Outcome::AppliedLate)
            + self.counts.get(Outcome::Released)
    }

    /// Deliveries quarantined (conflict, stale, malformed).
    pub fn quarantined(&self) -> u64 {
        self.counts.get(Outcome::Conflict)
            + self.counts.get(Outcome::Stale)
            + self.counts.get(Outcome::Malformed)
    }

    /// The verdict in words (no markup), the report's first sentence.
    pub fn words(&self) -> String {
        let sinks: Vec<String> = self.sinks.iter().map(sink_words).collect();
        format!(
            "{} genuine events applied once; {}; {} deliveries suppressed as proven duplicates; \
             {} held in quarantine ({} still open); sinks: {}.",
            self.genuine(),
            self.missing_words(),
            self.counts.get(Outcome::Duplicate),
            self.quarantined(),
            self.open.total(),
            if sinks.is_empty() {
                "none".to_string()
            } else {
                sinks.join(", ")
            }
        )
    }

    /// The commands that reproduce the report's numbers: (what they show, command line).
    /// Each claim is true as worded: `dump-audit` takes one `--source`, so several give one
    /// command each; `gaps` and `stats` have no range, so they are offered only with what
    /// they cover.
    pub fn commands(&self) -> Vec<(String, String)> {
        let o = &self.options;
        let loc = &o.locator;
        let mut range = String::new();
        if let Some(s) = o.since_ms {
            range.push_str(&format!(" --since {}", rfc3339_ms(s)));
        }
        if let Some(u) = o.until_ms {
            range.push_str(&format!(" --until {}", rfc3339_ms(u)));
        }
        let ranged = !range.is_empty();
        // (flag, name) per selected source; one empty entry for all.
        let sources: Vec<(String, Option<String>)> = if o.sources.is_empty() {
            vec![(String::new(), None)]
        } else {
            o.sources
                .iter()
                .map(|(a, s)| {
                    let name = format!("{a}/{s}");
                    (format!(" --source {}", shell_quote(&name)), Some(name))
                })
                .collect()
        };
        let mut out = vec![(
            "the verdict: chain, content and relay accounting (over the whole retained log)"
                .to_string(),
            format!("replay-guard verify {loc}"),
        )];
        for outcome in Outcome::ALL {
            let total = self.counts.get(outcome);
            if total == 0 {
                continue;
            }
            // Relay actions name no source: they are counted whatever the selection.
            let per_source: &[(String, Option<String>)] =
                if outcome == Outcome::Relay || o.sources.is_empty() {
                    &[(String::new(), None)]
                } else {
                    &sources
                };
            for (flag, name) in per_source {
                let n = match name {
                    Some(name) => self
                        .sources
                        .iter()
                        .find(|r| r.name() == *name)
                        .map_or(0, |r| r.counts.get(outcome)),
                    None => total,
                };
                let of = name
                    .as_ref()
                    .map_or(String::new(), |name| format!(" of {name}"));
                out.push((
                    format!("the {n} {outcome} decisions{of} in range (counts lines)"),
                    format!(
                        "replay-guard dump-audit {loc} --outcome {outcome}{range}{flag} --format \
                         jsonl | wc -l"
                    ),
                ));
            }
        }
        if self.counts.total() == 0 {
            out.push((
                "the decisions in range (none)".to_string(),
                format!("replay-guard dump-audit {loc}{range} --format table"),
            ));
        }
        for (flag, name) in &sources {
            let whose = name
                .as_ref()
                .map_or("per source and epoch".to_string(), |n| format!("of {n}"));
            let what = if ranged {
                format!(
                    "missing sequence ranges {whose} over the whole retained log (gaps has no \
                     range: the report's gaps are over the range only, so this may list more)"
                )
            } else {
                format!(
                    "missing sequence ranges {whose}: the report's gaps (both over the whole \
                     retained log)"
                )
            };
            out.push((
                what,
                format!("replay-guard gaps {loc}{flag} --format table"),
            ));
        }
        if !ranged && o.sources.is_empty() && self.anchor.is_none() {
            out.push((
                "decisions per outcome since the store was made, sources, bursts (the \
                 report's counts: nothing was pruned and the report has no range)"
                    .to_string(),
                format!("replay-guard stats {loc} --format json"),
            ));
        }
        if let Some(p) = self.proofs.iter().flat_map(|b| &b.samples).next()
            && let Some(key) = p.entry.record.key
        {
            out.push((
                "the whole story of a sample duplicate".to_string(),
                format!("replay-guard explain {loc} {}", crate::model::hex(&key)),
            ));
        }
        out.push((
            "the relay sinks: delivered, parked, lag".to_string(),
            format!("replay-guard relay status {loc}"),
        ));
        out.push((
            "every quarantine record still open, whenever received and of every source (the \
             report lists those of its sources)"
                .to_string(),
            format!("replay-guard dump-quarantine {loc} --format table"),
        ));
        out
    }
}

fn plural(n: u64) -> &'static str {
    if n == 1 { "" } else { "s" }
}

/// What a sink's log positions are called: "effects" or "audit entries".
/// Whether a sink's receiver has every event up to the head: nothing parked, nothing left
/// to deliver.
fn delivered_all(s: &SinkStatusRow) -> bool {
    s.parked == 0 && s.lag_events == Some(0)
}

/// A sink in the report's words: "cop caught up", or what did not reach its receiver.
fn sink_words(s: &SinkStatusRow) -> String {
    let entries = stream_entries(&s.stream);
    let Some(lag) = s.lag_events else {
        return format!(
            "{} not started: none of the {} {entries} delivered",
            s.sink, s.head
        );
    };
    let began = match &s.accounting {
        crate::json::Json::Object(m) => m.iter().find_map(|(k, v)| match v {
            crate::json::Json::String(w) if k == "began" => Some(format!(" ({w})")),
            _ => None,
        }),
        _ => None,
    }
    .unwrap_or_default();
    if delivered_all(s) {
        return format!("{} caught up{began}", s.sink);
    }
    let mut parts = vec![format!("{} delivered", s.delivered)];
    if s.parked > 0 {
        parts.push(format!("{} parked (never reached the receiver)", s.parked));
    }
    if lag > 0 {
        parts.push(format!(
            "{lag} {entries} behind ({} s)",
            s.lag_seconds.unwrap_or(0)
        ));
    }
    let state = match s.state {
        "blocked" | "failing" | "retrying" | "removed" => format!(" ({})", s.state),
        _ => String::new(),
    };
    format!("{}{state}: {}{began}", s.sink, parts.join(", "))
}

fn stream_entries(stream: &str) -> &'static str {
    match stream {
        "audit" => "audit entries",
        _ => "effects",
    }
}

/// `s` as one shell word: unchanged when it holds only safe characters, else single-quoted.
pub fn shell_quote(s: &str) -> String {
    let safe = !s.is_empty()
        && s.chars()
            .all(|c| c.is_ascii_alphanumeric() || "-_./:=@+,%".contains(c));
    if safe {
        s.to_string()
    } else {
        format!("'{}'", s.replace('\'', "'\\''"))
    }
}

/// `s` made safe for HTML text and attribute values: control and bidi characters shown as
/// escapes (`textsafe`), then `& < > " '` as character references.
pub fn escape_html(s: &str) -> String {
    let shown = crate::textsafe::escape_controls(s);
    let mut out = String::with_capacity(shown.len() + 8);
    for c in shown.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
}

/// Per (agency, source_id): counts; per (agency, source_id, epoch): seen sequences.
type Counts = HashMap<(String, String), OutcomeCounts>;
type Seen = HashMap<(String, String, u64), RangeSet>;

/// A deterministic generator for the reservoir of samples (SplitMix64).
struct Rng(u64);

impl Rng {
    fn below(&mut self, n: u64) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        (z ^ (z >> 31)) % n.max(1)
    }
}

/// Gathers the report from one snapshot, `verify`'s result given: one pass over the audit
/// log, calling `progress(n)` as each `n` more entries are read.
pub fn gather(
    snap: &Snapshot,
    config: &Config,
    verify: VerifyReport,
    options: Options,
    progress: &mut dyn FnMut(u64),
) -> Result<Report, StoreError> {
    let meta = snap.meta()?;
    let audit_first = meta.audit_anchor.map_or(0, |(i, _)| i + 1);
    // The timeline's span, without a pass: the range's ends, else the first retained entry
    // and the newest one.
    let first_kept = snap
        .audit_entry(audit_first)?
        .map(|e| e.record.recorded_at_ms);
    let newest = snap.newest_audit_ms()?;
    let lo = match (options.since_ms, first_kept) {
        (Some(s), Some(f)) => f.max(s),
        (s, f) => s.or(f).unwrap_or(options.made_at_ms),
    };
    let hi = match (options.until_ms, newest) {
        (Some(u), Some(n)) => n.min(u.saturating_sub(1)),
        (u, n) => n.or(u.map(|u| u.saturating_sub(1))).unwrap_or(lo),
    }
    .max(lo);
    let mut timeline = Timeline::new(lo, hi, options.zone.offset_ms_at(lo));

    let bursts: Vec<_> = snap
        .replay_bursts()?
        .into_iter()
        .filter(|b| {
            options.since_ms.is_none_or(|s| b.ended_at_ms >= s)
                && options.until_ms.is_none_or(|u| b.connected_at_ms < u)
        })
        .collect();
    let mut reservoirs: Vec<(u64, Vec<AuditEntry>)> = vec![(0, Vec::new()); bursts.len()];
    let mut rng = Rng(0x5eed);

    let mut counts = OutcomeCounts::default();
    let mut per_source = Counts::new();
    let mut unparseable = OutcomeCounts::default();
    let mut seen = Seen::new();
    let mut resolutions = Listed::<Resolution>::default();
    let mut relay_actions = Listed::<RelayAction>::default();
    let (mut first_ms, mut last_ms) = (None::<u64>, None::<u64>);

    let mut read = 0u64;
    snap.scan_audit::<StoreError>(audit_first, |e| {
        read += 1;
        if read.is_multiple_of(4096) {
            progress(4096);
        }
        let r = &e.record;
        let t = r.recorded_at_ms;
        let Some(outcome) = Outcome::from_code(r.outcome) else {
            return Ok(ControlFlow::Continue(()));
        };
        let source = r.agency.as_deref().zip(r.source_id.as_deref());
        // Relay actions name no source: they belong to the delivery section whatever the
        // source selection.
        if !options.in_range(t) || (outcome != Outcome::Relay && !options.wants(source)) {
            return Ok(ControlFlow::Continue(()));
        }
        first_ms = Some(first_ms.map_or(t, |f| f.min(t)));
        last_ms = Some(last_ms.map_or(t, |l| l.max(t)));
        counts.add(outcome);
        timeline.add(t, outcome);
        match source {
            Some((a, s)) => per_source
                .entry((a.to_string(), s.to_string()))
                .or_default()
                .add(outcome),
            None if outcome == Outcome::Malformed => unparseable.add(outcome),
            None => {}
        }
        if let (Some((a, s)), Some(epoch), Some(sequence)) = (source, r.epoch, r.sequence) {
            let set = seen
                .entry((a.to_string(), s.to_string(), epoch))
                .or_default();
            if outcome == Outcome::Applied
                && let Some(highest) = set.max()
                && sequence > highest.saturating_add(1)
            {
                timeline.add_gap(t, sequence - highest - 1);
            }
            set.insert(sequence);
        }
        match outcome {
            Outcome::Duplicate => {
                for (i, b) in bursts.iter().enumerate() {
                    if (b.connected_at_ms..=b.ended_at_ms).contains(&t) {
                        let (n, kept) = &mut reservoirs[i];
                        *n += 1;
                        if kept.len() < SAMPLES_PER_BURST {
                            kept.push(e.clone());
                        } else {
                            let j = rng.below(*n) as usize;
                            if j < SAMPLES_PER_BURST {
                                kept[j] = e.clone();
                            }
                        }
                    }
                }
            }
            Outcome::Released | Outcome::Discarded => {
                let (operator, why) = operator_words(&r.reason, outcome, r.quarantine_id);
                resolutions.push(Resolution {
                    index: e.index,
                    at_ms: t,
                    outcome,
                    quarantine_id: r.quarantine_id,
                    operator,
                    why,
                    recorded: r.reason.clone(),
                });
            }
            Outcome::Relay => relay_actions.push(RelayAction {
                index: e.index,
                at_ms: t,
                sink: r.topic.clone(),
                reason: r.reason.clone(),
            }),
            _ => {}
        }
        Ok(ControlFlow::Continue(()))
    })?;

    let open = open_records(snap, &config.feed, &options)?;
    let mut open_by_source: HashMap<Option<(String, String)>, u64> = HashMap::new();
    for q in &open.items {
        *open_by_source.entry(q.source.clone()).or_default() += 1;
    }
    let marks: HashMap<(String, String), (u64, u64)> = snap
        .sources()?
        .into_iter()
        .map(|s| ((s.agency, s.source_id), s.high_water))
        .collect();
    // Per source: the first `GAPS_LISTED` gaps by (epoch, from) and the uncapped totals.
    let mut epochs: Vec<(&(String, String, u64), &RangeSet)> = seen.iter().collect();
    epochs.sort_by(|a, b| a.0.cmp(b.0));
    let mut gaps_by_source: HashMap<(String, String), (Vec<Gap>, u64, u64)> = HashMap::new();
    for ((a, s, epoch), set) in epochs {
        let (Some(lowest), Some(highest)) = (set.min(), set.max()) else {
            continue;
        };
        let (list, total, missing) = gaps_by_source.entry((a.clone(), s.clone())).or_default();
        for (from, to) in set.gaps() {
            *total += 1;
            *missing = missing.saturating_add(to - from + 1);
            if list.len() < GAPS_LISTED {
                list.push(Gap {
                    epoch: *epoch,
                    lowest,
                    highest,
                    from,
                    to,
                });
            }
        }
    }
    let mut sources: Vec<SourceRow> = per_source
        .into_iter()
        .map(|(name, counts)| {
            let (gaps, gaps_total, missing) = gaps_by_source.remove(&name).unwrap_or_default();
            SourceRow {
                gaps_total,
                missing,
                open: open_by_source
                    .get(&Some(name.clone()))
                    .copied()
                    .unwrap_or(0),
                high_water: marks.get(&name).copied(),
                gaps,
                counts,
                source: Some(name),
            }
        })
        .collect();
    sources.sort_by(|a, b| {
        // Rows needing attention (something held or missing) sort first.
        let calm = |r: &SourceRow| r.open == 0 && r.gaps.is_empty();
        (calm(a), &a.source).cmp(&(calm(b), &b.source))
    });
    if unparseable.total() > 0 {
        sources.push(SourceRow {
            source: None,
            counts: unparseable,
            open: open_by_source.get(&None).copied().unwrap_or(0),
            high_water: None,
            gaps: Vec::new(),
            gaps_total: 0,
            missing: 0,
        });
    }

    let mut markers: Vec<Marker> = bursts
        .iter()
        .map(|b| Marker {
            at_ms: b.connected_at_ms,
            until_ms: Some(b.ended_at_ms.max(b.connected_at_ms)),
            kind: MarkerKind::Burst,
            label: format!("{}: {} duplicates absorbed", b.broker, b.duplicates),
        })
        .collect();
    let upstream = snap.upstream_losses()?;
    let mut lost = Listed::<Marker>::default();
    for l in upstream
        .recent_sessions_lost
        .iter()
        .filter(|l| options.in_range(l.at_ms))
    {
        lost.push(Marker {
            at_ms: l.at_ms,
            until_ms: None,
            kind: MarkerKind::SessionLost,
            label: format!("session lost at {} (client id {})", l.broker, l.client_id),
        });
    }
    // Every other connect in range: the broker switches and reconnects, so each is on the
    // timeline whether or not a replay burst followed it.
    for c in upstream.recent_connects.iter().filter(|c| {
        options.in_range(c.at_ms)
            && !upstream
                .recent_sessions_lost
                .iter()
                .any(|l| l.at_ms == c.at_ms && l.broker == c.broker)
    }) {
        lost.push(Marker {
            at_ms: c.at_ms,
            until_ms: None,
            kind: MarkerKind::Connect,
            label: format!(
                "connected to {} (client id {}; {})",
                c.broker,
                c.client_id,
                if c.session_present {
                    "session kept"
                } else {
                    "new session"
                }
            ),
        });
    }
    let markers_left_off = lost.left_off;
    let mut ticks = lost.items;
    ticks.sort_by_key(|m| m.at_ms);
    markers.extend(ticks);

    let mut proofs = Vec::with_capacity(bursts.len());
    for (burst, (n, mut kept)) in bursts.into_iter().zip(reservoirs) {
        kept.sort_by_key(|e| e.index);
        let samples = kept
            .into_iter()
            .map(|e| prove(snap, e, &options.zone))
            .collect::<Result<_, _>>()?;
        proofs.push(BurstProofs {
            burst,
            duplicates_seen: n,
            samples,
        });
    }

    let sinks = crate::commands::relay::status_rows(snap, config, options.made_at_ms)?;
    Ok(Report {
        version: env!("CARGO_PKG_VERSION"),
        backend: if snap.is_postgres() {
            "postgres"
        } else {
            "redb"
        },
        first_ms,
        last_ms,
        verify,
        chain_head: meta.chain_head,
        anchor: meta.audit_anchor,
        first_kept_ms: first_kept,
        counts,
        timeline,
        markers,
        markers_left_off,
        upstream,
        sources,
        open,
        resolutions,
        proofs,
        sinks,
        relay_actions,
        options,
    })
}

/// A duplicate entry with the effect it matched, in `explain`'s words.
fn prove(snap: &Snapshot, entry: AuditEntry, zone: &Zone) -> Result<Proof, StoreError> {
    let s = crate::commands::explain::Suppression::of(snap, &entry)?;
    let effect_received_ms = match entry.record.effect_offset {
        Some(off) => snap.effect(off)?.map(|e| e.record.received_at_ms),
        None => None,
    };
    Ok(Proof {
        effect_offset: entry.record.effect_offset,
        effect_received_ms,
        story_utc: s.sentence(&entry, &Zone::utc()),
        story_local: s.sentence(&entry, zone),
        applying_story_utc: s.applying().map(|a| s.sentence(a, &Zone::utc())),
        applying_story_local: s.applying().map(|a| s.sentence(a, zone)),
        applying: s.applying().cloned(),
        entry,
    })
}

/// The operator and their words from a resolution's audit reason (`quarantine #7 released
/// by alice: genuine`); `None` and the whole text when it is not in that form.
fn operator_words(reason: &str, outcome: Outcome, id: Option<u64>) -> (Option<String>, String) {
    let verb = if outcome == Outcome::Released {
        "released"
    } else {
        "discarded"
    };
    let prefix = match id {
        Some(id) => format!("quarantine #{id} {verb} by "),
        None => return (None, reason.to_string()),
    };
    match reason
        .strip_prefix(&prefix)
        .and_then(|rest| rest.split_once(": "))
    {
        Some((who, why)) => (Some(who.to_string()), why.to_string()),
        None => (None, reason.to_string()),
    }
}

/// Every quarantine record still open, of the selected sources, whenever it was received
/// (one from before the range is still open in it). Its source comes from its own stored
/// payload decoded under the feed contract, as `quarantine release` decodes it: never from
/// the audit entry of its first delivery, which retention may have pruned.
fn open_records(
    snap: &Snapshot,
    contract: &crate::wire::FeedContract,
    options: &Options,
) -> Result<Listed<OpenRecord>, StoreError> {
    let mut open = Listed::default();
    snap.scan_quarantine::<StoreError>(0, |q| {
        let r = &q.record;
        let source = crate::wire::decode(&r.payload, contract).ok().map(|m| {
            (
                m.source.agency().to_string(),
                m.source.source_id().to_string(),
            )
        });
        if !options.wants(source.as_ref().map(|(a, s)| (a.as_str(), s.as_str()))) {
            return Ok(ControlFlow::Continue(()));
        }
        let t = r.received_at_ms;
        let when = if options.since_ms.is_some_and(|s| t < s) {
            InRange::Before
        } else if options.until_ms.is_some_and(|u| t >= u) {
            InRange::After
        } else {
            InRange::In
        };
        open.push(OpenRecord {
            id: q.id,
            received_at_ms: t,
            when,
            outcome: Outcome::from_code(r.outcome),
            source,
            reason: r.reason.clone(),
            key: r.key,
            deliveries: r.deliveries,
        });
        Ok(ControlFlow::Continue(()))
    })?;
    Ok(open)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_interval_is_the_shortest_round_one_giving_at_most_200_bars() {
        assert_eq!(interval_for(0), 10);
        assert_eq!(interval_for(1_200), 10);
        assert_eq!(interval_for(60_000), 500);
        assert_eq!(interval_for(199_999), 1_000);
        assert_eq!(interval_for(200_000), 5_000);
        assert_eq!(interval_for(3_600_000), 30_000);
        assert_eq!(interval_for(12 * 3_600_000), 300_000);
        assert_eq!(interval_for(30 * DAY_MS), 21_600_000);
        assert_eq!(interval_for(300 * DAY_MS), 2 * DAY_MS);
    }

    #[test]
    fn bars_start_on_round_times_of_the_zone() {
        let t = 1_796_007_134_123; // 2026-11-30T02:52:14.123Z
        assert_eq!(
            rfc3339_ms(align_down(t, 3_600_000, 0)),
            "2026-11-30T02:00:00.000Z"
        );
        // St John's is 3:30 behind: its hours start at half past in UTC.
        assert_eq!(
            rfc3339_ms(align_down(t, 3_600_000, -12_600_000)),
            "2026-11-30T02:30:00.000Z"
        );
        // Berlin's midnight is 23:00 UTC the day before.
        assert_eq!(
            rfc3339_ms(align_down(t, DAY_MS, 3_600_000)),
            "2026-11-29T23:00:00.000Z"
        );
        let tl = Timeline::new(t, t + 3_600_000, 0);
        assert_eq!(tl.interval_ms, 30_000);
        assert_eq!(tl.origin_ms % 30_000, 0);
        assert!(tl.origin_ms <= t && tl.end_ms() > t + 3_600_000);
        assert!((60..=200).contains(&tl.bars.len()), "{}", tl.bars.len());
    }

    #[test]
    fn times_outside_the_bars_count_in_the_nearest_one() {
        let mut tl = Timeline::new(10_000, 20_000, 0);
        tl.add(0, Outcome::Applied);
        tl.add(u64::MAX, Outcome::Conflict);
        assert_eq!(tl.bars[0].get(Outcome::Applied), 1);
        assert_eq!(tl.bars.last().unwrap().get(Outcome::Conflict), 1);
    }

    #[test]
    fn hostile_text_is_escaped_for_html() {
        let hostile = "<script>alert(\"x\")</script> & 'y' \u{1b}[31m\u{202e}\n";
        let e = escape_html(hostile);
        assert_eq!(
            e,
            "&lt;script&gt;alert(&quot;x&quot;)&lt;/script&gt; &amp; &#39;y&#39; \\u001b[31m\\u202e\\n"
        );
        assert!(!e.contains('<') && !e.contains('"') && !e.chars().any(|c| c.is_control()));
        assert_eq!(escape_html("plain é 漢"), "plain é 漢");
    }

    #[test]
    fn shell_words_are_quoted_only_when_needed() {
        assert_eq!(shell_quote("/tmp/a.redb"), "/tmp/a.redb");
        assert_eq!(shell_quote("Cal/Fire E7"), "'Cal/Fire E7'");
        assert_eq!(shell_quote("it's"), "'it'\\''s'");
        assert_eq!(shell_quote(""), "''");
    }

    fn report(sinks: Vec<SinkStatusRow>, sources: Vec<SourceRow>) -> Report {
        Report {
            options: Options {
                since_ms: Some(1_000),
                until_ms: None,
                sources: vec![("A".into(), "1".into()), ("A".into(), "2".into())],
                made_at_ms: 2_000,
                store_name: "s.redb".into(),
                locator: "--db s.redb".into(),
                zone: Zone::utc(),
            },
            version: "0",
            backend: "redb",
            first_ms: None,
            last_ms: None,
            verify: VerifyReport::default(),
            chain_head: [0; 32],
            anchor: None,
            first_kept_ms: None,
            counts: sources.iter().fold(OutcomeCounts::default(), |mut c, s| {
                c.merge(&s.counts);
                c
            }),
            timeline: Timeline::new(1_000, 2_000, 0),
            markers: Vec::new(),
            markers_left_off: 0,
            upstream: Default::default(),
            sources,
            open: Listed::default(),
            resolutions: Listed::default(),
            proofs: Vec::new(),
            sinks,
            relay_actions: Listed::default(),
        }
    }

    fn sink(name: &str, stream: &str, lag: u64) -> SinkStatusRow {
        SinkStatusRow {
            sink: name.into(),
            kind: "exec".into(),
            stream: stream.into(),
            configured: true,
            state: "running",
            cursor: Some(0),
            head: lag,
            lag_events: Some(lag),
            lag_seconds: Some(3),
            parked: 0,
            retry_requested: 0,
            delivered: 0,
            resent: 0,
            generation: None,
            advanced_at_ms: None,
            last_error: None,
            accounting: crate::json::Json::Null,
        }
    }

    fn row(source: &str, applied: u64, gaps_total: u64, missing: u64) -> SourceRow {
        let mut counts = OutcomeCounts::default();
        for _ in 0..applied {
            counts.add(Outcome::Applied);
        }
        SourceRow {
            source: Some(("A".into(), source.into())),
            counts,
            open: 0,
            high_water: None,
            gaps: Vec::new(),
            gaps_total,
            missing,
        }
    }

    #[test]
    fn an_audit_sinks_lag_is_in_entries_and_missing_sequences_are_in_the_words() {
        let r = report(
            vec![sink("file", "effects", 30), sink("siem", "audit", 7)],
            vec![row("1", 4, 2, 5), row("2", 3, 0, 0)],
        );
        let w = r.words();
        assert!(
            w.starts_with(
                "7 genuine events applied once; 5 sequences missing in 2 gaps across 1 source;"
            ),
            "{w}"
        );
        assert!(
            w.contains("file: 0 delivered, 30 effects behind (3 s)"),
            "{w}"
        );
        assert!(
            w.contains("siem: 0 delivered, 7 audit entries behind (3 s)"),
            "{w}"
        );
        assert_eq!(r.verdict(), "undelivered", "a sink behind is not green");
        let r = report(
            vec![sink("file", "effects", 0), sink("siem", "audit", 0)],
            vec![row("1", 4, 2, 5)],
        );
        assert!(r.words().contains("sinks: file caught up, siem caught up."));
        assert_eq!(r.verdict(), "missing");
        let calm = report(Vec::new(), vec![row("1", 1, 0, 0)]);
        assert!(calm.words().contains("; no sequence missing;"));
        assert_eq!(calm.verdict(), "ok");
    }

    #[test]
    fn the_per_source_table_is_capped_and_the_totals_count_every_source() {
        // 100,000 sources made a 51 MB page before.
        let rows: Vec<SourceRow> = (0..LISTED + 7)
            .map(|i| row(&i.to_string(), 1, 1, 2))
            .collect();
        let r = report(Vec::new(), rows);
        assert_eq!(r.sources_left_off(), 7);
        assert_eq!(
            r.missing(),
            (
                2 * (LISTED as u64 + 7),
                LISTED as u64 + 7,
                LISTED as u64 + 7
            )
        );
        let page = super::html::page(&r);
        assert_eq!(page.matches("<tr class=\"source").count(), LISTED);
        assert!(page.contains("… and 7 more: <code>stats --format json</code>"));
        let json = super::json::report(&r).to_compact();
        assert!(json.contains("\"sources_left_off\":7"), "{}", &json[..200]);
    }

    #[test]
    fn parked_events_turn_the_verdict_and_say_they_never_reached_the_receiver() {
        // A COP answering 422 to everything of a one-source feed: all 60 parked, the cursor
        // at the head. Not green, and the words say why.
        let mut cop = sink("cop", "effects", 0);
        cop.parked = 60;
        cop.head = 60;
        cop.state = "parked";
        let r = report(vec![cop], vec![row("1", 60, 0, 0)]);
        assert_eq!(r.verdict(), "undelivered");
        assert_eq!(
            r.undelivered_words().as_deref(),
            Some("cop: 0 delivered, 60 parked (never reached the receiver)")
        );
        assert!(
            r.words().contains("sinks: cop: 0 delivered, 60 parked"),
            "{}",
            r.words()
        );
        let mut never = sink("cop", "effects", 0);
        never.lag_events = None;
        never.head = 60;
        let r = report(vec![never], vec![row("1", 60, 0, 0)]);
        assert_eq!(r.verdict(), "undelivered");
        assert!(
            r.words()
                .contains("cop not started: none of the 60 effects delivered")
        );
    }

    #[test]
    fn check_commands_take_one_source_each_and_claim_only_what_they_show() {
        let r = report(Vec::new(), vec![row("1", 4, 2, 5), row("2", 3, 0, 0)]);
        let commands = r.commands();
        let counts: Vec<_> = commands
            .iter()
            .filter(|(_, c)| c.ends_with("| wc -l"))
            .collect();
        assert_eq!(counts.len(), 2, "{commands:?}");
        assert_eq!(
            counts[0].0,
            "the 4 applied decisions of A/1 in range (counts lines)"
        );
        assert_eq!(
            counts[0].1,
            "replay-guard dump-audit --db s.redb --outcome applied --since \
             1970-01-01T00:00:01.000Z --source A/1 --format jsonl | wc -l"
        );
        assert!(
            commands
                .iter()
                .all(|(_, c)| c.matches("--source").count() <= 1)
        );
        // A ranged report: no `stats`, and `gaps` said to cover the whole retained log.
        assert!(!commands.iter().any(|(_, c)| c.contains(" stats ")));
        let gaps: Vec<_> = commands
            .iter()
            .filter(|(_, c)| c.contains(" gaps "))
            .collect();
        assert_eq!(gaps.len(), 2);
        assert!(gaps.iter().all(|(w, _)| w.contains("whole retained log")));
    }

    #[test]
    fn a_resolutions_operator_is_read_from_its_reason() {
        assert_eq!(
            operator_words(
                "quarantine #7 released by alice: genuine: checked",
                Outcome::Released,
                Some(7)
            ),
            (Some("alice".into()), "genuine: checked".into())
        );
        assert_eq!(
            operator_words("something else", Outcome::Discarded, Some(7)),
            (None, "something else".into())
        );
    }
}
