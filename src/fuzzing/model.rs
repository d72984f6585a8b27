//! The engine's reference model: random multi-source feeds with exact replays, re-serialised
//! resends, conflicts, reorders, epoch bumps, malformed bytes and a small window that forces
//! eviction, run through the real store and compared with a simple in-memory model of the
//! decision table and window. Driven by the proptest in tests/it/model.rs and by the `engine`
//! fuzz target (`super::engine`).

use std::collections::{HashMap, HashSet, VecDeque};

use crate::decide::OutOfOrder;
use crate::json::{Json, parse};
use crate::model::Outcome;
use crate::store::{
    AuditEntry, Backend, BatchReport, Incoming, LogRetention, RetentionPolicy, Snapshot,
    StoreError, StoreOptions, WindowPolicy,
};
use crate::wire::FeedContract;

/// What the feed generator does next.
#[derive(Debug, Clone)]
pub enum Op {
    /// A genuine new event from source `src`; `bump` starts a new boot epoch first.
    Fresh { src: u8, bump: bool },
    /// The same bytes as earlier delivery `i` (broker replay, publisher resend).
    Exact(usize),
    /// Earlier delivery `i` re-serialised: other member order, spacing, `7.0` for `7`.
    Reserialise(usize),
    /// Earlier delivery `i`'s position with different content.
    Conflict(usize),
    /// Bytes that are not a feed message.
    Malformed(Vec<u8>),
}

/// One generated feed and the store's settings for it.
#[derive(Debug, Clone)]
pub struct Case {
    pub ops: Vec<Op>,
    /// Adjacent swaps applied to the deliveries (reorders).
    pub swaps: Vec<usize>,
    /// Batch sizes, cycled; each at least 1.
    pub batch_sizes: Vec<usize>,
    /// Clock steps between batches in milliseconds, cycled.
    pub steps_ms: Vec<u64>,
    pub max_entries: u64,
    pub window_secs: u64,
    pub quarantine_late: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
struct Event {
    src: u8,
    epoch: u64,
    seq: u64,
    variant: u32,
}

#[derive(Debug, Clone)]
struct Delivery {
    event: Option<Event>,
    bytes: Vec<u8>,
}

fn render(e: Event, style: u8) -> Vec<u8> {
    let Event {
        src,
        epoch,
        seq,
        variant,
    } = e;
    match style % 2 {
        0 => format!(
            r#"{{"agency":"A{src}","source_id":"S{src}","epoch":{epoch},"sequence":{seq},"v":{variant},"note":"n"}}"#
        ),
        _ => format!(
            r#"{{ "note" : "n", "v" : {variant}.0, "sequence" : {seq}, "epoch" : {epoch}, "source_id" : "S{src}", "agency" : "A{src}" }}"#
        ),
    }
    .into_bytes()
}

/// Turns ops into deliveries, then applies adjacent swaps (reorders).
fn build(ops: &[Op], swaps: &[usize]) -> Vec<Delivery> {
    let mut out: Vec<Delivery> = Vec::new();
    let mut pos: HashMap<u8, (u64, u64)> = HashMap::new();
    let mut next_variant = 1000u32;
    for op in ops {
        let d = match op {
            Op::Fresh { src, bump } => {
                let p = pos.entry(*src).or_insert((0, 0));
                if *bump {
                    *p = (p.0 + 1, 0);
                }
                p.1 += 1;
                next_variant += 1;
                let e = Event {
                    src: *src,
                    epoch: p.0,
                    seq: p.1,
                    variant: next_variant,
                };
                Delivery {
                    event: Some(e),
                    bytes: render(e, 0),
                }
            }
            Op::Exact(i) | Op::Reserialise(i) | Op::Conflict(i) if !out.is_empty() => {
                let base = out[i % out.len()].clone();
                match (op, base.event) {
                    (Op::Exact(_), _) => base,
                    (Op::Reserialise(_), Some(e)) => Delivery {
                        event: Some(e),
                        bytes: render(e, 1),
                    },
                    (Op::Conflict(_), Some(e)) => {
                        next_variant += 1;
                        let c = Event {
                            variant: next_variant,
                            ..e
                        };
                        Delivery {
                            event: Some(c),
                            bytes: render(c, 0),
                        }
                    }
                    _ => base,
                }
            }
            Op::Malformed(bytes) => Delivery {
                event: None,
                bytes: bytes.clone(),
            },
            _ => continue,
        };
        out.push(d);
    }
    for s in swaps {
        if out.len() > 1 {
            let i = s % (out.len() - 1);
            out.swap(i, i + 1);
        }
    }
    out
}

/// A source's (high-water mark, evicted floor) as (epoch, sequence) pairs.
type Marks = ((u64, u64), Option<(u64, u64)>);

/// The in-memory model of the decision table and window.
struct ModelState {
    window: HashMap<(u8, u64, u64), u32>,
    order: VecDeque<(u64, (u8, u64, u64))>,
    marks: HashMap<u8, Marks>,
    window_secs: u64,
    max_entries: usize,
    policy: OutOfOrder,
}

impl ModelState {
    fn evict(&mut self, now_ms: u64) {
        let cutoff = now_ms.checked_sub(self.window_secs * 1000);
        while let Some(&(t, k)) = self.order.front() {
            let expired = cutoff.is_some_and(|c| t <= c);
            if !expired && self.order.len() <= self.max_entries {
                break;
            }
            self.order.pop_front();
            self.window.remove(&k);
            // Every windowed key's source has marks: `decide` sets them when it applies.
            if let Some(m) = self.marks.get_mut(&k.0)
                && m.1.is_none_or(|f| f < (k.1, k.2))
            {
                m.1 = Some((k.1, k.2));
            }
        }
    }

    fn decide(&mut self, d: &Delivery, now_ms: u64) -> Outcome {
        let Some(e) = d.event else {
            return Outcome::Malformed;
        };
        let k = (e.src, e.epoch, e.seq);
        if let Some(v) = self.window.get(&k) {
            return if *v == e.variant {
                Outcome::Duplicate
            } else {
                Outcome::Conflict
            };
        }
        let p = (e.epoch, e.seq);
        let outcome = match self.marks.get(&e.src) {
            None => Outcome::Applied,
            Some((hwm, _)) if p > *hwm => Outcome::Applied,
            Some((_, Some(floor))) if p <= *floor => Outcome::Stale,
            Some(_) if self.policy == OutOfOrder::Apply => Outcome::AppliedLate,
            Some(_) => Outcome::Stale,
        };
        if outcome.applies() {
            self.window.insert(k, e.variant);
            self.order.push_back((now_ms, k));
            let m = self.marks.entry(e.src).or_insert((p, None));
            if outcome == Outcome::Applied {
                m.0 = p;
            }
        }
        outcome
    }
}

macro_rules! ensure {
    ($cond:expr, $($msg:tt)+) => {
        if !$cond {
            return Err(format!($($msg)+));
        }
    };
}

fn store_err(e: StoreError) -> String {
    format!("store: {e}")
}

/// Runs `case` through two stores made by `open` (the second prunes hard: retention must
/// change no decision and leave a record `verify` proves) and through the model; `Err` names
/// the first disagreement or broken promise.
pub fn run_case(
    case: &Case,
    open: &mut dyn FnMut(StoreOptions) -> Result<Backend, StoreError>,
) -> Result<(), String> {
    let deliveries = build(&case.ops, &case.swaps);
    let policy = if case.quarantine_late {
        OutOfOrder::Quarantine
    } else {
        OutOfOrder::Apply
    };
    let opts = StoreOptions {
        cache_bytes: 4 << 20,
        window: WindowPolicy {
            seconds: case.window_secs,
            max_entries: case.max_entries,
        },
        out_of_order: policy,
        // The window's newest entries move to its main table every few applications, so
        // every case decides across both of redb's window tables; and one source per commit
        // writes its new entries straight into the main table, the rest through the small one.
        window_merge_at: 3,
        window_direct_sources: 1,
        ..StoreOptions::default()
    };
    let keep = |age: u64, entries: u64| LogRetention {
        max_age_seconds: Some(age),
        max_entries: Some(entries),
    };
    let pruning_opts = StoreOptions {
        retention: RetentionPolicy {
            audit: keep(20, 16),
            effects: keep(5, 8),
            quarantine: keep(10, 2),
        },
        ..opts.clone()
    };
    let mut store = open(opts).map_err(store_err)?;
    let mut pruning = open(pruning_opts).map_err(store_err)?;
    let mut model = ModelState {
        window: HashMap::new(),
        order: VecDeque::new(),
        marks: HashMap::new(),
        window_secs: case.window_secs,
        max_entries: usize::try_from(case.max_entries).unwrap_or(usize::MAX),
        policy,
    };
    let contract = FeedContract::default();
    let mut now_ms = 1_000_000u64;
    let mut decided = Vec::new();
    let mut i = 0;
    let mut b = 0;
    ensure!(
        !case.batch_sizes.is_empty() && !case.steps_ms.is_empty(),
        "a case needs batch sizes and clock steps"
    );
    while i < deliveries.len() {
        let size = case.batch_sizes[b % case.batch_sizes.len()].clamp(1, deliveries.len() - i);
        now_ms += case.steps_ms[b % case.steps_ms.len()];
        b += 1;
        let batch: Vec<Incoming> = deliveries[i..i + size]
            .iter()
            .map(|d| Incoming::decode("t", d.bytes.clone(), now_ms, &contract))
            .collect();
        let report = store.commit_batch(&batch, now_ms).map_err(store_err)?;
        let pruned = pruning.commit_batch(&batch, now_ms).map_err(store_err)?;
        let outcomes = |r: &BatchReport| r.decided.iter().map(|d| d.outcome).collect::<Vec<_>>();
        ensure!(
            outcomes(&pruned) == outcomes(&report),
            "retention changed a decision: {:?} vs {:?}",
            outcomes(&pruned),
            outcomes(&report)
        );
        model.evict(now_ms);
        for (d, got) in deliveries[i..i + size].iter().zip(&report.decided) {
            let want = model.decide(d, now_ms);
            ensure!(
                got.outcome == want,
                "delivery {d:?}: engine decided {:?}, model {want:?}",
                got.outcome
            );
            decided.push(got.clone());
        }
        model.evict(now_ms);
        i += size;
    }

    let pruned_view = pruning.reader().map_err(store_err)?;
    let check = crate::store::verify::verify(&pruned_view, &contract).map_err(store_err)?;
    ensure!(
        check.violation.is_none(),
        "verify on the pruned store: {:?}",
        check.violation
    );
    read_alone_as_in_order(&pruning, &audit_log(&pruned_view)?)
        .map_err(|e| format!("pruned store: {e}"))?;

    // Independent of the model: the properties the product promises.
    let txn = store.reader().map_err(store_err)?;
    let mut effects = HashMap::new();
    txn.scan_effects::<StoreError>(0, |e| {
        effects.insert(e.offset, e);
        Ok(std::ops::ControlFlow::Continue(()))
    })
    .map_err(store_err)?;
    let keys: HashSet<_> = effects.values().map(|e| e.record.key).collect();
    ensure!(keys.len() == effects.len(), "an event was applied twice");

    let audit = audit_log(&txn)?;
    ensure!(
        audit.len() == deliveries.len(),
        "audit must account for every message: {} entries for {} deliveries",
        audit.len(),
        deliveries.len()
    );
    read_alone_as_in_order(&store, &audit)?;
    let mut prev = [0u8; 32];
    let mut quarantine = HashMap::new();
    txn.scan_quarantine::<StoreError>(0, |q| {
        quarantine.insert(q.id, q);
        Ok(std::ops::ControlFlow::Continue(()))
    })
    .map_err(store_err)?;
    for ((entry, d), dec) in audit.iter().zip(&deliveries).zip(&decided) {
        ensure!(
            entry.record.prev_hash == prev,
            "audit {} breaks the chain",
            entry.index
        );
        ensure!(
            entry.hash_is_valid(),
            "audit {} has a wrong hash",
            entry.index
        );
        prev = entry.record.hash;
        ensure!(
            entry.outcome() == Some(dec.outcome),
            "audit {} records {:?}, the batch reported {:?}",
            entry.index,
            entry.outcome(),
            dec.outcome
        );
        let effect = || {
            dec.effect_offset
                .and_then(|o| effects.get(&o))
                .ok_or_else(|| format!("{:?} without its effect: {d:?}", dec.outcome))
        };
        match dec.outcome {
            Outcome::Applied | Outcome::AppliedLate => {
                ensure!(
                    effect()?.record.payload == d.bytes,
                    "effect of {d:?} holds other bytes"
                );
            }
            Outcome::Duplicate => {
                // Suppressed only if an applied effect has the same key and the same content.
                let applied = event_of(&effect()?.record.payload);
                ensure!(
                    applied == d.event,
                    "suppressed a message that was not a duplicate: {d:?} vs {applied:?}"
                );
            }
            Outcome::Conflict | Outcome::Stale | Outcome::Malformed => {
                let q = dec
                    .quarantine_id
                    .and_then(|id| quarantine.get(&id))
                    .ok_or_else(|| format!("{:?} not quarantined: {d:?}", dec.outcome))?;
                ensure!(
                    q.outcome() == Some(dec.outcome),
                    "quarantine record's outcome"
                );
                if dec.outcome == Outcome::Malformed {
                    ensure!(q.record.payload == d.bytes, "quarantined other bytes");
                } else {
                    ensure!(
                        event_of(&q.record.payload) == d.event,
                        "quarantined other content: {d:?}"
                    );
                }
            }
            Outcome::Released | Outcome::Discarded | Outcome::Relay => {
                return Err(
                    "the feed alone never releases, discards or records relay actions".into(),
                );
            }
        }
    }
    // Never lost: every genuine (position, content) delivered is applied or quarantined.
    let held: HashSet<Event> = effects
        .values()
        .map(|e| &e.record.payload)
        .chain(quarantine.values().map(|q| &q.record.payload))
        .filter_map(|p| event_of(p))
        .collect();
    for d in &deliveries {
        if let Some(e) = d.event {
            ensure!(
                held.contains(&e),
                "event {e:?} neither applied nor quarantined"
            );
        }
    }
    Ok(())
}

/// The audit log of `snapshot`, read in order.
fn audit_log(snapshot: &Snapshot) -> Result<Vec<AuditEntry>, String> {
    let mut audit = Vec::new();
    snapshot
        .scan_audit::<StoreError>(0, |e| {
            audit.push(e);
            Ok(std::ops::ControlFlow::Continue(()))
        })
        .map_err(store_err)?;
    Ok(audit)
}

/// Each audit entry of `in_order` (the whole log, read in order) read again as `explain`, the
/// relay and `verify`'s effect checks take one: alone from a snapshot that has read nothing
/// (on redb an entry that leaves its `prev_hash` to the entry before recomputes it, walking
/// back to an entry that holds its hashes, and not past the oldest one retention kept), then
/// oldest first and newest first from one snapshot each (a snapshot remembers the hashes it
/// computed, and takes an entry's `prev_hash` from them), and by its key through the key
/// index. Each must be the record read in order.
fn read_alone_as_in_order(store: &Backend, in_order: &[AuditEntry]) -> Result<(), String> {
    let differs = |how: &str, e: &AuditEntry, got: Option<&AuditEntry>| {
        format!(
            "audit {} read {how} is {:?}, in order {:?}",
            e.index,
            got.map(|g| &g.record),
            e.record
        )
    };
    for e in in_order {
        let alone = store
            .reader()
            .and_then(|s| s.audit_entry(e.index))
            .map_err(store_err)?;
        ensure!(
            alone.as_ref().is_some_and(|a| a.record == e.record),
            "{}",
            differs("alone", e, alone.as_ref())
        );
    }
    let oldest_first = store.reader().map_err(store_err)?;
    let newest_first = store.reader().map_err(store_err)?;
    for (how, snapshot, entries) in [
        (
            "oldest first",
            &oldest_first,
            in_order.iter().collect::<Vec<_>>(),
        ),
        (
            "newest first",
            &newest_first,
            in_order.iter().rev().collect(),
        ),
    ] {
        for e in entries {
            let got = snapshot.audit_entry(e.index).map_err(store_err)?;
            ensure!(
                got.as_ref().is_some_and(|g| g.record == e.record),
                "{}",
                differs(how, e, got.as_ref())
            );
        }
    }
    let snapshot = newest_first;
    let mut by_key: HashMap<[u8; 32], Vec<&AuditEntry>> = HashMap::new();
    for e in in_order {
        if let Some(key) = e.record.key {
            by_key.entry(key).or_default().push(e);
        }
    }
    for (key, want) in by_key {
        let got = snapshot.audit_with_key(&key).map_err(store_err)?;
        ensure!(
            got.len() == want.len()
                && got
                    .iter()
                    .zip(&want)
                    .all(|(g, w)| g.index == w.index && g.record == w.record),
            "the key index finds entries {:?} for key {}, the log in order {:?}",
            got.iter().map(|g| g.index).collect::<Vec<_>>(),
            crate::model::hex(&key),
            want.iter().map(|w| w.index).collect::<Vec<_>>()
        );
    }
    Ok(())
}

/// Recovers the generator's event from payload bytes (either rendering style).
fn event_of(payload: &[u8]) -> Option<Event> {
    let Json::Object(members) = parse(payload, 8).ok()? else {
        return None;
    };
    let get = |name: &str| {
        members
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.clone())
    };
    let num = |v: Option<Json>| match v {
        Some(Json::Number(n)) => n.trim_end_matches(".0").parse::<u64>().ok(),
        _ => None,
    };
    let src = match get("agency") {
        Some(Json::String(s)) => s.strip_prefix('A')?.parse().ok()?,
        _ => return None,
    };
    Some(Event {
        src,
        epoch: num(get("epoch"))?,
        seq: num(get("sequence"))?,
        variant: u32::try_from(num(get("v"))?).ok()?,
    })
}
