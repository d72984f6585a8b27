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
    let input: Box<dyn Read> = if args.input == Path::new("-") {
        Box::new(io::stdin().lock())
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
pub fn ingest(
    store: &mut Store,
    config: &Config,
    topic: &str,
    mut input: impl BufRead,
) -> Result<IngestSummary, Failure> {
    let mut summary = IngestSummary::default();
    let mut batch: Vec<Incoming> = Vec::with_capacity(config.max_batch);
    let mut line = Vec::new();
    loop {
        line.clear();
        let n = input
            .read_until(b'\n', &mut line)
            .context("cannot read input")
            .map_err(Failure::Runtime)?;
        if n == 0 {
            break;
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
            commit(store, &mut batch, &mut summary)?;
        }
    }
    if !batch.is_empty() {
        commit(store, &mut batch, &mut summary)?;
    }
    Ok(summary)
}

fn commit(
    store: &mut Store,
    batch: &mut Vec<Incoming>,
    summary: &mut IngestSummary,
) -> Result<(), Failure> {
    let report = store.commit_batch(batch, now_ms())?;
    summary.counts.merge(&report.counts);
    summary.evicted += report.evicted;
    summary.batches += 1;
    batch.clear();
    Ok(())
}
