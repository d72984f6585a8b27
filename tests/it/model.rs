//! Reference-model property test: random multi-source feeds with exact replays, re-serialised
//! resends, conflicts, reorders, epoch bumps, malformed bytes and a small window that forces
//! eviction, run through the real store and compared with a simple in-memory model.

use std::collections::{HashMap, HashSet, VecDeque};

use proptest::prelude::*;
use replay_guard::decide::OutOfOrder;
use replay_guard::model::Outcome;
use replay_guard::store::{
    Incoming, LogRetention, RetentionPolicy, Store, StoreError, StoreOptions, WindowPolicy,
};
use replay_guard::wire::FeedContract;

/// What the feed generator does next.
#[derive(Debug, Clone)]
enum Op {
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
            let m = self.marks.get_mut(&k.0).unwrap();
            if m.1.is_none_or(|f| f < (k.1, k.2)) {
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

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        6 => (0u8..4, prop::bool::weighted(0.05)).prop_map(|(src, bump)| Op::Fresh { src, bump }),
        2 => any::<usize>().prop_map(Op::Exact),
        1 => any::<usize>().prop_map(Op::Reserialise),
        1 => any::<usize>().prop_map(Op::Conflict),
        1 => prop::collection::vec(any::<u8>(), 0..40).prop_map(Op::Malformed),
    ]
}

fn run_case(
    ops: Vec<Op>,
    swaps: Vec<usize>,
    batch_sizes: Vec<usize>,
    steps_ms: Vec<u64>,
    max_entries: u64,
    window_secs: u64,
    quarantine_late: bool,
) -> Result<(), TestCaseError> {
    let deliveries = build(&ops, &swaps);
    let policy = if quarantine_late {
        OutOfOrder::Quarantine
    } else {
        OutOfOrder::Apply
    };
    let dir = tempfile::tempdir().unwrap();
    let opts = StoreOptions {
        cache_bytes: 4 << 20,
        window: WindowPolicy {
            seconds: window_secs,
            max_entries,
        },
        out_of_order: policy,
        ..StoreOptions::default()
    };
    // The same feed into a store that prunes hard: retention must change no decision and
    // must leave a record `verify` still proves.
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
    let mut store = Store::open(&dir.path().join("m.redb"), opts).unwrap();
    let mut pruning = Store::open(&dir.path().join("pruned.redb"), pruning_opts).unwrap();
    let mut model = ModelState {
        window: HashMap::new(),
        order: VecDeque::new(),
        marks: HashMap::new(),
        window_secs,
        max_entries: max_entries as usize,
        policy,
    };
    let contract = FeedContract::default();
    let mut now_ms = 1_000_000u64;
    let mut decided = Vec::new();
    let mut i = 0;
    let mut b = 0;
    while i < deliveries.len() {
        let size = batch_sizes[b % batch_sizes.len()].min(deliveries.len() - i);
        now_ms += steps_ms[b % steps_ms.len()];
        b += 1;
        let batch: Vec<Incoming> = deliveries[i..i + size]
            .iter()
            .map(|d| Incoming::decode("t", d.bytes.clone(), now_ms, &contract))
            .collect();
        let report = store.commit_batch(&batch, now_ms).unwrap();
        let pruned = pruning.commit_batch(&batch, now_ms).unwrap();
        let outcomes = |r: &replay_guard::store::BatchReport| {
            r.decided.iter().map(|d| d.outcome).collect::<Vec<_>>()
        };
        prop_assert_eq!(
            outcomes(&pruned),
            outcomes(&report),
            "retention changed a decision"
        );
        model.evict(now_ms);
        for (d, got) in deliveries[i..i + size].iter().zip(&report.decided) {
            let want = model.decide(d, now_ms);
            prop_assert_eq!(got.outcome, want, "delivery {:?}", d);
            decided.push(got.clone());
        }
        model.evict(now_ms);
        i += size;
    }

    let pruned_view = pruning.reader().unwrap();
    let check = replay_guard::store::verify::verify(&pruned_view, &contract).unwrap();
    prop_assert_eq!(check.violation, None, "verify on the pruned store");

    // Independent of the model: the properties the product promises.
    let txn = store.reader().unwrap();
    let mut effects = HashMap::new();
    txn.scan_effects::<StoreError>(0, |e| {
        effects.insert(e.offset, e);
        Ok(std::ops::ControlFlow::Continue(()))
    })
    .unwrap();
    let keys: HashSet<_> = effects.values().map(|e| e.record.key).collect();
    prop_assert_eq!(keys.len(), effects.len(), "an event was applied twice");

    let mut audit = Vec::new();
    txn.scan_audit::<StoreError>(0, |e| {
        audit.push(e);
        Ok(std::ops::ControlFlow::Continue(()))
    })
    .unwrap();
    prop_assert_eq!(
        audit.len(),
        deliveries.len(),
        "audit must account for every message"
    );
    let mut prev = [0u8; 32];
    let mut quarantine = HashMap::new();
    txn.scan_quarantine::<StoreError>(0, |q| {
        quarantine.insert(q.id, q);
        Ok(std::ops::ControlFlow::Continue(()))
    })
    .unwrap();
    for ((entry, d), dec) in audit.iter().zip(&deliveries).zip(&decided) {
        prop_assert_eq!(entry.record.prev_hash, prev);
        prop_assert!(entry.hash_is_valid());
        prev = entry.record.hash;
        prop_assert_eq!(entry.outcome(), Some(dec.outcome));
        match dec.outcome {
            Outcome::Applied | Outcome::AppliedLate => {
                let e = &effects[&dec.effect_offset.unwrap()];
                prop_assert_eq!(&e.record.payload, &d.bytes);
            }
            Outcome::Duplicate => {
                // Suppressed only if an applied effect has the same key and the same content.
                let e = &effects[&dec.effect_offset.unwrap()];
                let applied = build_event_of(&e.record.payload);
                prop_assert_eq!(
                    applied,
                    d.event,
                    "suppressed a message that was not a duplicate"
                );
            }
            Outcome::Conflict | Outcome::Stale | Outcome::Malformed => {
                let q = &quarantine[&dec.quarantine_id.unwrap()];
                prop_assert_eq!(q.outcome(), Some(dec.outcome));
                if dec.outcome == Outcome::Malformed {
                    prop_assert_eq!(&q.record.payload, &d.bytes);
                } else {
                    prop_assert_eq!(
                        build_event_of(&q.record.payload),
                        d.event,
                        "quarantined other content"
                    );
                }
            }
            Outcome::Released | Outcome::Discarded => {
                prop_assert!(false, "the feed alone never releases or discards");
            }
        }
    }
    // Never lost: every genuine (position, content) delivered is applied or quarantined.
    let held: HashSet<Event> = effects
        .values()
        .map(|e| &e.record.payload)
        .chain(quarantine.values().map(|q| &q.record.payload))
        .filter_map(|p| build_event_of(p))
        .collect();
    for d in &deliveries {
        if let Some(e) = d.event {
            prop_assert!(
                held.contains(&e),
                "event {:?} neither applied nor quarantined",
                e
            );
        }
    }
    Ok(())
}

/// Recovers the generator's event from payload bytes (either rendering style).
fn build_event_of(payload: &[u8]) -> Option<Event> {
    use replay_guard::json::{Json, parse};
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

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]

    #[test]
    fn engine_matches_the_reference_model_and_never_applies_twice_or_loses_an_event(
        ops in prop::collection::vec(op(), 1..160),
        swaps in prop::collection::vec(any::<usize>(), 0..20),
        batch_sizes in prop::collection::vec(1usize..24, 1..6),
        steps_ms in prop::collection::vec(0u64..3_000, 1..6),
        max_entries in 1u64..24,
        window_secs in 1u64..10,
        quarantine_late in prop::bool::weighted(0.3),
    ) {
        run_case(ops, swaps, batch_sizes, steps_ms, max_entries, window_secs, quarantine_late)?;
    }
}
