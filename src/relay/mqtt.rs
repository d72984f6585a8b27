//! The `mqtt` sink: each event's envelope published at QoS 1 (retain false) to the topic
//! template filled from the event. The MQTT work is `transport::publish`'s; this adapter fills
//! topics and says which failures are for good (poison) and which are worth a retry.

use std::time::Duration;

use super::{Attempt, Event, Failure};
use crate::config::MqttSink as MqttSinkConfig;
use crate::config::TOPIC_PLACEHOLDERS;
use crate::transport::publish::{PublishError, Publisher, topic_name_problem};

pub struct MqttSink {
    /// Boxed: the client's state is large beside the other sinks.
    publisher: Box<Publisher>,
    template: String,
    timeout: Duration,
    /// The event after those handed to the publisher fills the template with no topic name:
    /// reported as poison once the publisher reports all before it; nothing after it is
    /// taken until then.
    poison: Option<Failure>,
}

impl MqttSink {
    pub fn new(cfg: &MqttSinkConfig, timeout: Duration) -> MqttSink {
        MqttSink {
            publisher: Box::new(Publisher::new(cfg)),
            template: cfg.topic.clone(),
            timeout,
            poison: None,
        }
    }

    /// Hands `events` over, to be published after those handed over before (the windowed
    /// mode: `acked` reports them).
    pub fn hand(&mut self, events: &[Event]) {
        for e in events {
            if self.poison.is_some() {
                return;
            }
            let topic = fill(&self.template, e);
            if let Some(why) = topic_name_problem(&topic) {
                self.poison = Some(Failure::Poison {
                    reason: format!(
                        "the topic template {:?} gives {:?}, which {why}: not a valid MQTT topic \
                         name",
                        self.template,
                        shorten(&topic)
                    ),
                    response: String::new(),
                });
                return;
            }
            self.publisher.hand(topic, e.json.as_bytes().to_vec());
        }
    }

    /// Waits until more of what was handed over is acknowledged from the front, or a failure
    /// (after which nothing handed over is pending). Cancel-safe.
    pub async fn acked(&mut self) -> Attempt {
        if self.publisher.pending() == 0 {
            return Attempt {
                delivered: 0,
                failure: self.poison.take(),
            };
        }
        let out = self.publisher.progress(self.timeout).await;
        if let Some(f) = out.failure {
            self.poison = None;
            return Attempt {
                delivered: out.acked,
                failure: Some(failure(f)),
            };
        }
        let failure = if self.publisher.pending() == 0 {
            self.poison.take()
        } else {
            None
        };
        Attempt {
            delivered: out.acked,
            failure,
        }
    }

    /// Forgets everything handed over.
    pub fn forget(&mut self) {
        self.poison = None;
        self.publisher.forget();
    }

    pub async fn close(&mut self) {
        self.publisher.close().await;
    }
}

/// MQTT 5 PUBACK codes that refuse the event itself: publishing it again cannot succeed.
/// Every other failure code (0x80, 0x83, 0x91, 0x97 quota exceeded, ...) is worth a retry.
const POISON_CODES: [u8; 3] = [0x87, 0x90, 0x99];

fn failure(e: PublishError) -> Failure {
    match &e {
        PublishError::Refused { code, name, .. } if POISON_CODES.contains(code) => {
            // Classed by its code: parked, unless the next event of another source is
            // refused the same way, which blocks the sink (an ACL refusing the topic).
            Failure::Refused {
                class: format!("PUBACK 0x{code:02X}"),
                reason: format!("the broker refused the event: reason code 0x{code:02X} ({name})"),
                response: e.to_string(),
            }
        }
        PublishError::TooLarge { .. } => Failure::Poison {
            reason: "the event is larger than the broker accepts".into(),
            response: e.to_string(),
        },
        PublishError::Refused { .. } | PublishError::Connection(_) | PublishError::Timeout(_) => {
            Failure::Retry {
                error: e.to_string(),
                after: None,
            }
        }
    }
}

/// The topic for `e`: every placeholder replaced in one pass (a value holding `{topic}`
/// stays as it is).
fn fill(template: &str, e: &Event) -> String {
    let mut out = String::with_capacity(template.len() + e.topic.len() + 32);
    let mut rest = template;
    while let Some(i) = rest.find('{') {
        out.push_str(&rest[..i]);
        let tail = &rest[i..];
        match TOPIC_PLACEHOLDERS.iter().find(|p| tail.starts_with(**p)) {
            Some(p) => {
                out.push_str(match *p {
                    "{agency}" => &e.agency,
                    "{source_id}" => &e.source_id,
                    _ => &e.topic,
                });
                rest = &tail[p.len()..];
            }
            None => {
                out.push('{');
                rest = &tail[1..];
            }
        }
    }
    out.push_str(rest);
    out
}

fn shorten(s: &str) -> String {
    if s.len() <= 200 {
        return s.to_string();
    }
    let cut = (0..=200)
        .rev()
        .find(|i| s.is_char_boundary(*i))
        .unwrap_or(0);
    format!("{}… ({} bytes)", &s[..cut], s.len())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn event(agency: &str, source_id: &str, topic: &str) -> Event {
        Event {
            offset: 0,
            id: "id".into(),
            key: [0; 32],
            agency: agency.into(),
            source_id: source_id.into(),
            topic: topic.into(),
            json: "{}".into(),
            outcome: "applied".into(),
            fields: Vec::new(),
        }
    }

    #[test]
    fn placeholders_are_filled_once() {
        let e = event("{topic}", "u1", "feed/x");
        assert_eq!(
            fill("cop/{agency}/{source_id}/{topic}", &e),
            "cop/{topic}/u1/feed/x"
        );
        assert_eq!(fill("{x}/{agency}", &event("a", "b", "c")), "{x}/a");
    }

    #[test]
    fn only_refusals_of_the_event_itself_are_poison() {
        let refused = |code| PublishError::Refused {
            code,
            name: "n",
            reason_string: None,
        };
        for code in [0x87, 0x90, 0x99] {
            assert!(matches!(failure(refused(code)), Failure::Refused { .. }));
        }
        for code in [0x80, 0x83, 0x91, 0x97] {
            assert!(matches!(failure(refused(code)), Failure::Retry { .. }));
        }
    }
}
