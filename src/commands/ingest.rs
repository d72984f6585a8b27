//! `ingest`: decide a captured feed, one payload per line, in batches through the engine.

use std::fs::File;
use std::io::{self, BufRead, BufReader, Read, Write as _};
use std::path::Path;
use std::sync::mpsc::{Receiver, RecvTimeoutError, SyncSender, sync_channel};
use std::time::Instant;

use anyhow::{Context as _, anyhow};

use super::Failure;
use crate::cli::IngestArgs;
use crate::config::Config;
use crate::key::Sha256Stream;
use crate::model::{Outcome, OutcomeCounts};
use crate::store::upstream::{GapCandidates, ReportedGap};
use crate::store::{Backend, Incoming};
use crate::timefmt::now_ms;

/// What an ingest run decided.
#[derive(Debug, Clone, Default)]
pub struct IngestSummary {
    pub counts: OutcomeCounts,
    pub batches: u64,
    pub evicted: u64,
    /// Upstream gaps still missing at the end of the input, and the sequences in them.
    pub gaps: u64,
    pub missing: u64,
    /// Possible upstream gaps: ranges that were missing when a later sequence was applied but
    /// could no longer be checked (the window had evicted the positions around them), and the
    /// sequences in them. Warned, not recorded as losses; `gaps` tells from the audit log.
    pub possible_gaps: u64,
    pub possibly_missing: u64,
}

pub fn run(args: &IngestArgs) -> Result<(), Failure> {
    let mut config = Config::resolve(args.config.as_deref(), args.db.as_deref())?;
    config.store.new_database = args.new_database;
    config.location()?;
    let input: Box<dyn Read + Send> = if args.input == Path::new("-") {
        Box::new(io::stdin())
    } else {
        if args.input.is_dir() {
            return Err(Failure::Usage(anyhow!(
                "{} is a directory, not a feed file",
                args.input.display()
            )));
        }
        let file = File::open(&args.input)
            .with_context(|| format!("cannot read {}", args.input.display()))
            .map_err(Failure::Usage)?;
        Box::new(file)
    };
    let (db, summary) = {
        let (db, mut store) = crate::service::open_store(&config)?;
        // Before the first commit (see `relay::declare_sinks`).
        crate::relay::declare_sinks(&mut store, &config)?;
        let summary = ingest(&mut store, &config, &args.topic, BufReader::new(input))?;
        // The store closes here, before anything is printed: a failing stderr cannot leave
        // the file needing recovery, and a file too damaged to close says so.
        store.close()?;
        (db, summary)
    };
    let mut err = io::stderr().lock();
    let _ = writeln!(
        err,
        "replay-guard ingest: {} messages decided in {} batches into {}",
        summary.counts.total(),
        summary.batches,
        db.display()
    );
    for &o in Outcome::DECIDED {
        let _ = writeln!(err, "  {:<13}{:>10}", o.as_str(), summary.counts.get(o));
    }
    if summary.gaps > 0 {
        let _ = writeln!(
            err,
            "  upstream gaps {} ({} sequences missing: see the warnings above, or `gaps`)",
            summary.gaps, summary.missing
        );
    }
    if summary.possible_gaps > 0 {
        let _ = writeln!(
            err,
            "  possible upstream gaps {} ({} sequences the window no longer held when checked: \
             see the warnings above, and `gaps`, which tells from the audit log)",
            summary.possible_gaps, summary.possibly_missing
        );
    }
    Ok(())
}

/// Reads one payload per line (blank lines skipped, `\r\n` accepted) and decides them in
/// batches: a batch commits when it holds `config.max_batch` messages, when `config.linger`
/// has passed since its first message, or at end of input. Every line is decided; a malformed
/// one is a decision. A reader thread decodes ahead while this thread commits (fsyncs).
///
/// A line longer than `max_payload_bytes` is never held whole in memory: its first
/// `max_payload_bytes` are kept and it is quarantined as `malformed` with its length and
/// SHA-256.
///
/// On a commit error this returns at once; the reader thread is not joined (it may be blocked
/// on an idle input) and ends when its next send fails or the process exits.
pub fn ingest(
    store: &mut Backend,
    config: &Config,
    topic: &str,
    input: impl BufRead + Send + 'static,
) -> Result<IngestSummary, Failure> {
    let (tx, rx) = sync_channel::<io::Result<Incoming>>(config.max_batch.saturating_mul(2));
    let reader_config = config.clone();
    let reader_topic = topic.to_string();
    std::thread::Builder::new()
        .name("ingest-reader".into())
        .spawn(move || read_lines(input, &reader_config, &reader_topic, &tx))
        .context("cannot start the reader thread")
        .map_err(Failure::Runtime)?;
    commit_loop(store, config, &rx)
}

fn commit_loop(
    store: &mut Backend,
    config: &Config,
    rx: &Receiver<io::Result<Incoming>>,
) -> Result<IngestSummary, Failure> {
    let read_err =
        |e: io::Error| Failure::Runtime(anyhow::Error::new(e).context("cannot read input"));
    let mut summary = IngestSummary::default();
    let mut candidates = GapCandidates::default();
    // Gap candidates wait for what arrives later in the input to fill them, but only while
    // the window still holds the positions around them: each is checked once half the
    // window's entry bound has been decided after the batch that revealed it (the window
    // evicts oldest first, so its neighbours are still there), or at the end of the input.
    // Times are messages decided.
    let hold = config.store.window.max_entries / 2;
    let mut decided: u64 = 0;
    let bar = crate::progress::Progress::counter("ingesting", "messages");
    while let Ok(first) = rx.recv() {
        let mut batch = vec![first.map_err(read_err)?];
        let deadline = Instant::now() + config.linger;
        let mut ended = false;
        while batch.len() < config.max_batch {
            match rx.recv_timeout(deadline.saturating_duration_since(Instant::now())) {
                Ok(item) => batch.push(item.map_err(read_err)?),
                Err(RecvTimeoutError::Timeout) => break,
                Err(RecvTimeoutError::Disconnected) => {
                    ended = true;
                    break;
                }
            }
        }
        let mut report = store.commit_batch(&batch, now_ms())?;
        decided += batch.len() as u64;
        // Never more than `upstream::MAX_CANDIDATES` of them.
        candidates.add(
            std::mem::take(&mut report.gaps),
            decided.saturating_add(hold),
        );
        confirm(store, candidates.take_due(decided), &mut summary)?;
        summary.counts.merge(&report.counts);
        summary.evicted += report.evicted;
        summary.batches += 1;
        bar.inc(batch.len() as u64);
        if ended {
            break;
        }
    }
    confirm(store, candidates.take_all(), &mut summary)?;
    Ok(summary)
}

/// Confirms gap candidates (one transaction), warns and counts what is still missing, and
/// counts what could no longer be checked (`confirm_gaps` warned those).
fn confirm(
    store: &mut Backend,
    candidates: Vec<ReportedGap>,
    summary: &mut IngestSummary,
) -> Result<(), Failure> {
    let sequences =
        |gaps: &[ReportedGap]| crate::decide::total_missing(gaps.iter().map(|g| g.gap.missing()));
    let check = store.confirm_gaps(&candidates, now_ms())?;
    crate::service::warn_gaps(&check.missing);
    summary.gaps += check.missing.len() as u64;
    summary.missing = summary.missing.saturating_add(sequences(&check.missing));
    summary.possible_gaps += check.unknown.len() as u64;
    summary.possibly_missing = summary
        .possibly_missing
        .saturating_add(sequences(&check.unknown));
    Ok(())
}

/// Decodes each line and sends it on; stops at end of input, on a read error (sent on), or
/// when the committer has gone.
fn read_lines(
    mut input: impl BufRead,
    config: &Config,
    topic: &str,
    tx: &SyncSender<io::Result<Incoming>>,
) {
    let limit = config.feed.max_payload_bytes;
    let mut line = Vec::new();
    loop {
        line.clear();
        let read = match read_line_capped(&mut input, limit, &mut line) {
            Err(e) => {
                let _ = tx.send(Err(e));
                return;
            }
            Ok(None) => return,
            Ok(Some(read)) => read,
        };
        let incoming = match read {
            Line::Whole => {
                while line.last() == Some(&b'\r') {
                    line.pop();
                }
                if line.iter().all(|b| matches!(b, b' ' | b'\t')) {
                    continue;
                }
                // A copy of exactly the line's length; `line` keeps its capacity for the next.
                Incoming::decode(topic, line.clone(), now_ms(), &config.feed)
            }
            Line::Oversized { size, sha256 } => Incoming::oversized(
                topic,
                std::mem::take(&mut line),
                size,
                sha256,
                now_ms(),
                limit,
            ),
        };
        if tx.send(Ok(incoming)).is_err() {
            return;
        }
    }
}

/// How a line was read by `read_line_capped`.
#[derive(Debug, PartialEq, Eq)]
enum Line {
    /// All of it is in the buffer (without the `\n`).
    Whole,
    /// Longer than the cap: the buffer holds the first `cap` bytes; `size` and `sha256` are of
    /// the whole line (without the `\n`).
    Oversized { size: usize, sha256: [u8; 32] },
}

/// Reads up to the next `\n` without ever buffering more than `cap` bytes of it. A `\r`
/// right before the `\n` is not part of the line. `Ok(None)` at end of input.
fn read_line_capped(
    input: &mut impl BufRead,
    cap: usize,
    buf: &mut Vec<u8>,
) -> io::Result<Option<Line>> {
    let mut size = 0usize;
    // Set once the line outgrows `cap`: hashes everything but the newest byte, which is held
    // back until we know whether it is the `\r` of a `\r\n`.
    let mut hash: Option<(Sha256Stream, Option<u8>)> = None;
    let mut saw_any = false;
    loop {
        let chunk = match input.fill_buf() {
            Ok(c) => c,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        };
        if chunk.is_empty() {
            break;
        }
        saw_any = true;
        let (part, done) = match chunk.iter().position(|&b| b == b'\n') {
            Some(i) => (&chunk[..i], Some(i + 1)),
            None => (chunk, None),
        };
        let room = cap.saturating_sub(buf.len());
        buf.extend_from_slice(&part[..part.len().min(room)]);
        if size + part.len() > cap {
            let (h, held) = hash.get_or_insert_with(|| {
                // First overflow: `buf` holds exactly the line's first `cap` bytes.
                let mut h = Sha256Stream::default();
                let held = buf.last().copied();
                h.update(&buf[..buf.len().saturating_sub(1)]);
                (h, held)
            });
            let rest = if size < cap {
                &part[room.min(part.len())..]
            } else {
                part
            };
            if let Some((&last, body)) = rest.split_last() {
                if let Some(b) = held.take() {
                    h.update(&[b]);
                }
                h.update(body);
                *held = Some(last);
            }
        }
        size += part.len();
        let consumed = done.unwrap_or(chunk.len());
        input.consume(consumed);
        if done.is_some() {
            break;
        }
    }
    if !saw_any {
        return Ok(None);
    }
    Ok(Some(match hash {
        None => Line::Whole,
        Some((mut h, held)) => {
            match held {
                Some(b'\r') => size -= 1,
                Some(b) => h.update(&[b]),
                None => {}
            }
            if size <= cap {
                Line::Whole
            } else {
                Line::Oversized {
                    size,
                    sha256: h.finish(),
                }
            }
        }
    }))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::key::sha256;

    fn lines(input: &[u8], cap: usize, chunk: usize) -> Vec<(Vec<u8>, Line)> {
        let mut r = BufReader::with_capacity(chunk, input);
        let mut out = Vec::new();
        let mut buf = Vec::new();
        while let Some(l) = read_line_capped(&mut r, cap, &mut buf).unwrap() {
            out.push((std::mem::take(&mut buf), l));
        }
        out
    }

    #[test]
    fn lines_within_the_cap_are_read_whole_whatever_the_buffer_size() {
        for chunk in [1, 3, 64] {
            let got = lines(b"ab\n\ncdef\ngh", 4, chunk);
            let want = vec![
                (b"ab".to_vec(), Line::Whole),
                (vec![], Line::Whole),
                (b"cdef".to_vec(), Line::Whole),
                (b"gh".to_vec(), Line::Whole),
            ];
            assert_eq!(got, want, "chunk {chunk}");
        }
    }

    #[test]
    fn an_oversized_line_keeps_its_prefix_and_hashes_all_of_it() {
        let long = b"0123456789abcdef".repeat(10);
        let mut input = long.clone();
        input.extend_from_slice(b"\nnext\n");
        for chunk in [1, 7, 16, 1024] {
            let got = lines(&input, 10, chunk);
            assert_eq!(got.len(), 2, "chunk {chunk}");
            assert_eq!(got[0].0, long[..10].to_vec());
            assert_eq!(
                got[0].1,
                Line::Oversized {
                    size: 160,
                    sha256: sha256(&[&long])
                }
            );
            assert_eq!(got[1], (b"next".to_vec(), Line::Whole));
            // The same line ending in \r\n: the \r is not part of it.
            let mut crlf = long.clone();
            crlf.extend_from_slice(b"\r\n");
            let got = lines(&crlf, 10, chunk);
            assert_eq!(
                got[0].1,
                Line::Oversized {
                    size: 160,
                    sha256: sha256(&[&long])
                },
                "chunk {chunk}"
            );
            // One byte over the cap only because of the \r: not oversized.
            let got = lines(b"0123456789\r\n", 10, chunk);
            assert_eq!(
                got,
                vec![(b"0123456789".to_vec(), Line::Whole)],
                "chunk {chunk}"
            );
        }
    }
}
