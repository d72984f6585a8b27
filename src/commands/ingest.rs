//! `ingest`: decide a captured feed, one payload per line, in batches through the engine.

use std::fs::File;
use std::io::{self, BufRead, BufReader, Read};
use std::path::Path;

use anyhow::Context as _;

use super::Failure;
use crate::cli::IngestArgs;
use crate::config::Config;
use crate::model::{Outcome, OutcomeCounts};
use crate::store::{Incoming, Store};
use crate::timefmt::now_ms;

/// What an ingest run decided.
#[derive(Debug, Clone, Default)]
pub struct IngestSummary {
    pub counts: OutcomeCounts,
    pub batches: u64,
    pub evicted: u64,
}

pub fn run(args: &IngestArgs) -> Result<(), Failure> {
    let config = Config::resolve(args.config.as_deref(), args.db.as_deref())?;
    let db = config.require_db()?.to_path_buf();
    let input: Box<dyn Read + Send> = if args.input == Path::new("-") {
        Box::new(io::stdin())
    } else {
        Box::new(
            File::open(&args.input)
                .with_context(|| format!("cannot read {}", args.input.display()))
                .map_err(Failure::Usage)?,
        )
    };
    let mut store = Store::open(&db, config.store.clone())?;
    let summary = ingest(&mut store, &config, &args.topic, BufReader::new(input))?;
    eprintln!(
        "replay-guard ingest: {} messages decided in {} batches into {}",
        summary.counts.total(),
        summary.batches,
        db.display()
    );
    for o in Outcome::ALL {
        eprintln!("  {:<13}{:>10}", o.as_str(), summary.counts.get(o));
    }
    Ok(())
}

/// Reads one payload per line (blank lines skipped, `\r\n` accepted) and commits them in
/// batches of `config.max_batch`. Every line is decided; a malformed one is a decision.
/// A reader thread parses and decodes the next batch while this thread commits (fsyncs) the
/// current one.
pub fn ingest(
    store: &mut Store,
    config: &Config,
    topic: &str,
    input: impl BufRead + Send,
) -> Result<IngestSummary, Failure> {
    let mut summary = IngestSummary::default();
    std::thread::scope(|scope| {
        let (tx, rx) = std::sync::mpsc::sync_channel::<io::Result<Vec<Incoming>>>(2);
        scope.spawn(move || read_batches(input, config, topic, &tx));
        for batch in rx {
            let batch = batch
                .context("cannot read input")
                .map_err(Failure::Runtime)?;
            let report = store.commit_batch(&batch, now_ms())?;
            summary.counts.merge(&report.counts);
            summary.evicted += report.evicted;
            summary.batches += 1;
        }
        Ok(summary)
    })
}

/// Splits `input` into decoded batches; stops early if the committer hung up.
fn read_batches(
    mut input: impl BufRead,
    config: &Config,
    topic: &str,
    tx: &std::sync::mpsc::SyncSender<io::Result<Vec<Incoming>>>,
) {
    let mut batch = Vec::with_capacity(config.max_batch);
    let mut line = Vec::new();
    loop {
        line.clear();
        match input.read_until(b'\n', &mut line) {
            Err(e) => {
                let _ = tx.send(Err(e));
                return;
            }
            Ok(0) => break,
            Ok(_) => {}
        }
        while matches!(line.last(), Some(b'\n' | b'\r')) {
            line.pop();
        }
        if line.iter().all(|b| matches!(b, b' ' | b'\t' | b'\r')) {
            continue;
        }
        batch.push(Incoming::decode(
            topic,
            line.clone(),
            now_ms(),
            &config.feed,
        ));
        if batch.len() >= config.max_batch {
            let full = std::mem::replace(&mut batch, Vec::with_capacity(config.max_batch));
            if tx.send(Ok(full)).is_err() {
                return;
            }
        }
    }
    if !batch.is_empty() {
        let _ = tx.send(Ok(batch));
    }
}
