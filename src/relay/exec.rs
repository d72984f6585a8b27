//! The `exec` sink: runs `command` (argv, no shell) once per batch with the events as JSON
//! lines on stdin. Exit status 0 = the batch is delivered; `EX_DATAERR` (65) = the program
//! refuses the data for good: the events are then offered one at a time, and the one it
//! refuses is parked (unless the next event of another source is refused too: the program
//! refuses the feed, and the sink blocks at the first; `state::SinkState`); anything else (another status, a signal, a timeout, a program that
//! cannot start) = retry the whole batch after a backoff.
//!
//! The program's own exit status decides, never its pipes: stderr is read to its end (a
//! program writing much there is never blocked by a full pipe), and once the program has
//! exited its pipes get `PIPE_GRACE`, then are let go, so a background child that inherited
//! them cannot turn a finished program into a timeout. The stderr text kept (the response of
//! a parked event, the sink's last error, the log line) is its first `STDERR_SHOWN`
//! characters made terminal-safe (`textsafe`), with how many bytes were left out.

use std::process::Stdio;
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWriteExt};
use tokio::process::Command;

use super::{Attempt, CursorAfter, Event, Failure};
use crate::config::ExecSink as ExecConfig;
use crate::textsafe;

/// Characters of the program's stderr shown (escaped), so that the whole message fits the
/// 1024 characters a sink's last error keeps.
const STDERR_SHOWN: usize = 800;
/// Bytes of stderr held to show `STDERR_SHOWN` characters (a character is at most 4 bytes);
/// the rest is read, counted and discarded.
const STDERR_KEPT: usize = 4 * STDERR_SHOWN;
/// How long the pipes are still read after the program exited: what it wrote before exiting
/// is in the pipe already; only a child holding them open keeps them from ending.
const PIPE_GRACE: Duration = Duration::from_millis(200);

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
            // Classed: parked, unless the next event of another source is refused too,
            // which blocks the sink (a program refusing the feed, not one event).
            failure: Some(Failure::Refused {
                class: "exit status 65".into(),
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
        let stderr = child.stderr.take();
        let mut err = Stderr::default();
        let status = {
            let write = async {
                if let Some(s) = stdin.as_mut() {
                    // A program that exits without reading everything closes the pipe: its
                    // exit status decides, not the broken pipe.
                    let _ = s.write_all(input.as_bytes()).await;
                    let _ = s.shutdown().await;
                }
                drop(stdin.take());
            };
            let pipes = async { tokio::join!(write, err.drain(stderr)) };
            tokio::pin!(pipes);
            let (status, pipes_done) = tokio::select! {
                status = child.wait() => (status, false),
                _ = &mut pipes => (child.wait().await, true),
            };
            if !pipes_done {
                // Ended by the deadline or not, the pipes' future is dropped here: a child
                // still holding them only gets a broken pipe.
                let _ = tokio::time::timeout(PIPE_GRACE, &mut pipes).await;
            }
            status.map_err(|e| Run::Failed(format!("waiting for {}: {e}", self.argv[0])))?
        };
        if status.success() {
            return Ok(());
        }
        let text = err.text();
        if status.code() == Some(EX_DATAERR) {
            return Err(Run::Refused(format!("{status}{text}")));
        }
        Err(Run::Failed(format!(
            "{} exited with {status}{text}",
            self.argv[0]
        )))
    }
}

/// What the program wrote to stderr: its first `STDERR_KEPT` bytes and how many there were.
#[derive(Default)]
struct Stderr {
    kept: Vec<u8>,
    total: usize,
}

impl Stderr {
    /// Reads `pipe` to its end (or a read error), keeping the head; the rest is counted only,
    /// so the program is never blocked on a full pipe and memory stays bounded.
    async fn drain(&mut self, pipe: Option<impl AsyncRead + Unpin>) {
        let Some(mut pipe) = pipe else { return };
        let mut buf = [0u8; 8192];
        loop {
            match pipe.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(n) => {
                    let room = STDERR_KEPT.saturating_sub(self.kept.len());
                    self.kept.extend_from_slice(&buf[..n.min(room)]);
                    self.total = self.total.saturating_add(n);
                }
            }
        }
    }

    /// `""`, `": TEXT"`, or `" (stderr: first N bytes shown, M more dropped): TEXT"`:
    /// leading and trailing white space left out, the rest escaped (a newline shows as `\n`).
    fn text(&self) -> String {
        let start = self
            .kept
            .iter()
            .position(|b| !b.is_ascii_whitespace())
            .unwrap_or(self.kept.len());
        let all_kept = self.kept.len() == self.total;
        // Trailing white space is trimmed only when it is the end of the output.
        let end = if all_kept {
            self.kept
                .iter()
                .rposition(|b| !b.is_ascii_whitespace())
                .map_or(start, |i| i + 1)
        } else {
            self.kept.len()
        };
        let body = self.kept.get(start..end).unwrap_or_default();
        let (shown, n) = textsafe::printable_prefix(body, STDERR_SHOWN);
        let covered = start + n;
        // Every byte is shown, or trimmed white space at either end, or counted as dropped.
        let dropped = if all_kept && n == body.len() {
            0
        } else {
            self.total.saturating_sub(covered)
        };
        if dropped == 0 {
            return if shown.is_empty() {
                String::new()
            } else {
                format!(": {shown}")
            };
        }
        format!(" (stderr: first {covered} bytes shown, {dropped} more dropped): {shown}")
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

#[cfg(test)]
mod tests {
    use super::*;

    fn stderr(bytes: &[u8], total: usize) -> Stderr {
        Stderr {
            kept: bytes[..bytes.len().min(STDERR_KEPT)].to_vec(),
            total,
        }
    }

    #[test]
    fn short_stderr_is_shown_whole_trimmed_and_escaped() {
        assert_eq!(stderr(b"", 0).text(), "");
        assert_eq!(stderr(b" \n\n", 3).text(), "");
        assert_eq!(
            stderr(b"  unit E13\nunknown\x1b[0m\n", 23).text(),
            ": unit E13\\nunknown\\u001b[0m"
        );
    }

    #[test]
    fn long_stderr_shows_its_head_and_counts_every_other_byte() {
        let big = vec![b'e'; 300_000];
        assert_eq!(
            stderr(&big, big.len()).text(),
            format!(
                " (stderr: first 800 bytes shown, 299200 more dropped): {}",
                "e".repeat(800)
            )
        );
        // All kept, but escapes make it longer than the characters shown.
        let bells = vec![7u8; 200];
        let text = stderr(&bells, 200).text();
        assert_eq!(
            text,
            format!(
                " (stderr: first 133 bytes shown, 67 more dropped): {}",
                "\\u0007".repeat(133)
            )
        );
        // Trailing white space past the kept head is not known to be the end: it counts.
        let mut tail = vec![b'x'; 10];
        tail.extend_from_slice(&[b' '; 5000]);
        assert_eq!(
            stderr(&tail, tail.len()).text(),
            format!(
                " (stderr: first 800 bytes shown, 4210 more dropped): {}{}",
                "x".repeat(10),
                " ".repeat(790)
            )
        );
    }
}
