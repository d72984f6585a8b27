//! The shipped systemd unit and example config: `systemd-analyze verify` accepts the unit,
//! `systemd-analyze security --offline=true` rates it 2.0 or lower, and `check-config`
//! accepts the example config.

use std::path::PathBuf;
use std::process::Command;

use super::common;

fn unit_for_this_build(dir: &std::path::Path) -> PathBuf {
    // verify checks that ExecStart exists: point it at the binary under test.
    let text = std::fs::read_to_string(
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("systemd/replay-guard.service"),
    )
    .unwrap();
    let unit = dir.join("replay-guard.service");
    std::fs::write(
        &unit,
        text.replace("/usr/bin/replay-guard", common::bin().to_str().unwrap()),
    )
    .unwrap();
    unit
}

#[test]
fn systemd_unit_verifies_and_its_exposure_is_at_most_2() {
    let dir = tempfile::tempdir().unwrap();
    let unit = unit_for_this_build(dir.path());
    // The man pages Documentation= names come with the package (tests/it/deb.rs checks they
    // are in it), not with this checkout.
    let verify = Command::new("systemd-analyze")
        .args(["verify", "--man=no"])
        .arg(&unit)
        .output()
        .expect("systemd-analyze must be installed");
    assert!(
        verify.status.success(),
        "verify: {}",
        String::from_utf8_lossy(&verify.stderr)
    );
    assert!(
        verify.stderr.is_empty(),
        "verify warnings: {}",
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
        .unwrap_or_else(|| panic!("no exposure line:\n{text}"));
    let level: f64 = line
        .split(':')
        .nth(1)
        .and_then(|r| r.split_whitespace().next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("cannot read {line:?}"));
    assert!(level <= 2.0, "exposure {level} > 2.0:\n{text}");
}

#[test]
fn example_config_passes_check_config() {
    let cfg = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("systemd/replay-guard.toml");
    let out = common::run(&["check-config", cfg.to_str().unwrap()]);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(String::from_utf8_lossy(&out.stdout).contains(": ok"));
}

#[test]
fn check_config_names_the_problem_and_exits_1() {
    let dir = tempfile::tempdir().unwrap();
    for (text, want) in [
        ("[store]\npath = \"/tmp/x.redb\"\n", "no [mqtt] section"),
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
    let child = Command::new(common::bin())
        .args(["run", "--config", cfg.to_str().unwrap()])
        .env("RUST_LOG", "trace")
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    std::thread::sleep(std::time::Duration::from_millis(800));
    super::broker::signal(child.id() as i32, "TERM");
    let out = child.wait_with_output().unwrap();
    let log = String::from_utf8_lossy(&out.stderr);
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
    while !got.iter().any(|m: &String| m.starts_with("WATCHDOG=1")) {
        let n = sock.recv(&mut buf).expect("no notification within 10 s");
        got.push(String::from_utf8_lossy(&buf[..n]).into_owned());
    }
    assert!(got[0].starts_with("READY=1"), "{got:?}");
    assert!(
        got.iter().any(|m| m.contains("STATUS=applied=0")),
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
