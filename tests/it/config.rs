//! Configuration through the real binary: `check-config` and `run` share one validation, so a
//! value `check-config` accepts never panics or misbehaves in `run`; `digest_ignore` pointers
//! never overlap; broker URLs never carry (or print) credentials; reconnects always back off;
//! `check-config` takes either backend with each sink kind, as `run` and `relay` do.

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use super::broker::{free_port, signal};
use super::common::{self, run_with_stdin};

const MQTT: &str =
    "[mqtt]\nbrokers = [\"mqtt://127.0.0.1:1\"]\nclient_id = \"c\"\ntopics = [\"t/#\"]\n";

fn write_config(dir: &Path, body: &str) -> std::path::PathBuf {
    let cfg = dir.join("c.toml");
    let db = dir.join("db.redb");
    std::fs::write(
        &cfg,
        format!("[store]\npath = {:?}\n{body}", db.to_str().unwrap()),
    )
    .unwrap();
    cfg
}

/// The exit code within `limit`, or `None` (the process is then killed).
fn wait_exit(child: &mut Child, limit: Duration) -> Option<i32> {
    let start = Instant::now();
    while start.elapsed() < limit {
        if let Some(status) = child.try_wait().unwrap() {
            return Some(status.code().unwrap_or(-1));
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let _ = child.kill();
    let _ = child.wait();
    None
}

/// `(config body, text the one-line error must contain)`: every example of issue 9 item 5.
fn invalid_examples() -> Vec<(String, String)> {
    let mut cases: Vec<(String, String)> = Vec::new();
    for protocol in ["v5", "v3.1.1"] {
        for ka in [0, 4, 65_536] {
            cases.push((
                format!("{MQTT}protocol = {protocol:?}\nkeep_alive_seconds = {ka}\n"),
                "[mqtt] keep_alive_seconds".into(),
            ));
        }
    }
    cases.push((
        format!("{MQTT}[service]\nshutdown_timeout_seconds = 18446744073709551615\n"),
        "[service] shutdown_timeout_seconds".into(),
    ));
    cases.push((
        format!("{MQTT}[service]\nshutdown_timeout_seconds = 0\n"),
        "[service] shutdown_timeout_seconds".into(),
    ));
    let long = "x".repeat(65_536);
    for filter in [
        "a/#/b",
        "a+",
        "a/b#",
        "#/a",
        "+a/b",
        "a/+b",
        "a\\u0000b",
        &long,
        "$share/g/t",
        "",
    ] {
        cases.push((
            format!(
                "[mqtt]\nbrokers = [\"mqtt://127.0.0.1:1\"]\nclient_id = \"c\"\ntopics = [\"ok/#\", \"{filter}\"]\n"
            ),
            "[mqtt] topics".into(),
        ));
    }
    for (key, value) in [
        ("retries_per_broker", "1001"),
        ("backoff_initial_ms", "0"),
        ("backoff_max_ms", "600001"),
        ("receive_maximum", "0"),
        ("session_expiry_seconds", "59"),
    ] {
        cases.push((format!("{MQTT}{key} = {value}\n"), format!("[mqtt] {key}")));
    }
    for (section, key, value) in [
        ("window", "seconds", "31536001"),
        ("window", "max_entries", "1000000001"),
        ("feed", "max_payload_bytes", "67108865"),
        ("commit", "linger_ms", "60001"),
        ("store", "cache_mb", "65537"),
        ("retention", "audit_max_age_days", "36501"),
        ("retention", "quarantine_max_entries", "10000000001"),
    ] {
        // `[store]` is already open in the file: add the key there instead of a new table.
        let body = if section == "store" {
            format!("{key} = {value}\n{MQTT}")
        } else {
            format!("{MQTT}[{section}]\n{key} = {value}\n")
        };
        cases.push((body, format!("[{section}] {key}")));
    }
    cases
}

#[test]
fn check_config_rejects_every_value_run_cannot_use_with_one_line_naming_key_and_range() {
    let dir = tempfile::tempdir().unwrap();
    for (body, want) in invalid_examples() {
        let cfg = write_config(dir.path(), &body);
        let out = common::run(&["check-config", cfg.to_str().unwrap()]);
        let err = String::from_utf8_lossy(&out.stderr);
        let shown = body.chars().take(200).collect::<String>();
        assert_eq!(out.status.code(), Some(1), "{shown}: {err}");
        assert!(err.contains(&want), "{shown}: {err}");
        assert_eq!(err.lines().count(), 1, "one line: {err}");
        assert!(err.len() < 400, "short: {err}");
    }
}

#[test]
fn run_with_an_invalid_value_exits_1_without_panicking() {
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let mqtt = format!(
        "[mqtt]\nbrokers = [\"mqtt://127.0.0.1:{port}\"]\nclient_id = \"c\"\ntopics = [\"t/#\"]\n"
    );
    for extra in [
        "keep_alive_seconds = 4\n",
        "protocol = \"v3.1.1\"\nkeep_alive_seconds = 0\n",
        "[service]\nshutdown_timeout_seconds = 18446744073709551615\n",
    ] {
        let cfg = write_config(dir.path(), &format!("{mqtt}{extra}"));
        let mut child = Command::new(common::bin())
            .args(["run", "--config", cfg.to_str().unwrap()])
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let code = wait_exit(&mut child, Duration::from_secs(5));
        if code.is_none() {
            // Still running: the validation let it through. SIGTERM shows what it does then.
            panic!("{extra}: `run` did not refuse the value");
        }
        let mut err = String::new();
        std::io::Read::read_to_string(child.stderr.as_mut().unwrap(), &mut err).unwrap();
        assert_eq!(code, Some(1), "{extra}: {err}");
        assert!(!err.contains("panicked"), "{extra}: {err}");
        assert_eq!(err.lines().count(), 1, "{extra}: {err}");
    }
}

#[test]
fn repeated_or_overlapping_digest_ignore_pointers_are_refused_naming_both() {
    let dir = tempfile::tempdir().unwrap();
    for (list, names) in [
        (r#"["/list/0", "/list/0"]"#, ["\"/list/0\"", "\"/list/0\""]),
        (r#"["/a", "/x", "/a/b"]"#, ["\"/a\"", "\"/a/b\""]),
        (r#"["/a/b/0", "/a/b"]"#, ["\"/a/b/0\"", "\"/a/b\""]),
    ] {
        let cfg = write_config(dir.path(), &format!("[feed]\ndigest_ignore = {list}\n"));
        let out = run_with_stdin(&["ingest", "--config", cfg.to_str().unwrap(), "-"], b"");
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{list}: {err}");
        assert!(err.contains("digest_ignore"), "{list}: {err}");
        for n in names {
            assert!(err.contains(n), "{list}: {err} lacks {n}");
        }
        assert_eq!(err.lines().count(), 1, "{err}");
    }
}

/// The audited outcomes of the database `cfg` names, in order.
fn outcomes(cfg: &Path) -> Vec<String> {
    let out = common::run(&["dump-audit", "--config", cfg.to_str().unwrap()]);
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| {
            let v = replay_guard::json::parse(l.as_bytes(), 16).ok()?;
            let ptr = replay_guard::json::Pointer::parse("/outcome").unwrap();
            match v.pointer(&ptr)? {
                replay_guard::json::Json::String(s) => Some(s.clone()),
                _ => None,
            }
        })
        .collect()
}

#[test]
fn an_ignored_list_item_never_hides_a_change_of_the_others() {
    let dir = tempfile::tempdir().unwrap();
    let first =
        r#"{"agency":"A","source_id":"S","sequence":1,"list":["stamp-1","casualties:3","t-1"]}"#;
    let restamped =
        r#"{"agency":"A","source_id":"S","sequence":1,"list":["stamp-2","casualties:3","t-2"]}"#;
    let changed =
        r#"{"agency":"A","source_id":"S","sequence":1,"list":["stamp-2","casualties:6","t-2"]}"#;
    for list in [r#"["/list/0", "/list/2"]"#, r#"["/list/2", "/list/0"]"#] {
        let cfg = write_config(dir.path(), &format!("[feed]\ndigest_ignore = {list}\n"));
        let db = dir.path().join("db.redb");
        let _ = std::fs::remove_file(&db);
        let feed = format!("{first}\n{restamped}\n{changed}\n");
        let out = run_with_stdin(
            &["ingest", "--config", cfg.to_str().unwrap(), "-"],
            feed.as_bytes(),
        );
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(0), "{list}: {err}");
        assert_eq!(
            outcomes(&cfg),
            ["applied", "duplicate", "conflict"],
            "{list}: {err}"
        );
    }
    // The issue's case, with the pointer given once (twice is refused above).
    let cfg = write_config(dir.path(), "[feed]\ndigest_ignore = [\"/list/0\"]\n");
    let _ = std::fs::remove_file(dir.path().join("db.redb"));
    let feed = concat!(
        r#"{"agency":"A","source_id":"S","sequence":1,"list":["stamp-1","casualties:3"]}"#,
        "\n",
        r#"{"agency":"A","source_id":"S","sequence":1,"list":["stamp-2","casualties:6"]}"#,
        "\n"
    );
    let out = run_with_stdin(
        &["ingest", "--config", cfg.to_str().unwrap(), "-"],
        feed.as_bytes(),
    );
    assert_eq!(out.status.code(), Some(0));
    assert_eq!(outcomes(&cfg), ["applied", "conflict"]);
}

#[test]
fn credentials_in_a_broker_url_are_refused_and_never_printed() {
    let dir = tempfile::tempdir().unwrap();
    for brokers in [
        r#"["mqtt://user:s3cr3t-Pa55@127.0.0.1:1883"]"#,
        r#"["mqtt://127.0.0.1:1883", "mqtts://user:s3cr3t-Pa55@[::1]:8883"]"#,
        r#"["mqtt://user:s3cr3t-Pa55@h:99999"]"#,
        r#"["mqtt://user:s3cr3t-Pa55@h/path"]"#,
        r#"["tcp://user:s3cr3t-Pa55@h:1883"]"#,
        r#"["user:s3cr3t-Pa55@h:1883"]"#,
        r#"["mqtt://us@er:s3cr3t-Pa55@h"]"#,
        r#""mqtt://user:s3cr3t-Pa55@h:1883""#,
        r#"["mqtt://user:s3cr3t-Pa55@h:1883", 5]"#,
    ] {
        let cfg = write_config(
            dir.path(),
            &format!("[mqtt]\nbrokers = {brokers}\nclient_id = \"c\"\ntopics = [\"t\"]\n"),
        );
        let out = common::run(&["check-config", cfg.to_str().unwrap()]);
        let text = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        assert_eq!(out.status.code(), Some(1), "{brokers}: {text}");
        assert!(
            !text.contains("s3cr3t"),
            "{brokers}: secret printed: {text}"
        );
        assert_eq!(text.lines().count(), 1, "{text}");
    }
    let cfg = write_config(
        dir.path(),
        "[mqtt]\nbrokers = [\"mqtt://user:s3cr3t-Pa55@127.0.0.1:1883\"]\nclient_id = \"c\"\ntopics = [\"t\"]\n",
    );
    let out = common::run(&["check-config", cfg.to_str().unwrap()]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("username") && err.contains("password_file"),
        "{err}"
    );
}

#[test]
fn reconnects_back_off_between_every_attempt_even_with_zero_retries_per_broker() {
    let dir = tempfile::tempdir().unwrap();
    // Two closed loopback ports: every attempt fails at once, and each failure fails over.
    let (a, b) = (free_port(), free_port());
    let cfg = write_config(
        dir.path(),
        &format!(
            "[mqtt]\nbrokers = [\"mqtt://127.0.0.1:{a}\", \"mqtt://127.0.0.1:{b}\"]\nclient_id = \"c\"\n\
             topics = [\"t\"]\nretries_per_broker = 0\nbackoff_initial_ms = 50\nbackoff_max_ms = 200\n\
             [service]\nshutdown_timeout_seconds = 5\n"
        ),
    );
    let mut child = Command::new(common::bin())
        .args(["run", "--config", cfg.to_str().unwrap()])
        .env("RUST_LOG", "info")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    std::thread::sleep(Duration::from_secs(2));
    signal(child.id() as i32, "TERM");
    let code = wait_exit(&mut child, Duration::from_secs(5));
    let mut log = String::new();
    std::io::Read::read_to_string(child.stderr.as_mut().unwrap(), &mut log).unwrap();
    assert_eq!(code, Some(0), "{}", &log[..log.len().min(2000)]);
    let attempts = log.matches("connection lost").count();
    let failovers = log.matches("switching broker").count();
    // 50, 100, 200, 200, ... ms: about 11 attempts in 2 s; without backoff, thousands.
    assert!(
        (3..=25).contains(&attempts),
        "{attempts} attempts in 2 s:\n{}",
        &log[..log.len().min(2000)]
    );
    assert!(failovers >= 2, "fails over between the two: {failovers}");
}

/// `run --config cfg` until its log says `line` (within 10 s), then SIGTERM: its exit code
/// and log.
fn run_until_logged(cfg: &Path, line: &str) -> (Option<i32>, String) {
    let log_path = cfg.with_extension("log");
    let mut child = Command::new(common::bin())
        .args(["run", "--config", cfg.to_str().unwrap()])
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log_path).unwrap())
        .spawn()
        .unwrap();
    let log = || std::fs::read_to_string(&log_path).unwrap_or_default();
    let start = Instant::now();
    while !log().contains(line) {
        if start.elapsed() > Duration::from_secs(10) || child.try_wait().unwrap().is_some() {
            let _ = child.kill();
            let _ = child.wait();
            panic!("{line:?} not logged by run:\n{}", log());
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    signal(child.id() as i32, "TERM");
    (wait_exit(&mut child, Duration::from_secs(10)), log())
}

#[test]
fn check_config_accepts_each_backend_with_each_sink_kind_as_run_and_relay_do() {
    let dir = tempfile::tempdir().unwrap();
    // Nothing listens on either port: check-config contacts neither server nor broker.
    let (pg_port, mqtt_port) = (free_port(), free_port());
    let redb = format!(
        "[store]\npath = {:?}\n",
        dir.path().join("db.redb").to_str().unwrap()
    );
    let pg = format!(
        "[store]\nbackend = \"postgres\"\ndsn = \"host=127.0.0.1 port={pg_port} user=rg \
         password=hunter2 dbname=eoc\"\nschema = \"rg_check\"\nstatement_timeout_ms = 2000\n"
    );
    let feed = format!(
        "[mqtt]\nbrokers = [\"mqtt://127.0.0.1:{mqtt_port}\"]\nclient_id = \"rg-check\"\n\
         topics = [\"incidents/#\"]\n"
    );
    let sinks = [
        ("exec", "command = [\"/bin/cat\"]\n".to_string()),
        (
            "mqtt",
            format!(
                "broker = \"mqtt://127.0.0.1:{mqtt_port}\"\nclient_id = \"rg-check-cop\"\n\
                 topic = \"cop/{{agency}}\"\n"
            ),
        ),
        ("http", "url = \"http://127.0.0.1:9/events\"\n".to_string()),
        (
            "postgres",
            format!(
                "dsn = \"host=127.0.0.1 port={pg_port} user=rg dbname=cop\"\n\
                 table = \"cop_events\"\n"
            ),
        ),
        ("syslog", "url = \"tcp://127.0.0.1:9\"\n".to_string()),
    ];
    for (backend, store, names) in [
        (
            "redb",
            &redb,
            "database ".to_string() + dir.path().join("db.redb").to_str().unwrap(),
        ),
        (
            "postgres",
            &pg,
            format!("store postgresql 127.0.0.1:{pg_port}/eoc schema rg_check, not contacted"),
        ),
    ] {
        for (kind, keys) in &sinks {
            let sink = format!("[[sink]]\nname = \"cop\"\nkind = \"{kind}\"\n{keys}");
            for (form, text, want) in [
                (
                    "run",
                    format!("{store}{feed}{sink}"),
                    format!("protocol v5, sinks cop ({kind})"),
                ),
                (
                    "relay",
                    format!("{store}{sink}"),
                    format!(": ok for `relay` ({names}, sinks cop ({kind})"),
                ),
            ] {
                let cfg = dir.path().join(format!("{backend}-{kind}-{form}.toml"));
                std::fs::write(&cfg, &text).unwrap();
                let start = Instant::now();
                let out = common::run(&["check-config", cfg.to_str().unwrap()]);
                let said = format!(
                    "{}{}",
                    String::from_utf8_lossy(&out.stdout),
                    String::from_utf8_lossy(&out.stderr)
                );
                assert_eq!(
                    out.status.code(),
                    Some(0),
                    "{backend} {kind} {form}: {said}"
                );
                assert!(
                    said.contains(&want),
                    "{backend} {kind} {form}: {said} lacks {want}"
                );
                assert!(!said.contains("hunter2"), "{said}");
                assert!(
                    start.elapsed() < Duration::from_secs(5),
                    "{:?}",
                    start.elapsed()
                );
            }
        }
    }
    // `run` takes the same files: the redb one opens its file, the postgres one waits for
    // its server (nobody listens), and both stop cleanly on SIGTERM.
    for (backend, store, line) in [
        ("redb", &redb, "database open"),
        ("postgres", &pg, "PostgreSQL unreachable at start; retrying"),
    ] {
        let cfg = dir.path().join(format!("{backend}-run.toml"));
        std::fs::write(&cfg, format!("{store}{feed}")).unwrap();
        let (code, log) = run_until_logged(&cfg, line);
        assert_eq!(code, Some(0), "{backend}: {log}");
        assert!(!log.contains("hunter2"), "{log}");
    }
}

#[test]
fn check_config_summary_names_run_sinks_and_the_protocol_as_written() {
    let dir = tempfile::tempdir().unwrap();
    let sinks = "[[sink]]\nname = \"cop\"\nkind = \"exec\"\ncommand = [\"/bin/cat\"]\n\
                 [[sink]]\nname = \"web\"\nkind = \"http\"\nurl = \"http://127.0.0.1:9/e\"\n";
    for (protocol, extra, want) in [
        ("v5", sinks, "protocol v5, sinks cop (exec) web (http))"),
        (
            "v3.1.1",
            "",
            "protocol v3.1.1, no [[sink]]: effects reach no one)",
        ),
    ] {
        let cfg = write_config(
            dir.path(),
            &format!("{MQTT}protocol = {protocol:?}\n{extra}"),
        );
        let out = common::run(&["check-config", cfg.to_str().unwrap()]);
        let said = String::from_utf8_lossy(&out.stdout);
        assert_eq!(
            out.status.code(),
            Some(0),
            "{said}{}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(said.trim_end().ends_with(want), "{said} lacks {want}");
    }
}

#[test]
fn check_config_refuses_an_exec_sink_whose_program_cannot_be_started() {
    let dir = tempfile::tempdir().unwrap();
    let plain = dir.path().join("not-a-program");
    std::fs::write(&plain, "x").unwrap();
    let plain = plain.to_str().unwrap().to_string();
    for (command, want) in [
        (
            "[\"/usr/local/bin/cop-import\", \"--batch\"]".to_string(),
            "command: program \"/usr/local/bin/cop-import\" does not exist: install it or fix `command`".to_string(),
        ),
        (format!("[{plain:?}]"), format!("program {plain:?} is not executable")),
        (
            "[\"cop-import-nowhere\"]".to_string(),
            "program \"cop-import-nowhere\" is not an executable file in any directory of PATH (".to_string(),
        ),
    ] {
        let sink = format!("[[sink]]\nname = \"cop\"\nkind = \"exec\"\ncommand = {command}\n");
        for body in [format!("{MQTT}{sink}"), sink.clone()] {
            let cfg = write_config(dir.path(), &body);
            let out = common::run(&["check-config", cfg.to_str().unwrap()]);
            let err = String::from_utf8_lossy(&out.stderr);
            assert_eq!(out.status.code(), Some(1), "{body}: {err}");
            assert!(err.contains("[[sink]] \"cop\" command: "), "{err}");
            assert!(err.contains(&want), "{err} lacks {want}");
            assert_eq!(err.lines().count(), 1, "{err}");
        }
    }
    // A bare name on PATH and a shell are programs too.
    for command in ["[\"cat\"]", "[\"sh\", \"-c\", \"cat >/dev/null\"]"] {
        let cfg = write_config(
            dir.path(),
            &format!("[[sink]]\nname = \"cop\"\nkind = \"exec\"\ncommand = {command}\n"),
        );
        let out = common::run(&["check-config", cfg.to_str().unwrap()]);
        assert_eq!(
            out.status.code(),
            Some(0),
            "{command}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
}
