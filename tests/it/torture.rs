//! Short versions of the torture runs (scripts/torture-*.py, full figures in the README): the
//! scripts themselves run against the binary under test with small counts, so they cannot rot.
//! Repeated live broker failovers with a resending field app; kill -9 of `run` mid-surge; disk
//! full (a small loop-mounted ext4) and EIO (a fault-injecting FUSE file system) mid-surge. The
//! disk test needs root and Debian's python3-fusepy (scripts/test.sh installs it).

use std::path::{Path, PathBuf};
use std::process::Command;

use super::common;

fn script(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("scripts")
        .join(name)
}

/// Runs a torture script on the binary under test inside its own temp dir; returns stdout
/// after asserting exit 0.
fn torture(name: &str, args: &[&str]) -> String {
    let dir = tempfile::tempdir().unwrap();
    let out = Command::new("python3")
        .arg(script(name))
        .args(args)
        .env("RG_BIN", common::bin())
        .env("TMPDIR", dir.path())
        .env_remove("TORTURE_KEEP")
        .output()
        .expect("python3 must be installed");
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "{name} {args:?} exited {}:\n{stdout}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    stdout
}

#[test]
fn three_live_failovers_with_a_resending_field_app_apply_every_event_exactly_once() {
    let out = torture("torture-failover.py", &["--failovers", "3", "--seed", "3"]);
    assert!(out.contains("torture-failover: 3 live failovers"), "{out}");
    assert!(
        out.contains("every event applied exactly once, nothing quarantined"),
        "{out}"
    );
}

#[test]
fn run_killed_eight_times_mid_surge_by_the_torture_script_applies_every_event_once() {
    let out = torture("torture-kill.py", &["run", "--kills", "8", "--rate", "500"]);
    assert!(
        out.contains("torture-kill run: 8 kill -9 of run (MQTT v5)"),
        "{out}"
    );
    assert!(
        out.contains("every event applied exactly once, none lost"),
        "{out}"
    );
}

#[test]
fn disk_full_and_eio_mid_surge_exit_2_acknowledge_nothing_uncommitted_and_converge() {
    let out = torture(
        "torture-disk.py",
        &["all", "--rounds", "2", "--rate", "500"],
    );
    for part in ["full", "eio", "lose"] {
        assert!(
            out.contains(&format!("torture-disk {part}: 2 faults mid-surge")),
            "{out}"
        );
    }
    assert_eq!(
        out.matches("every event applied exactly once").count(),
        3,
        "{out}"
    );
}
