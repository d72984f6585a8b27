//! Helpers shared by the integration tests.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use replay_guard::store::{Effect, Reader, read};

/// The real binary built by cargo for this test run.
pub fn bin() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_replay-guard"))
}

/// Runs the binary with `args` to completion.
pub fn run(args: &[&str]) -> Output {
    Command::new(bin())
        .args(args)
        .output()
        .expect("spawn replay-guard")
}

/// Runs the binary with `args` and `stdin` bytes to completion.
pub fn run_with_stdin(args: &[&str], stdin: &[u8]) -> Output {
    use std::io::Write;
    use std::process::Stdio;
    let mut child = Command::new(bin())
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn replay-guard");
    let mut sin = child.stdin.take().unwrap();
    sin.write_all(stdin).unwrap();
    drop(sin);
    child.wait_with_output().unwrap()
}

/// Every effect in the database, in offset order, read through a read-only handle.
pub fn effects(db: &Path) -> Vec<Effect> {
    let reader = Reader::open(db).unwrap();
    let txn = reader.begin().unwrap();
    let mut out = Vec::new();
    read::scan_effects::<replay_guard::store::StoreError>(&txn, 0, |e| {
        out.push(e);
        Ok(std::ops::ControlFlow::Continue(()))
    })
    .unwrap();
    out
}

/// One feed-contract message as a JSON line.
pub fn msg(agency: &str, source: &str, epoch: u64, seq: u64, body: &str) -> String {
    format!(
        r#"{{"agency":"{agency}","source_id":"{source}","epoch":{epoch},"sequence":{seq},"body":"{body}"}}"#
    )
}
