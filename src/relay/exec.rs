//! The `exec` sink: runs `command` (argv, no shell) once per batch with the events as JSON
//! lines on stdin. Exit status 0 = the batch is delivered; `EX_DATAERR` (65) = the program
//! refuses the data for good: the events are then offered one at a time, and the one it
//! refuses is parked; anything else (another status, a signal, a timeout, a program that
//! cannot start) = retry the whole batch after a backoff.

use std::process::Stdio;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::process::Command;

use super::{Attempt, CursorAfter, Event, Failure};
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
        match self.attempt(batch).await {
            Outcome::Delivered => Attempt::all(batch.len()),
            Outcome::Retry(e) => Attempt::retry(0, e),
            Outcome::Refused(response) if batch.len() == 1 => self.refused(0, response),
            // Which event? Offer them one at a time, in order.
            Outcome::Refused(_) => {
                for (i, event) in batch.iter().enumerate() {
                    match self.attempt(std::slice::from_ref(event)).await {
                        Outcome::Delivered => {}
                        Outcome::Retry(e) => return Attempt::retry(i, e),
                        Outcome::Refused(response) => return self.refused(i, response),
                    }
                }
                Attempt::all(batch.len())
            }
        }
    }

    fn refused(&self, delivered: usize, response: String) -> Attempt {
        Attempt {
            delivered,
            failure: Some(Failure::Poison {
                reason: format!(
                    "{} refused the event (exit status 65, EX_DATAERR)",
                    self.argv[0]
                ),
                response,
            }),
        }
    }

    async fn attempt(&self, batch: &[Event]) -> Outcome {
        match tokio::time::timeout(self.timeout, self.run(batch)).await {
            Ok(Ok(())) => Outcome::Delivered,
            Ok(Err(Run::Refused(text))) => Outcome::Refused(text),
            Ok(Err(Run::Failed(e))) => Outcome::Retry(e),
            Err(_) => Outcome::Retry(format!(
                "{} did not finish within {} ms (killed)",
                self.argv[0],
                self.timeout.as_millis()
            )),
        }
    }

    async fn run(&self, batch: &[Event]) -> Result<(), Run> {
        let mut child = Command::new(&self.argv[0])
            .args(&self.argv[1..])
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .map_err(|e| Run::Failed(format!("cannot start {}: {e}", self.argv[0])))?;
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
            .map_err(|e| Run::Failed(format!("waiting for {}: {e}", self.argv[0])))?;
        if status.success() {
            return Ok(());
        }
        let text = String::from_utf8_lossy(&err[..err.len().min(STDERR_KEPT)]);
        let text = text.trim();
        if status.code() == Some(EX_DATAERR) {
            return Err(Run::Refused(format!(
                "{status}: {}",
                text.replace('\n', " | ")
            )));
        }
        Err(Run::Failed(format!(
            "{} exited with {status}{}{}",
            self.argv[0],
            if text.is_empty() { "" } else { ": " },
            text.replace('\n', " | ")
        )))
    }
}

/// sysexits.h: "the input data was incorrect in some way".
const EX_DATAERR: i32 = 65;

enum Run {
    Refused(String),
    Failed(String),
}

enum Outcome {
    Delivered,
    Retry(String),
    Refused(String),
}
