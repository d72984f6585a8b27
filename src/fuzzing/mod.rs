//! The checks behind the cargo-fuzz targets in `fuzz/`, shared with the integration suite,
//! which replays the committed inputs in `fuzz/regressions/` through them. Each takes
//! arbitrary bytes and panics only when an invariant breaks, never because the input is bad.
//! Not part of the product's interface.

pub mod model;

use crate::json::{self, Json, Pointer};
use crate::key::{message_digest, sha256};
use crate::wire::{self, FeedContract};

/// A fuzz check: panics if and only if the input breaks an invariant.
pub type Check = fn(&[u8]);

/// Every target by name, as `fuzz/fuzz_targets/NAME.rs` and `fuzz/regressions/NAME/` call it.
pub const TARGETS: &[(&str, Check)] = &[
    ("decode", payload),
    ("config", config),
    ("broker_codec", broker_codec),
    ("records", records),
    ("engine", engine),
];

/// `wire::decode` and the canonical digest. Never panics; a decode error is one line; the
/// compact form re-parses to the same document; the document's digest is unchanged by member
/// reordering, re-spacing, re-escaping and re-spelling numbers; the canonical form is a fixed
/// point with the same digest; removing `digest_ignore` pointers does not depend on their
/// order and removes exactly the values they name in the received document.
pub fn payload(bytes: &[u8]) {
    let contract = FeedContract {
        // Variants are larger than the input; the size limit is not what is under test.
        max_payload_bytes: usize::MAX,
        ..FeedContract::default()
    };
    let decoded = wire::decode(bytes, &contract);
    if let Err(e) = &decoded {
        assert!(!e.to_string().contains('\n'), "multi-line reason: {e}");
    }
    let Ok(doc) = json::parse(bytes, contract.max_depth) else {
        assert!(decoded.is_err(), "decoded a payload that is not JSON");
        return;
    };
    let compact = doc.to_compact();
    assert_eq!(
        json::parse(compact.as_bytes(), contract.max_depth).as_ref(),
        Ok(&doc),
        "compact form does not re-parse to the same document"
    );
    let digest = message_digest(&doc, &[]);
    let seed = bytes
        .iter()
        .fold(0u32, |h, &b| h.wrapping_mul(31) ^ u32::from(b));
    for (i, style) in [
        Style {
            order: Order::Reverse,
            space: " ",
            escape: Escape::All,
            respell: false,
        },
        Style {
            order: Order::Rotate(seed as usize),
            space: "\n\t \r",
            escape: Escape::Alternate,
            respell: false,
        },
        Style {
            order: Order::Keep,
            space: "",
            escape: Escape::None,
            respell: true,
        },
    ]
    .iter()
    .enumerate()
    {
        let mut text = String::new();
        style.write(&doc, &mut text);
        let variant = json::parse(text.as_bytes(), contract.max_depth)
            .unwrap_or_else(|e| panic!("variant {i} {text:?} does not parse: {e}"));
        // An out-of-range number fails the same way in every spelling (its text differs).
        assert_eq!(
            message_digest(&variant, &[]).ok(),
            digest.as_ref().ok().copied(),
            "variant {i} {text:?} has another digest"
        );
        if !style.respell {
            // Re-spelt numbers may turn `sequence: 7` into `7.0`, which the contract refuses.
            let again = wire::decode(text.as_bytes(), &contract);
            match (&decoded, &again) {
                (Ok(a), Ok(b)) => assert_eq!(a, b, "variant {i} {text:?} decodes otherwise"),
                (Err(_), Err(_)) => {}
                _ => panic!("variant {i} {text:?}: {decoded:?} vs {again:?}"),
            }
        }
    }
    let Ok(canonical) = doc.to_canonical() else {
        assert!(digest.is_err(), "no canonical form but a digest");
        return;
    };
    let Ok(digest) = digest else {
        panic!("a canonical form but no digest");
    };
    assert_eq!(
        digest.as_bytes(),
        &sha256(&[canonical.as_bytes()]),
        "digest is not SHA-256 of the canonical form"
    );
    let reparsed = json::parse(canonical.as_bytes(), contract.max_depth)
        .unwrap_or_else(|e| panic!("canonical form {canonical:?} does not parse: {e}"));
    assert_eq!(
        reparsed.to_canonical().as_deref(),
        Ok(canonical.as_str()),
        "canonical form is not a fixed point"
    );
    assert_eq!(message_digest(&reparsed, &[]), Ok(digest));

    // digest_ignore: a few of the document's own paths, chosen by the seed.
    let mut paths = Vec::new();
    collect_paths(&doc, &mut Vec::new(), &mut paths);
    let picked: Vec<&Vec<String>> = paths
        .iter()
        .enumerate()
        .filter(|(i, _)| (seed >> (i % 29)) & 1 == 1 && *i < 64)
        .map(|(_, p)| p)
        .take(4)
        .collect();
    if picked.is_empty() {
        return;
    }
    let pointers: Vec<Pointer> = picked.iter().map(|p| pointer_of(p)).collect();
    let mut reversed = pointers.clone();
    reversed.reverse();
    let want = strip(&doc, &mut Vec::new(), &picked)
        .map(|kept| message_digest(&kept, &[]))
        .unwrap_or_else(|| message_digest(&Json::Null, &[]));
    let got = message_digest(&doc, &pointers);
    assert_eq!(
        got, want,
        "digest_ignore {pointers:?} removes other values than it names"
    );
    assert_eq!(
        message_digest(&doc, &reversed),
        got,
        "digest_ignore order matters"
    );
}

/// How a variant writes a document.
struct Style {
    order: Order,
    /// Whitespace written around every token.
    space: &'static str,
    escape: Escape,
    /// Numbers get a trailing fractional zero (`7` → `7.0`, `1.5e3` → `1.50e3`).
    respell: bool,
}

enum Order {
    Keep,
    Reverse,
    Rotate(usize),
}

enum Escape {
    None,
    /// Every character as `\uXXXX` (surrogate pairs above U+FFFF), `/` as `\/`.
    All,
    /// Every other character escaped.
    Alternate,
}

impl Style {
    fn write(&self, v: &Json, out: &mut String) {
        out.push_str(self.space);
        match v {
            Json::Null | Json::Bool(_) => out.push_str(&v.to_compact()),
            Json::Number(n) if self.respell => out.push_str(&respell(n)),
            Json::Number(n) => out.push_str(n),
            Json::String(s) => self.string(s, out),
            Json::Array(items) => {
                out.push('[');
                for (i, item) in items.iter().enumerate() {
                    if i > 0 {
                        out.push(',');
                    }
                    self.write(item, out);
                }
                out.push_str(self.space);
                out.push(']');
            }
            Json::Object(members) => {
                let mut order: Vec<&(String, Json)> = members.iter().collect();
                match self.order {
                    Order::Keep => {}
                    Order::Reverse => order.reverse(),
                    Order::Rotate(n) if !order.is_empty() => {
                        let n = n % order.len();
                        order.rotate_left(n);
                    }
                    Order::Rotate(_) => {}
                }
                out.push('{');
                for (i, (k, v)) in order.into_iter().enumerate() {
                    if i > 0 {
                        out.push(',');
                    }
                    out.push_str(self.space);
                    self.string(k, out);
                    out.push_str(self.space);
                    out.push(':');
                    self.write(v, out);
                }
                out.push_str(self.space);
                out.push('}');
            }
        }
        out.push_str(self.space);
    }

    fn string(&self, s: &str, out: &mut String) {
        use std::fmt::Write as _;
        out.push('"');
        for (i, c) in s.chars().enumerate() {
            let escape = match self.escape {
                Escape::None => false,
                Escape::All => true,
                Escape::Alternate => i % 2 == 0,
            };
            if escape {
                if c == '/' && i % 3 == 0 {
                    out.push_str("\\/");
                    continue;
                }
                let mut units = [0u16; 2];
                for u in c.encode_utf16(&mut units) {
                    let _ = write!(out, "\\u{u:04X}");
                }
            } else {
                let mut buf = [0u8; 4];
                match c {
                    '"' => out.push_str("\\\""),
                    '\\' => out.push_str("\\\\"),
                    c if (c as u32) < 0x20 => {
                        let _ = write!(out, "\\u{:04x}", c as u32);
                    }
                    c => out.push_str(c.encode_utf8(&mut buf)),
                }
            }
        }
        out.push('"');
    }
}

/// The same number with one more trailing zero in its fraction.
fn respell(n: &str) -> String {
    let (mantissa, exponent) = match n.find(['e', 'E']) {
        Some(i) => n.split_at(i),
        None => (n, ""),
    };
    if mantissa.contains('.') {
        format!("{mantissa}0{exponent}")
    } else {
        format!("{mantissa}.0{exponent}")
    }
}

/// Every path (as unescaped tokens) of a value inside `v`, in document order.
fn collect_paths(v: &Json, at: &mut Vec<String>, out: &mut Vec<Vec<String>>) {
    let children: Vec<(String, &Json)> = match v {
        Json::Array(items) => items
            .iter()
            .enumerate()
            .map(|(i, x)| (i.to_string(), x))
            .collect(),
        Json::Object(members) => members.iter().map(|(k, x)| (k.clone(), x)).collect(),
        _ => return,
    };
    for (token, child) in children {
        at.push(token);
        out.push(at.clone());
        collect_paths(child, at, out);
        at.pop();
    }
}

fn pointer_of(tokens: &[String]) -> Pointer {
    let text: String = tokens
        .iter()
        .map(|t| format!("/{}", t.replace('~', "~0").replace('/', "~1")))
        .collect();
    Pointer::parse(&text).unwrap_or_else(|e| panic!("built pointer {text:?}: {e}"))
}

/// `v` without the values at `drop` (paths in the original document): the reference for
/// `digest_ignore`, order-independent by construction. `None` if `v` itself is dropped.
fn strip(v: &Json, at: &mut Vec<String>, drop: &[&Vec<String>]) -> Option<Json> {
    if drop.iter().any(|d| **d == *at) {
        return None;
    }
    let mut child = |token: String, x: &Json| {
        at.push(token);
        let kept = strip(x, at, drop);
        at.pop();
        kept
    };
    Some(match v {
        Json::Array(items) => Json::Array(
            items
                .iter()
                .enumerate()
                .filter_map(|(i, x)| child(i.to_string(), x))
                .collect(),
        ),
        Json::Object(members) => Json::Object(
            members
                .iter()
                .filter_map(|(k, x)| child(k.clone(), x).map(|x| (k.clone(), x)))
                .collect(),
        ),
        other => other.clone(),
    })
}

/// `Config::parse` on arbitrary text: never panics; an error is one line.
pub fn config(bytes: &[u8]) {
    let Ok(text) = std::str::from_utf8(bytes) else {
        return;
    };
    if let Err(e) = crate::config::Config::parse(text) {
        let shown = e.to_string();
        assert!(!shown.contains('\n'), "multi-line config error: {shown}");
    }
}

/// The demo broker's MQTT packet codec: see `demo::check_broker_codec`.
pub fn broker_codec(bytes: &[u8]) {
    crate::demo::check_broker_codec(bytes);
}

/// Every table's record decoder: see `store::tables::check_decoders`.
pub fn records(bytes: &[u8]) {
    crate::store::tables::check_decoders(bytes);
}

/// The decision engine against the reference model (`model::run_case`) on a feed the bytes
/// describe, through in-memory stores.
pub fn engine(bytes: &[u8]) {
    let case = case_of(bytes);
    if let Err(e) = model::run_case(&case, &mut |opts| {
        crate::store::Store::open_in_memory(opts).map(crate::store::Backend::Redb)
    }) {
        panic!("{e}\ncase: {case:?}");
    }
}

/// Reads a `model::Case` from bytes: a header of settings, then one op per 2 bytes (a
/// malformed payload takes its length's worth more), at most 160 ops. Every byte string is
/// some case; missing bytes read as zero.
pub fn case_of(bytes: &[u8]) -> model::Case {
    use model::Op;
    let at = std::cell::Cell::new(0);
    let byte = || {
        let b = bytes.get(at.get()).copied().unwrap_or(0);
        at.set(at.get() + 1);
        b
    };
    let max_entries = 1 + u64::from(byte() % 23);
    let window_secs = 1 + u64::from(byte() % 9);
    let quarantine_late = byte() % 10 < 3;
    let batch_sizes = (0..1 + byte() % 5)
        .map(|_| 1 + usize::from(byte() % 23))
        .collect();
    let steps_ms = (0..1 + byte() % 5)
        .map(|_| u64::from(byte()) * 12)
        .collect();
    let swaps = (0..byte() % 20).map(|_| usize::from(byte())).collect();
    let mut ops = Vec::new();
    while ops.len() < 160 && at.get() < bytes.len() {
        let tag = byte();
        let arg = usize::from(byte());
        ops.push(match tag % 11 {
            0..=5 => Op::Fresh {
                src: (arg % 4) as u8,
                bump: arg >= 240,
            },
            6 | 7 => Op::Exact(arg),
            8 => Op::Reserialise(arg),
            9 => Op::Conflict(arg),
            _ => Op::Malformed((0..arg % 40).map(|_| byte()).collect()),
        });
    }
    model::Case {
        ops,
        swaps,
        batch_sizes,
        steps_ms,
        max_entries,
        window_secs,
        quarantine_late,
    }
}
