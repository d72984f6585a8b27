//! Progress on long operator work (`verify`, `backup`, `compact`, `ingest`, `migrate`): a bar
//! or a counter on stderr while stderr is a terminal, nothing at all otherwise (a pipe, a log
//! file, the journal, a test), so scripted output never changes. The only module naming
//! indicatif.

use std::io::IsTerminal as _;
use std::time::Duration;

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};

/// One piece of long work's progress; a no-op when stderr is not a terminal.
pub struct Progress(Option<ProgressBar>);

impl Progress {
    /// Work of `total` units (`unit`: what is counted, e.g. "audit entries").
    pub fn bar(what: &str, total: u64, unit: &str) -> Progress {
        Progress::shown(|| {
            let style = ProgressStyle::with_template(&format!(
                "{what} [{{bar:30}}] {{human_pos}}/{{human_len}} {unit} ({{eta}} left)"
            ))
            .unwrap_or_else(|_| ProgressStyle::default_bar())
            .progress_chars("=> ");
            ProgressBar::with_draw_target(Some(total), ProgressDrawTarget::stderr())
                .with_style(style)
        })
    }

    /// Work whose size is not known ahead: a running count of `unit`.
    pub fn counter(what: &str, unit: &str) -> Progress {
        Progress::shown(|| {
            let style = ProgressStyle::with_template(&format!(
                "{{spinner}} {what}: {{human_pos}} {unit} ({{elapsed}})"
            ))
            .unwrap_or_else(|_| ProgressStyle::default_spinner());
            let bar =
                ProgressBar::with_draw_target(None, ProgressDrawTarget::stderr()).with_style(style);
            bar.enable_steady_tick(Duration::from_millis(200));
            bar
        })
    }

    /// One step whose progress cannot be counted (redb's compaction): a ticking spinner.
    pub fn step(what: &str) -> Progress {
        Progress::shown(|| {
            let style = ProgressStyle::with_template(&format!("{{spinner}} {what} ({{elapsed}})"))
                .unwrap_or_else(|_| ProgressStyle::default_spinner());
            let bar =
                ProgressBar::with_draw_target(None, ProgressDrawTarget::stderr()).with_style(style);
            bar.enable_steady_tick(Duration::from_millis(200));
            bar
        })
    }

    fn shown(make: impl FnOnce() -> ProgressBar) -> Progress {
        Progress(std::io::stderr().is_terminal().then(make))
    }

    /// `n` more units done.
    pub fn inc(&self, n: u64) {
        if let Some(b) = &self.0 {
            b.inc(n);
        }
    }
}

impl Drop for Progress {
    /// Done or failed: the bar goes, so the command's own result line stands alone.
    fn drop(&mut self) {
        if let Some(b) = &self.0 {
            b.finish_and_clear();
        }
    }
}
