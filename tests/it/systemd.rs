//! The shipped systemd units (the service and the standalone relay) and example configs:
//! `systemd-analyze verify` accepts each unit, `systemd-analyze security --offline=true` rates
//! each 2.0 or lower, both share one dynamic user and database, and `check-config` accepts
//! both example configs.

use std::path::{Path, PathBuf};
use std::process::Command;

use super::common;

/// A copy of the shipped unit `name` in `dir`, its ExecStart pointing at the binary under test
/// (verify checks that ExecStart exists).
fn unit_for_this_build(dir: &Path, name: &str) -> PathBuf {
    let text = std::fs::read_to_string(shipped(&format!("systemd/{name}"))).unwrap();
    let unit = dir.join(name);
    std::fs::write(
        &unit,
        text.replace("/usr/bin/replay-guard", common::bin().to_str().unwrap()),
    )
    .unwrap();
    unit
}

fn shipped(path: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join(path)
}

/// `systemd-analyze verify` accepts the shipped unit `name` without a warning, and
/// `systemd-analyze security --offline=true` rates its exposure 2.0 or lower.
fn assert_verifies_with_exposure_at_most_2(name: &str) {
    let dir = tempfile::tempdir().unwrap();
    let unit = unit_for_this_build(dir.path(), name);
    // The man pages Documentation= names come with the package (tests/it/deb.rs checks they
    // are in it), not with this checkout.
    let verify = Command::new("systemd-analyze")
        .args(["verify", "--man=no"])
        .arg(&unit)
        .output()
        .expect("systemd-analyze must be installed");
    assert!(
        verify.status.success(),
        "{name}: verify: {}",
        String::from_utf8_lossy(&verify.stderr)
    );
    assert!(
        verify.stderr.is_empty(),
        "{name}: verify warnings: {}",
        String::from_utf8_lossy(&verify.stderr)
    );

    let sec = Command::new("systemd-analyze")
        .args(["security", "--offline=true", "--no-pager"])
        .arg(&unit)
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&sec.stdout);
    let line = text
        .lines()
        .find(|l| l.contains("Overall exposure level"))
        .unwrap_or_else(|| panic!("{name}: no exposure line:\n{text}"));
    let level: f64 = line
        .split(':')
        .nth(1)
        .and_then(|r| r.split_whitespace().next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("{name}: cannot read {line:?}"));
    assert!(level <= 2.0, "{name}: exposure {level} > 2.0:\n{text}");
}

/// `check-config FILE` exits 0 with a line containing `want`.
fn assert_check_config_accepts(path: &Path, want: &str) {
    let out = common::run(&["check-config", path.to_str().unwrap()]);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}: {}",
        path.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(stdout.contains(want), "{}: {stdout}", path.display());
}

#[test]
fn systemd_unit_verifies_and_its_exposure_is_at_most_2() {
    assert_verifies_with_exposure_at_most_2("replay-guard.service");
}

#[test]
fn relay_unit_verifies_and_its_exposure_is_at_most_2() {
    assert_verifies_with_exposure_at_most_2("replay-guard-relay.service");
}

/// Both units run as the one named dynamic user, in the one state directory, so they share
/// the database file.
#[test]
fn the_service_and_relay_units_share_the_dynamic_user_and_the_database() {
    let settings = |name: &str| -> Vec<String> {
        std::fs::read_to_string(shipped(&format!("systemd/{name}")))
            .unwrap()
            .lines()
            .filter(|l| {
                [
                    "User=",
                    "DynamicUser=",
                    "StateDirectory=",
                    "StateDirectoryMode=",
                ]
                .iter()
                .any(|k| l.starts_with(k))
            })
            .map(str::to_string)
            .collect()
    };
    let service = settings("replay-guard.service");
    assert_eq!(
        service,
        [
            "User=replay-guard",
            "DynamicUser=yes",
            "StateDirectory=replay-guard",
            "StateDirectoryMode=0700"
        ]
    );
    assert_eq!(settings("replay-guard-relay.service"), service);
    let db = |file: &str| {
        let text = std::fs::read_to_string(shipped(file)).unwrap();
        text.lines()
            .find(|l| l.starts_with("path = "))
            .unwrap()
            .split('"')
            .nth(1)
            .unwrap()
            .to_string()
    };
    assert_eq!(db("systemd/relay.toml"), db("systemd/replay-guard.toml"));
    assert_eq!(
        db("systemd/replay-guard.toml"),
        "/var/lib/replay-guard/replay-guard.redb"
    );
}

#[test]
fn example_config_passes_check_config() {
    assert_check_config_accepts(&shipped("systemd/replay-guard.toml"), ": ok (database");
}

/// The relay's example: the database and the sinks, no [mqtt]. Its exec sink's program is a
/// placeholder, refused until the importer is there.
#[test]
fn example_relay_config_passes_check_config_once_its_program_exists() {
    let relay_toml = shipped("systemd/relay.toml");
    let out = common::run(&["check-config", relay_toml.to_str().unwrap()]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(
        err.contains(
            "[[sink]] \"cop\" command: program \"/usr/local/bin/cop-import\" does not exist: \
             install it or fix `command`"
        ),
        "{err}"
    );
    let dir = tempfile::tempdir().unwrap();
    let with_program = dir.path().join("relay.toml");
    std::fs::write(
        &with_program,
        std::fs::read_to_string(&relay_toml)
            .unwrap()
            .replace("/usr/local/bin/cop-import", "/bin/cat"),
    )
    .unwrap();
    assert_check_config_accepts(
        &with_program,
        ": ok for `relay` (database /var/lib/replay-guard/replay-guard.redb, sinks cop (exec), \
         source urn:replay-guard:replay-guard-eoc-1;",
    );
    // Its CloudEvents source is what `run` would use with the example replay-guard.toml.
    let client_id = std::fs::read_to_string(shipped("systemd/replay-guard.toml"))
        .unwrap()
        .lines()
        .find_map(|l| l.strip_prefix("client_id = \""))
        .and_then(|l| l.split('"').next())
        .unwrap()
        .to_string();
    let relay_text = std::fs::read_to_string(&relay_toml).unwrap();
    assert!(
        relay_text.contains(&format!("source = \"urn:replay-guard:{client_id}\"")),
        "{relay_text}"
    );
}

#[test]
fn check_config_names_the_problem_and_exits_1() {
    let dir = tempfile::tempdir().unwrap();
    for (text, want) in [
        (
            "[store]\npath = \"/tmp/x.redb\"\n",
            "no [mqtt] section (needed by `run`) and no [[sink]] (needed by a standalone `relay`)",
        ),
        (
            "[store]\npath = \"/tmp/x.redb\"\n[mqtt]\nbrokers = [\"http://h\"]\nclient_id = \"c\"\ntopics = [\"t\"]\n",
            "mqtt:// or mqtts://",
        ),
        (
            "[mqtt]\nbrokers = [\"mqtt://h\"]\nclient_id = \"c\"\ntopics = [\"t\"]\n",
            "--db PATH",
        ),
        (
            "[store]\npath = \"/tmp/x.redb\"\n[mqtt]\nbrokers = [\"mqtt://h\"]\nclient_id = \"c\"\ntopics = [\"t\"]\nca_file = \"/nonexistent.pem\"\n",
            "ca_file /nonexistent.pem",
        ),
        ("[mqtt]\nbrokrs = []\n", "unknown field `brokrs`"),
    ] {
        let cfg = dir.path().join("c.toml");
        std::fs::write(&cfg, text).unwrap();
        let out = common::run(&["check-config", cfg.to_str().unwrap()]);
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{text}: {err}");
        assert!(err.contains(want), "{text}: {err}");
        assert_eq!(err.lines().count(), 1, "one-line error: {err}");
    }
}

#[test]
fn a_password_never_appears_in_errors_or_logs() {
    let dir = tempfile::tempdir().unwrap();
    let pass = dir.path().join("pw");
    std::fs::write(&pass, "s3cr3t-Pa55\n").unwrap();
    let cfg = dir.path().join("c.toml");
    // A broker that refuses connections: the service logs reconnect attempts.
    let port = super::broker::free_port();
    std::fs::write(
        &cfg,
        format!(
            "[store]\npath = {:?}\n[mqtt]\nbrokers = [\"mqtt://127.0.0.1:{port}\"]\nclient_id = \"c\"\ntopics = [\"t\"]\nusername = \"u\"\npassword_file = {:?}\nbackoff_initial_ms = 20\nbackoff_max_ms = 40\n",
            dir.path().join("db.redb").to_str().unwrap(),
            pass.to_str().unwrap()
        ),
    )
    .unwrap();
    let log_path = dir.path().join("run.log");
    let mut child = common::logged_command(&["run", "--config", cfg.to_str().unwrap()], &log_path)
        .env("RUST_LOG", "trace")
        .spawn()
        .unwrap();
    // Past a connection attempt, the one that would carry the password.
    common::wait_until(
        "a connection attempt fails",
        std::time::Duration::from_secs(10),
        || {
            let log = common::log_from(&log_path, 0);
            log.contains("connection lost") || log.contains("Connection refused")
        },
    );
    super::broker::signal(child.id() as i32, "TERM");
    child.wait().unwrap();
    let log = common::log_from(&log_path, 0);
    assert!(
        log.contains("connection lost") || log.contains("Connection refused"),
        "{log}"
    );
    assert!(!log.contains("s3cr3t"), "password in the log:\n{log}");
}

#[test]
fn run_notifies_systemd_ready_watchdog_status_and_stopping() {
    use std::os::unix::net::UnixDatagram;
    let dir = tempfile::tempdir().unwrap();
    let broker = super::broker::Broker::start(&dir.path().join("broker"), false);
    let sock_path = dir.path().join("notify.sock");
    let sock = UnixDatagram::bind(&sock_path).unwrap();
    sock.set_read_timeout(Some(std::time::Duration::from_secs(10)))
        .unwrap();
    let cfg = dir.path().join("c.toml");
    std::fs::write(
        &cfg,
        format!(
            "[store]\npath = {:?}\n[mqtt]\nbrokers = [{:?}]\nclient_id = \"rg-notify\"\ntopics = [\"t\"]\n\
             [[sink]]\nname = \"devnull\"\nkind = \"exec\"\ncommand = [\"/bin/true\"]\n",
            dir.path().join("db.redb").to_str().unwrap(),
            broker.url()
        ),
    )
    .unwrap();
    let child = Command::new(common::bin())
        .args(["run", "--config", cfg.to_str().unwrap()])
        .env("NOTIFY_SOCKET", &sock_path)
        .env("WATCHDOG_USEC", "200000")
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let mut got = Vec::new();
    let mut buf = [0u8; 512];
    // Until a ping carries the sink's lag: the first may come before the relay thread has
    // reported its sinks ("sinks: starting").
    while !got
        .iter()
        .any(|m: &String| m.starts_with("WATCHDOG=1") && m.contains("; sinks: devnull"))
    {
        let n = sock.recv(&mut buf).expect("no notification within 10 s");
        got.push(String::from_utf8_lossy(&buf[..n]).into_owned());
    }
    assert!(
        got.iter().all(|m| !m.contains("; sinks: ")
            || m.contains("; sinks: devnull")
            || m.contains("; sinks: starting")),
        "{got:?}"
    );
    assert!(got[0].starts_with("READY=1"), "{got:?}");
    assert!(
        got.iter().any(|m| m.contains("STATUS=applied=0")),
        "{got:?}"
    );
    // The counters are this process's: the line says since when (a restart starts them again).
    assert!(
        got.iter()
            .any(|m| m.contains("STATUS=applied=0") && m.contains(" failovers=0 since 20")),
        "{got:?}"
    );
    // The sinks' lag rides on the same STATUS line.
    assert!(
        got.iter()
            .any(|m| m.starts_with("WATCHDOG=1") && m.contains("; sinks: devnull lag=0")),
        "{got:?}"
    );
    super::broker::signal(child.id() as i32, "TERM");
    while !got.iter().any(|m| m.starts_with("STOPPING=1")) {
        let n = sock.recv(&mut buf).expect("no STOPPING=1");
        got.push(String::from_utf8_lossy(&buf[..n]).into_owned());
    }
    assert_eq!(child.wait_with_output().unwrap().status.code(), Some(0));
}

/// The documented `username` setup (the password as the unit's `mqtt-password` credential)
/// checked from a shell: without systemd's `$CREDENTIALS_DIRECTORY` the error says how to
/// check it, and pointing the variable at the credential's directory passes.
#[test]
fn check_config_of_a_username_outside_systemd_says_how_to_check_the_units_credential() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = dir.path().join("c.toml");
    std::fs::write(
        &cfg,
        "[store]\npath = \"/tmp/x.redb\"\n[mqtt]\nbrokers = [\"mqtt://h\"]\nclient_id = \"c\"\n\
         topics = [\"t\"]\nusername = \"rg\"\n",
    )
    .unwrap();
    let check = |credentials: Option<&Path>| {
        let mut cmd = Command::new(common::bin());
        cmd.args(["check-config", cfg.to_str().unwrap()]);
        match credentials {
            Some(d) => cmd.env("CREDENTIALS_DIRECTORY", d),
            None => cmd.env_remove("CREDENTIALS_DIRECTORY"),
        };
        cmd.output().unwrap()
    };
    let out = check(None);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(
        err.contains("is not set outside systemd")
            && err.contains("CREDENTIALS_DIRECTORY=/etc/replay-guard replay-guard check-config"),
        "{err}"
    );
    assert_eq!(err.lines().count(), 1, "one-line error: {err}");
    std::fs::write(dir.path().join("mqtt-password"), "secret\n").unwrap();
    let out = check(Some(dir.path()));
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}
