//! Bad input through the real binary: every malformed kind is quarantined and audited with a
//! reason, the good messages around it still flow, and nothing panics.

use replay_guard::json::{Json, parse};

use super::common::{msg, run, run_with_stdin};

fn field<'a>(row: &'a Json, name: &str) -> &'a Json {
    let Json::Object(m) = row else {
        panic!("not an object")
    };
    &m.iter()
        .find(|(k, _)| k == name)
        .unwrap_or_else(|| panic!("no field {name}"))
        .1
}

fn string(row: &Json, name: &str) -> String {
    match field(row, name) {
        Json::String(s) => s.clone(),
        other => panic!("{name} is {other:?}"),
    }
}

#[test]
fn malformed_messages_are_quarantined_with_reasons_and_the_feed_keeps_flowing() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("bad.redb");
    let db_s = db.to_str().unwrap();

    let deep = format!(
        "{{\"agency\":\"A\",\"source_id\":\"S\",\"sequence\":9,\"x\":{}1{}}}",
        "[".repeat(10_000),
        "]".repeat(10_000)
    );
    let huge = format!(
        r#"{{"agency":"A","source_id":"S","sequence":10,"blob":"{}"}}"#,
        "x".repeat(1 << 20)
    );
    let bad: Vec<(Vec<u8>, &str)> = vec![
        (b"not json".to_vec(), "invalid JSON"),
        (b"[1,2,3]".to_vec(), "array, not an object"),
        (b"null".to_vec(), "null, not an object"),
        (b"{}".to_vec(), "missing field agency"),
        (
            br#"{"agency":"","source_id":"S","sequence":1}"#.to_vec(),
            "agency is an empty string",
        ),
        (
            br#"{"agency":"A","source_id":"S","sequence":-3}"#.to_vec(),
            "unsigned integer, found -3",
        ),
        (
            br#"{"agency":"A","source_id":"S","sequence":2.5}"#.to_vec(),
            "unsigned integer, found 2.5",
        ),
        (
            br#"{"agency":"A","source_id":"S","sequence":"7"}"#.to_vec(),
            "found a string",
        ),
        (
            br#"{"agency":"A","source_id":"S","sequence":99999999999999999999}"#.to_vec(),
            "64 bits",
        ),
        (
            b"{\"agency\":\"A\xff\xfe\",\"source_id\":\"S\",\"sequence\":1}".to_vec(),
            "UTF-8",
        ),
        (
            b"{\"agency\":\"A\",\"source_id\":\"S\0\",\"sequence\":1}".to_vec(),
            "control character",
        ),
        (deep.into_bytes(), "nesting deeper than 32"),
        (huge.into_bytes(), "exceeds max_payload_bytes"),
    ];
    let mut input = Vec::new();
    input.extend_from_slice(msg("A", "S", 0, 1, "first").as_bytes());
    input.push(b'\n');
    for (line, _) in &bad {
        input.extend_from_slice(line);
        input.extend_from_slice(b"\r\n");
    }
    input.extend_from_slice(b"\n   \n");
    input.extend_from_slice(msg("A", "S", 0, 2, "after the bad ones").as_bytes());
    input.push(b'\n');

    let out = run_with_stdin(&["ingest", "--db", db_s, "-"], &input);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{stderr}");
    assert!(!stderr.contains("panicked"), "{stderr}");
    assert!(
        stderr.contains(&format!("{} messages decided", bad.len() + 2)),
        "{stderr}"
    );

    let q = run(&["dump-quarantine", "--db", db_s]);
    assert_eq!(q.status.code(), Some(0));
    let rows: Vec<Json> = String::from_utf8(q.stdout)
        .unwrap()
        .lines()
        .map(|l| parse(l.as_bytes(), 16).unwrap())
        .collect();
    assert_eq!(rows.len(), bad.len());
    for (row, (bytes, want)) in rows.iter().zip(&bad) {
        assert_eq!(string(row, "outcome"), "malformed");
        let reason = string(row, "reason");
        assert!(reason.contains(want), "reason {reason:?} lacks {want:?}");
        // Raw bytes are kept: UTF-8 verbatim, anything else escaped reversibly; of an
        // oversized payload its first max_payload_bytes, with its size and SHA-256 in the reason.
        let payload = string(row, "payload");
        if bytes.len() > 262_144 {
            assert_eq!(payload.as_bytes(), &bytes[..262_144]);
            let sha = replay_guard::model::hex(&replay_guard::key::sha256(&[bytes]));
            assert!(
                reason.contains(&format!("payload of {} bytes (SHA-256 {sha})", bytes.len())),
                "{reason}"
            );
            continue;
        }
        match std::str::from_utf8(bytes) {
            Ok(s) => {
                assert_eq!(string(row, "payload_encoding"), "utf-8");
                assert_eq!(payload, s);
            }
            Err(_) => {
                assert_eq!(string(row, "payload_encoding"), "escaped");
                assert!(payload.contains("\\xff\\xfe"), "{payload}");
            }
        }
    }

    let e = run(&["dump-effects", "--db", db_s]);
    let effects: Vec<Json> = String::from_utf8(e.stdout)
        .unwrap()
        .lines()
        .map(|l| parse(l.as_bytes(), 16).unwrap())
        .collect();
    assert_eq!(
        effects.len(),
        2,
        "the good messages around the bad ones are applied"
    );
    assert_eq!(
        string(field(&effects[1], "message"), "body"),
        "after the bad ones"
    );

    // The same bad bytes again do not grow the quarantine; the audit still records each.
    let again = run_with_stdin(&["ingest", "--db", db_s, "-"], &input);
    assert_eq!(again.status.code(), Some(0));
    let q2 = run(&["dump-quarantine", "--db", db_s]);
    let rows2: Vec<Json> = String::from_utf8(q2.stdout)
        .unwrap()
        .lines()
        .map(|l| parse(l.as_bytes(), 16).unwrap())
        .collect();
    assert_eq!(rows2.len(), bad.len());
    for row in &rows2 {
        assert_eq!(field(row, "deliveries"), &Json::Number("2".into()));
    }
    let audit = run(&["dump-audit", "--db", db_s]);
    assert_eq!(
        String::from_utf8(audit.stdout).unwrap().lines().count(),
        2 * (bad.len() + 2)
    );
}

#[test]
fn a_number_beyond_the_canonical_range_is_quarantined_as_malformed_never_dropped() {
    // Valid JSON (RFC 8259 puts no bound on exponents), but its canonical form would need an
    // exponent of 19 digits: documented as `malformed` in the feed contract.
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("n.redb");
    let db_s = db.to_str().unwrap();
    let line = r#"{"agency":"A","source_id":"S","sequence":1,"x":1e9999999999999999999}"#;
    let edge = r#"{"agency":"A","source_id":"S","sequence":2,"x":1e999999999999999}"#;
    let out = run_with_stdin(
        &["ingest", "--db", db_s, "-"],
        format!("{line}\n{edge}\n").as_bytes(),
    );
    assert_eq!(out.status.code(), Some(0));
    let q = run(&["dump-quarantine", "--db", db_s]);
    let rows: Vec<Json> = String::from_utf8(q.stdout)
        .unwrap()
        .lines()
        .map(|l| parse(l.as_bytes(), 16).unwrap())
        .collect();
    assert_eq!(rows.len(), 1, "only the out-of-range one is quarantined");
    assert_eq!(string(&rows[0], "outcome"), "malformed");
    assert_eq!(string(&rows[0], "payload"), line);
    assert!(
        string(&rows[0], "reason").contains("out of the range replay-guard can canonicalise"),
        "{:?}",
        string(&rows[0], "reason")
    );
    let e = run(&["dump-effects", "--db", db_s]);
    assert_eq!(String::from_utf8(e.stdout).unwrap().lines().count(), 1);
}
