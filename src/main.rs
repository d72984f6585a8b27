//! The `replay-guard` binary: parse flags, set up logging, dispatch, map errors to exit codes.

use std::io::{IsTerminal as _, Write as _};
use std::process::ExitCode;

use clap::Parser as _;
use replay_guard::cli::{Cli, Command, LogFormat};
use replay_guard::commands::{self, EXIT_USAGE, dump};

fn main() -> ExitCode {
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) => {
            let _ = e.print();
            return if e.use_stderr() {
                ExitCode::from(EXIT_USAGE)
            } else {
                ExitCode::SUCCESS
            };
        }
    };
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let logs = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal());
    // `init` also bridges the `log` crate, so rumqttc's own messages appear.
    match cli.log_format {
        LogFormat::Text => logs.init(),
        LogFormat::Json => logs.json().init(),
    }
    let result = match &cli.command {
        Command::Run(a) => commands::run::run(a),
        Command::CheckConfig { file } => commands::check_config::run(file),
        Command::Ingest(a) => commands::ingest::run(a),
        Command::Verify(a) => commands::verify::run(a),
        Command::DumpAudit(a) => dump::run(dump::Table::Audit, a),
        Command::DumpEffects(a) => dump::run(dump::Table::Effects, a),
        Command::DumpQuarantine(a) => dump::run(dump::Table::Quarantine, a),
        Command::Explain(a) => commands::explain::run(a),
        Command::Gaps(a) => commands::gaps::run(a),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(f) => {
            // Never panic on a closed stderr: the exit code still tells.
            let _ = writeln!(std::io::stderr(), "replay-guard: error: {:#}", f.error());
            f.exit_code()
        }
    }
}
