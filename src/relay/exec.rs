//! The `exec` sink: runs `command` (argv, no shell) once per batch with the events as JSON
//! lines on stdin. Exit status 0 = the batch is delivered; anything else (a non-zero status,
//! a signal, a timeout, a program that cannot start) = retry the whole batch after a backoff.

use std::process::Stdio;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::process::Command;

use super::{Attempt, CursorAfter, Event};
use crate::config::ExecSink as ExecConfig;

/// Most bytes of the program's stderr kept for `relay status`.
const STDERR_KEPT: usize = 2048;

pub struct ExecSink {
    argv: Vec<String>,
    timeout: Duration,
}

impl ExecSink {
    pub fn new(cfg: &ExecConfig, timeout: Duration) -> ExecSink {
        ExecSink {
            argv: cfg.command.clone(),
            timeout,
        }
    }

    pub async fn deliver(&mut self, batch: &[Event], _cursor: CursorAfter) -> Attempt {
        match tokio::time::timeout(self.timeout, self.run(batch)).await {
            Ok(Ok(())) => Attempt::all(batch.len()),
            Ok(Err(e)) => Attempt::retry(0, e),
            Err(_) => Attempt::retry(
                0,
                format!(
                    "{} did not finish within {} ms (killed)",
                    self.argv[0],
                    self.timeout.as_millis()
                ),
            ),
        }
    }

    async fn run(&self, batch: &[Event]) -> Result<(), String> {
        let mut child = Command::new(&self.argv[0])
            .args(&self.argv[1..])
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .map_err(|e| format!("cannot start {}: {e}", self.argv[0]))?;
        let mut input = String::with_capacity(batch.iter().map(|e| e.json.len() + 1).sum());
        for e in batch {
            input.push_str(&e.json);
            input.push('\n');
        }
        let mut stdin = child.stdin.take();
        let mut stderr = child.stderr.take();
        let write = async {
            if let Some(s) = stdin.as_mut() {
                // A program that exits without reading everything closes the pipe: its exit
                // status decides, not the broken pipe.
                let _ = s.write_all(input.as_bytes()).await;
                let _ = s.shutdown().await;
            }
            drop(stdin.take());
        };
        let read = async {
            let mut buf = Vec::new();
            if let Some(s) = stderr.as_mut() {
                let _ = s.take(64 * 1024).read_to_end(&mut buf).await;
            }
            buf
        };
        let ((), err) = tokio::join!(write, read);
        let status = child
            .wait()
            .await
            .map_err(|e| format!("waiting for {}: {e}", self.argv[0]))?;
        if status.success() {
            return Ok(());
        }
        let text = String::from_utf8_lossy(&err[..err.len().min(STDERR_KEPT)]);
        let text = text.trim();
        Err(format!(
            "{} exited with {status}{}{}",
            self.argv[0],
            if text.is_empty() { "" } else { ": " },
            text.replace('\n', " | ")
        ))
    }
}
