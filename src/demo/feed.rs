//! The demo's scripted field feed and the Common Operating Picture it builds. Sans-IO.
//!
//! The story: a structure fire whose casualty tally reaches 3 (three `+1` reports), Engine 7
//! assigned and later available, an operational period advance at the EOC, an AVL unit
//! rebooting into a new epoch, and a surge of AVL positions from ten units, interleaved by a
//! seeded generator.

use std::collections::BTreeMap;

use crate::json::{self, Json};

pub const INCIDENT: &str = "FIRE-0412";
pub const INCIDENT_NAME: &str = "Structure fire, 1200 Oak St";
pub const ENGINE: &str = "Engine 7";

/// The feed in the four stretches the demo publishes at different moments.
#[derive(Debug, Clone, Default)]
pub struct Script {
    /// Before the surge: the incident opens, units assigned, period 1.
    pub opening: Vec<Vec<u8>>,
    /// The surge the primary has accepted but not yet acknowledged when it autosaves: this is
    /// what the standby will re-deliver. Holds the three casualty reports and Engine 7
    /// "assigned".
    pub surge: Vec<Vec<u8>>,
    /// After the autosave, before the primary fails: Engine 7 "available".
    pub after_autosave: Vec<Vec<u8>>,
    /// On the standby, after the failover: the period advance, a reboot, more positions.
    pub after_failover: Vec<Vec<u8>>,
}

impl Script {
    pub fn all(&self) -> impl Iterator<Item = &Vec<u8>> {
        self.opening
            .iter()
            .chain(&self.surge)
            .chain(&self.after_autosave)
            .chain(&self.after_failover)
    }
    pub fn len(&self) -> usize {
        self.opening.len()
            + self.surge.len()
            + self.after_autosave.len()
            + self.after_failover.len()
    }
}

/// splitmix64: deterministic for a seed, no dependency.
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }
}

/// One producer: names, boot epoch and the next sequence number.
struct Producer {
    agency: &'static str,
    source_id: &'static str,
    unit: &'static str,
    epoch: u64,
    next: u64,
}

impl Producer {
    fn new(agency: &'static str, source_id: &'static str, unit: &'static str, epoch: u64) -> Self {
        Producer {
            agency,
            source_id,
            unit,
            epoch,
            next: 1,
        }
    }

    /// A message from this producer with `body` (JSON members, without braces).
    fn emit(&mut self, body: &str) -> Vec<u8> {
        let seq = self.next;
        self.next += 1;
        format!(
            r#"{{"agency":"{}","source_id":"{}","epoch":{},"sequence":{seq},{body}}}"#,
            self.agency, self.source_id, self.epoch
        )
        .into_bytes()
    }

    fn reboot(&mut self) {
        self.epoch += 1;
        self.next = 1;
    }
}

const AVL: [(&str, &str, &str, u64); 10] = [
    ("CALFIRE", "E9-AVL", "Engine 9", 2),
    ("CALFIRE", "T3-AVL", "Truck 3", 1),
    ("CALFIRE", "B2-AVL", "Battalion 2", 5),
    ("SACCO-EMS", "M12", "Medic 12", 0),
    ("SACCO-EMS", "M14", "Medic 14", 0),
    ("SACSO", "S21", "Sheriff 21", 1),
    ("SACSO", "S22", "Sheriff 22", 1),
    ("CHP", "C5", "CHP 5", 0),
    ("SMUD", "L1", "Line crew 1", 0),
    ("CALFIRE", "W4-AVL", "Water tender 4", 3),
];

/// The feed for `seed` with about `messages` messages in all (at least 40).
pub fn script(seed: u64, messages: usize) -> Script {
    let mut rng = Rng(seed);
    let mut ic = Producer::new("CALFIRE", "IC-4471", "IC", 1);
    let mut e7 = Producer::new("CALFIRE", "E7-AVL", ENGINE, 3);
    let mut eoc = Producer::new("OES", "EOC-PLANNING", "EOC", 0);
    let mut avl: Vec<Producer> = AVL
        .iter()
        .map(|(a, s, u, e)| Producer::new(a, s, u, *e))
        .collect();
    let position = |rng: &mut Rng, avl: &mut Vec<Producer>| {
        let p = &mut avl[rng.below(AVL.len() as u64) as usize];
        let (lat, lon) = (rng.below(100_000), rng.below(100_000));
        let unit = p.unit;
        p.emit(&format!(
            r#""type":"position","unit":"{unit}","lat":38.5{lat:05},"lon":-121.4{lon:05}"#
        ))
    };
    // Ten story messages; the rest are positions, split 20/50/10/20 over the stretches.
    let positions = messages.max(40) - 10;
    let (p_open, p_surge, p_auto) = (positions * 2 / 10, positions * 5 / 10, positions / 10);
    let p_fail = positions - p_open - p_surge - p_auto;
    let mut s = Script::default();
    s.opening.push(ic.emit(&format!(
        r#""type":"incident_opened","incident":"{INCIDENT}","name":"{INCIDENT_NAME}""#
    )));
    s.opening
        .push(eoc.emit(r#""type":"operational_period","period":1"#));
    s.opening.push(e7.emit(&format!(
        r#""type":"unit_status","unit":"{ENGINE}","status":"available""#
    )));
    for _ in 0..p_open {
        let m = position(&mut rng, &mut avl);
        s.opening.push(m);
    }
    // The surge, with the story's messages at seeded places.
    let surge_len = p_surge;
    let mut story = vec![
        e7.emit(&format!(
            r#""type":"unit_status","unit":"{ENGINE}","status":"assigned","incident":"{INCIDENT}""#
        )),
        ic.emit(&format!(
            r#""type":"casualty_delta","incident":"{INCIDENT}","delta":1"#
        )),
        ic.emit(&format!(
            r#""type":"casualty_delta","incident":"{INCIDENT}","delta":1"#
        )),
        ic.emit(&format!(
            r#""type":"casualty_delta","incident":"{INCIDENT}","delta":1"#
        )),
    ]
    .into_iter();
    let mut slots: Vec<usize> = (0..4)
        .map(|_| rng.below(surge_len as u64 + 1) as usize)
        .collect();
    slots.sort_unstable();
    let mut next_slot = slots.into_iter().peekable();
    for i in 0..=surge_len {
        while next_slot.peek() == Some(&i) {
            next_slot.next();
            if let Some(m) = story.next() {
                s.surge.push(m);
            }
        }
        if i < surge_len {
            let m = position(&mut rng, &mut avl);
            s.surge.push(m);
        }
    }
    s.after_autosave.push(e7.emit(&format!(
        r#""type":"unit_status","unit":"{ENGINE}","status":"available","note":"released from {INCIDENT}""#
    )));
    for _ in 0..p_auto {
        let m = position(&mut rng, &mut avl);
        s.after_autosave.push(m);
    }
    s.after_failover
        .push(eoc.emit(r#""type":"operational_period","period":2"#));
    // An AVL box reboots: its sequence restarts under a higher epoch.
    avl[0].reboot();
    let unit = avl[0].unit;
    let m = avl[0].emit(&format!(
        r#""type":"position","unit":"{unit}","lat":38.500000,"lon":-121.400000,"note":"rebooted""#
    ));
    s.after_failover.push(m);
    for _ in 0..p_fail {
        let m = position(&mut rng, &mut avl);
        s.after_failover.push(m);
    }
    s
}

/// What the Common Operating Picture shows after applying a sequence of messages.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Cop {
    pub casualties: BTreeMap<String, i64>,
    pub units: BTreeMap<String, String>,
    pub positions: BTreeMap<String, (String, String)>,
    pub operational_period: u64,
    pub applied: u64,
}

impl Cop {
    /// Applies one message as a downstream COP would: blindly.
    pub fn apply(&mut self, payload: &[u8]) {
        self.applied += 1;
        let Ok(msg) = json::parse(payload, 32) else {
            return;
        };
        let field = |name: &str| match &msg {
            Json::Object(members) => members.iter().find(|(k, _)| k == name).map(|(_, v)| v),
            _ => None,
        };
        let text = |name: &str| match field(name) {
            Some(Json::String(s)) => Some(s.clone()),
            _ => None,
        };
        let number = |name: &str| match field(name) {
            Some(Json::Number(n)) => Some(n.clone()),
            _ => None,
        };
        match text("type").as_deref() {
            Some("casualty_delta") => {
                if let (Some(i), Some(d)) = (text("incident"), number("delta")) {
                    *self.casualties.entry(i).or_insert(0) += d.parse::<i64>().unwrap_or(0);
                }
            }
            Some("incident_opened") => {
                if let Some(i) = text("incident") {
                    self.casualties.entry(i).or_insert(0);
                }
            }
            Some("unit_status") => {
                if let (Some(u), Some(s)) = (text("unit"), text("status")) {
                    self.units.insert(u, s);
                }
            }
            Some("operational_period") => {
                if let Some(p) = number("period").and_then(|p| p.parse().ok()) {
                    self.operational_period = p;
                }
            }
            Some("position") => {
                if let (Some(u), Some(lat), Some(lon)) =
                    (text("unit"), number("lat"), number("lon"))
                {
                    self.positions.insert(u, (lat, lon));
                }
            }
            _ => {}
        }
    }

    pub fn casualties(&self) -> i64 {
        self.casualties.get(INCIDENT).copied().unwrap_or(0)
    }

    pub fn engine(&self) -> &str {
        self.units.get(ENGINE).map_or("-", String::as_str)
    }

    /// The same picture, ignoring how many messages built it.
    pub fn same_picture(&self, other: &Cop) -> bool {
        self.casualties == other.casualties
            && self.units == other.units
            && self.positions == other.positions
            && self.operational_period == other.operational_period
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::{self, FeedContract};

    #[test]
    fn the_script_tells_the_story_and_every_message_is_a_distinct_event() {
        let s = script(7, 400);
        assert_eq!(s.len(), 400);
        let c = FeedContract::default();
        let mut keys = std::collections::HashSet::new();
        for m in s.all() {
            let msg = wire::decode(m, &c).unwrap();
            assert!(keys.insert(msg.key()), "{}", String::from_utf8_lossy(m));
        }
        let mut cop = Cop::default();
        s.all().for_each(|m| cop.apply(m));
        assert_eq!(cop.casualties(), 3);
        assert_eq!(cop.engine(), "available");
        assert_eq!(cop.operational_period, 2);
        // Replaying the surge after the autosave stretch is the damage the demo shows.
        s.surge.iter().for_each(|m| cop.apply(m));
        assert_eq!((cop.casualties(), cop.engine()), (6, "assigned"));
    }

    #[test]
    fn a_seed_gives_the_same_feed_and_another_seed_another() {
        assert_eq!(script(1, 200).surge, script(1, 200).surge);
        assert_ne!(script(1, 200).surge, script(2, 200).surge);
        assert_eq!(script(3, 5).len(), 40);
    }
}
