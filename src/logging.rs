//! Where the logs go. Started by systemd with stderr connected to the journal
//! (`JOURNAL_STREAM` names stderr's device and inode), events go to the journal in its native
//! protocol: each with its priority (error 3, warning 4, info 5), so `journalctl -p warning`
//! finds the warnings, and its fields as journal fields (`KEY`, `TOPIC`, `OUTCOME`,
//! `BROKER`, …), so `journalctl OUTCOME=conflict` finds them. Otherwise stderr, as text or
//! JSON lines, coloured only on a terminal and never with `NO_COLOR` set. The only module that
//! names tracing-journald.

use std::io::IsTerminal as _;

use tracing_subscriber::EnvFilter;
use tracing_subscriber::layer::SubscriberExt as _;
use tracing_subscriber::util::SubscriberInitExt as _;

use crate::cli::LogFormat;

/// Installs the process's logger; `default_level` applies unless `RUST_LOG` says otherwise.
pub fn init(format: LogFormat, default_level: &str) {
    let filter =
        || EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new(default_level));
    if stderr_is_the_journal() {
        match tracing_journald::layer() {
            Ok(journal) => {
                let journal = journal
                    .with_field_prefix(None)
                    .with_syslog_identifier("replay-guard".into());
                // `init` also bridges the `log` crate, so rumqttc's own messages appear.
                tracing_subscriber::registry()
                    .with(filter())
                    .with(journal)
                    .init();
                return;
            }
            // The socket is gone (a journald restart): stderr still reaches the journal.
            Err(e) => eprintln!(
                "replay-guard: cannot log to the journal natively ({e}); logging to stderr"
            ),
        }
    }
    let colour = std::io::stderr().is_terminal() && std::env::var_os("NO_COLOR").is_none();
    let logs = tracing_subscriber::fmt()
        .with_env_filter(filter())
        .with_writer(std::io::stderr)
        .with_ansi(colour);
    match format {
        LogFormat::Text => logs.init(),
        LogFormat::Json => logs.json().init(),
    }
}

/// Whether stderr is the stream systemd connected to the journal: `JOURNAL_STREAM` is
/// `DEVICE:INODE` of that stream, and a child that redirects stderr elsewhere (`2>file`)
/// inherits the variable but not the stream.
fn stderr_is_the_journal() -> bool {
    use std::os::fd::AsFd as _;
    use std::os::unix::fs::MetadataExt as _;
    let Some(stream) = std::env::var_os("JOURNAL_STREAM") else {
        return false;
    };
    let Ok(fd) = std::io::stderr().as_fd().try_clone_to_owned() else {
        return false;
    };
    match std::fs::File::from(fd).metadata() {
        Ok(m) => names_stream(&stream.to_string_lossy(), m.dev(), m.ino()),
        Err(_) => false,
    }
}

/// Whether `JOURNAL_STREAM`'s value names the file with device `dev` and inode `ino`.
fn names_stream(value: &str, dev: u64, ino: u64) -> bool {
    value
        .split_once(':')
        .and_then(|(d, i)| Some((d.parse::<u64>().ok()?, i.parse::<u64>().ok()?)))
        == Some((dev, ino))
}

#[cfg(test)]
mod tests {
    use super::names_stream;

    #[test]
    fn journal_stream_is_matched_by_device_and_inode() {
        assert!(names_stream("8:1234", 8, 1234));
        assert!(!names_stream("8:1234", 8, 1235));
        assert!(!names_stream("9:1234", 8, 1234));
        for bad in ["", "8", "8:", ":1234", "x:1", "8:1234:5", "-1:2"] {
            assert!(!names_stream(bad, 8, 1234), "{bad:?}");
        }
    }
}
