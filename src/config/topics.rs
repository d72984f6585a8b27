//! MQTT topics: the `[mqtt] topics` filters (MQTT 3.1.1 and 5, section 4.7) and an mqtt
//! sink's topic template.

use super::limits::MAX_TEXT;

/// MQTT strings (topic filters) are at most 65,535 bytes.
pub const MAX_TOPIC_FILTER_BYTES: usize = 65_535;

/// Why a `[mqtt] topics` entry cannot be subscribed to (MQTT 3.1.1 and 5, section 4.7).
pub fn topic_filter_problem(filter: &str) -> Option<String> {
    if filter.is_empty() {
        return Some("is empty".into());
    }
    if filter.len() > MAX_TOPIC_FILTER_BYTES {
        return Some(format!(
            "is {} bytes long (MQTT allows {MAX_TOPIC_FILTER_BYTES})",
            filter.len()
        ));
    }
    if filter.contains('\0') {
        return Some("contains NUL".into());
    }
    if filter.chars().any(char::is_control) {
        return Some("contains a control character (brokers may close the connection)".into());
    }
    if filter.starts_with("$share/") {
        return Some(
            "is a shared subscription: give the plain filter and [mqtt] share_group (with \
             [store] backend = \"postgres\", so every member of the group decides against \
             one window)"
                .into(),
        );
    }
    let levels: Vec<&str> = filter.split('/').collect();
    for (i, level) in levels.iter().enumerate() {
        if level.contains('#') && (*level != "#" || i + 1 != levels.len()) {
            return Some("has '#' that is not the whole last level".into());
        }
        if level.contains('+') && *level != "+" {
            return Some("has '+' that is not a whole level".into());
        }
    }
    None
}

/// The placeholders a sink topic may hold.
pub const TOPIC_PLACEHOLDERS: [&str; 3] = ["{agency}", "{source_id}", "{topic}"];

/// Why an mqtt sink's `topic` template cannot be published to: it is a topic name (no
/// wildcards) with only the known placeholders.
pub(super) fn topic_template_problem(t: &str) -> Option<String> {
    if t.is_empty() {
        return Some("is required, e.g. \"cop/{agency}/{source_id}\"".into());
    }
    if t.len() > MAX_TEXT {
        return Some(format!("is longer than {MAX_TEXT} bytes"));
    }
    if t.contains(['#', '+', '\0']) {
        return Some("may not hold '#', '+' or NUL (it is a topic name, not a filter)".into());
    }
    let mut rest = t;
    while let Some(i) = rest.find('{') {
        let tail = &rest[i..];
        match TOPIC_PLACEHOLDERS.iter().find(|p| tail.starts_with(**p)) {
            Some(p) => rest = &tail[p.len()..],
            None => {
                return Some(format!(
                    "has an unknown placeholder at {:?}: use {}",
                    tail.chars().take(16).collect::<String>(),
                    TOPIC_PLACEHOLDERS.join(", ")
                ));
            }
        }
    }
    None
}

/// Whether a topic an mqtt sink's `template` can give may match the subscription `filter`
/// (MQTT 4.7). A level holding a placeholder can become any text, '/' included, so from the
/// first such level on anything may match: an over-approximation (a sink refused by it may in
/// fact never meet the filter; one it accepts never does). A shared subscription's filter is
/// the part after `$share/GROUP/`.
pub(super) fn filter_may_match_template(filter: &str, template: &str) -> bool {
    let filter = match filter.strip_prefix("$share/") {
        Some(rest) => rest.split_once('/').map_or(rest, |(_, f)| f),
        None => filter,
    };
    let f: Vec<&str> = filter.split('/').collect();
    let t: Vec<&str> = template.split('/').collect();
    for (i, level) in f.iter().enumerate() {
        if *level == "#" {
            return true;
        }
        let Some(tl) = t.get(i) else { return false };
        if TOPIC_PLACEHOLDERS.iter().any(|p| tl.contains(p)) {
            return true;
        }
        if *level != "+" && level != tl {
            return false;
        }
    }
    f.len() == t.len()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Config;

    #[test]
    fn topic_filters_follow_the_mqtt_rules() {
        for ok in [
            "#",
            "+",
            "a/b",
            "a/+/c",
            "a/#",
            "+/+/#",
            "/",
            "a//b",
            "$SYS/#",
            "é/ü",
            "$shared/x",
        ] {
            assert_eq!(topic_filter_problem(ok), None, "{ok}");
        }
        for (bad, why) in [
            ("", "empty"),
            ("a/#/b", "'#'"),
            ("#/a", "'#'"),
            ("a#", "'#'"),
            ("a/b#", "'#'"),
            ("a+", "'+'"),
            ("+a/b", "'+'"),
            ("a/+b/c", "'+'"),
            ("a\0b", "NUL"),
            ("a\u{7}b", "control"),
            ("$share/group/t", "shared subscription"),
        ] {
            let got = topic_filter_problem(bad).unwrap_or_default();
            assert!(got.contains(why), "{bad:?}: {got}");
        }
        let long = "x".repeat(MAX_TOPIC_FILTER_BYTES);
        assert_eq!(topic_filter_problem(&long), None);
        let longer = format!("{long}x");
        assert!(
            topic_filter_problem(&longer)
                .unwrap()
                .contains("65536 bytes")
        );
        let e = Config::parse(
            "[mqtt]\nbrokers = [\"mqtt://h\"]\nclient_id = \"c\"\ntopics = [\"ok\", \"a/#/b\"]\n",
        )
        .unwrap_err()
        .to_string();
        assert!(e.contains("[mqtt] topics: \"a/#/b\" has '#'"), "{e}");
    }

    #[test]
    fn a_filter_may_match_a_template_from_its_first_placeholder_on() {
        for (filter, template, may) in [
            ("#", "cop/audit", true),
            ("cop/#", "cop", true),
            ("incidents/#", "cop/{agency}", false),
            ("incidents/#", "incidents/audit", true),
            ("+/+/status", "cop/{agency}", true),
            ("+/+/status", "cop/x/y", false),
            ("incidents/+", "incidents/{agency}/{source_id}", true),
            ("a/+", "a/b/c", false),
            ("a/b", "a/b", true),
            ("a/b", "a/b/c", false),
            ("a/b/c", "a/b", false),
            ("x/#", "pre{topic}", true),
            ("$share/cop/incidents/#", "incidents/decisions", true),
            ("$share/cop/incidents/#", "audit/{agency}", false),
        ] {
            assert_eq!(
                filter_may_match_template(filter, template),
                may,
                "{filter} vs {template}"
            );
        }
    }
}
