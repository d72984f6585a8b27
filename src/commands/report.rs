//! `report`: the after-action report of a store, as one self-contained HTML page or its JSON
//! twin (`src/report/`), written to a file or stdout. Reads only: one read snapshot.

use std::io::Write as _;
use std::path::Path;

use anyhow::anyhow;

use super::Failure;
use crate::cli::{ReportArgs, ReportFormat};
use crate::report::{self, Options, shell_quote};
use crate::textsafe::escape_json;
use crate::timefmt::{Zone, now_ms};

pub fn run(args: &ReportArgs) -> Result<(), Failure> {
    let now = now_ms();
    let resolve = |flag: &str, spec: &Option<crate::timefmt::TimeSpec>| {
        spec.as_ref()
            .map(|s| {
                s.resolve(now, args.tz.as_ref())
                    .map_err(|why| Failure::Usage(anyhow!("{flag} {s}: {why}")))
            })
            .transpose()
    };
    let since_ms = resolve("--since", &args.since)?;
    let until_ms = resolve("--until", &args.until)?;
    if let (Some(s), Some(u)) = (since_ms, until_ms)
        && s >= u
    {
        return Err(Failure::Usage(anyhow!(
            "--since must be before --until: the range is empty"
        )));
    }
    let config = super::config(&args.db)?;
    let (name, snapshot) = super::open_snapshot(&config)?;
    let verified = super::verify::checked(&snapshot, &config.feed, "verifying")?;
    let violation = verified.violation.clone();
    let mut locator = Vec::new();
    if let Some(c) = &args.db.config {
        locator.push(format!(
            "--config {}",
            shell_quote(&c.display().to_string())
        ));
    }
    if let Some(d) = &args.db.db {
        locator.push(format!("--db {}", shell_quote(&d.display().to_string())));
    }
    let options = Options {
        since_ms,
        until_ms,
        sources: args
            .source
            .iter()
            .map(|s| (s.agency.clone(), s.source_id.clone()))
            .collect(),
        made_at_ms: now,
        store_name: name.display().to_string(),
        locator: locator.join(" "),
        zone: args.tz.clone().unwrap_or_else(Zone::utc),
    };
    let total = crate::store::verify::entries_to_verify(&snapshot)?;
    let bar = crate::progress::Progress::bar("reporting", total, "audit entries");
    let report = report::gather(&snapshot, &config, verified, options, &mut |n| bar.inc(n))?;
    drop(bar);
    drop(snapshot);
    let text = match args.format {
        ReportFormat::Html => report::html::page(&report),
        ReportFormat::Json => {
            escape_json(&report::json::report(&report).to_compact()).into_owned() + "\n"
        }
    };
    write(&args.output, text.as_bytes())?;
    match violation {
        None => Ok(()),
        Some(v) => Err(Failure::Violation(anyhow!(
            "{}: verification failed: {v} (the report, written to {}, says so at the top)",
            name.display(),
            args.output.display()
        ))),
    }
}

/// Writes the report to `path` (`-`: stdout), replacing a file there only once it is whole
/// (written beside it, then renamed).
fn write(path: &Path, bytes: &[u8]) -> Result<(), Failure> {
    if path == Path::new("-") {
        let mut out = crate::output::stdout();
        out.write_all(bytes).and_then(|()| out.flush())?;
        return Ok(());
    }
    let mut partial = path.as_os_str().to_owned();
    partial.push(".partial");
    let partial = std::path::PathBuf::from(partial);
    let written = std::fs::write(&partial, bytes).and_then(|()| std::fs::rename(&partial, path));
    if let Err(e) = written {
        let _ = std::fs::remove_file(&partial);
        return Err(Failure::Runtime(
            anyhow::Error::new(e).context(format!("cannot write {}", path.display())),
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_report_replaces_its_file_only_once_whole() {
        let dir = tempfile::tempdir().unwrap();
        let out = dir.path().join("r.html");
        std::fs::write(&out, "old").unwrap();
        write(&out, b"new").unwrap();
        assert_eq!(std::fs::read_to_string(&out).unwrap(), "new");
        assert!(!dir.path().join("r.html.partial").exists());
        let missing = dir.path().join("no/such/dir/r.html");
        let e = write(&missing, b"x").unwrap_err();
        assert!(
            format!("{:#}", e.error()).contains("cannot write"),
            "{:?}",
            e.error()
        );
    }
}
