//! The `replay-guard` binary: parse flags, set up logging, dispatch, map errors to exit codes.

use std::io::Write as _;
use std::process::ExitCode;

use clap::Parser as _;
use replay_guard::cli::{Cli, Command};
use replay_guard::commands::{self, EXIT_USAGE, dump};

fn main() -> ExitCode {
    // Before anything opens the database: redb panics on a damaged file become one-line
    // errors at the store boundary, and only those are kept off stderr.
    replay_guard::store::install_panic_hook();
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        // A monitoring system reads a usage error of the check as UNKNOWN, on stdout.
        Err(e) if e.use_stderr() && commands::health::requested() => {
            return commands::health::unknown(&one_line(&e));
        }
        Err(e) if e.use_stderr() => {
            let _ = writeln!(std::io::stderr(), "replay-guard: {}", one_line(&e));
            return ExitCode::from(EXIT_USAGE);
        }
        Err(e) => {
            let _ = e.print(); // --help, --version
            return ExitCode::SUCCESS;
        }
    };
    // The demo tells its own story on stdout: the service's own lines would drown it.
    let default_level = if matches!(cli.command, Command::Demo(_)) {
        "error"
    } else {
        "info"
    };
    replay_guard::logging::init(cli.log_format, default_level);
    commands::report_upgrades();
    let result = match &cli.command {
        Command::Run(a) => commands::run::run(a),
        Command::CheckConfig { file } => commands::check_config::run(file),
        Command::Ingest(a) => commands::ingest::run(a),
        Command::Verify(a) => commands::verify::run(a),
        Command::DumpAudit(a) => dump::run(dump::Table::Audit, a),
        Command::DumpEffects(a) => dump::run(dump::Table::Effects, a),
        Command::DumpQuarantine(a) => dump::run(dump::Table::Quarantine, a),
        Command::Quarantine(a) => commands::quarantine::run(a),
        Command::Stats(a) => commands::stats::run(a),
        // Its own exit codes (the plugin convention) and its own one line, errors included.
        Command::Health(a) => return commands::health::run(a),
        Command::Backup(a) => commands::backup::run(a),
        Command::Compact(a) => commands::compact::run(a),
        Command::Demo(a) => commands::demo::run(a),
        Command::Explain(a) => commands::explain::run(a),
        Command::Gaps(a) => commands::gaps::run(a),
        Command::Report(a) => commands::report::run(a),
        Command::Relay(a) => commands::relay::run(a),
        Command::MigrateSchema(a) => commands::migrate::run_schema(a),
        Command::Migrate(a) => commands::migrate::run(a),
        Command::Completions { shell } => commands::manual::completions(*shell),
        Command::Man(a) => commands::manual::man(a),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        // The reader of standard output went away (`| head`): nobody is left to tell, and
        // what was asked for was printed as far as it was read.
        Err(_) if replay_guard::output::stdout_closed() => ExitCode::SUCCESS,
        Err(f) => {
            // Never panic on a closed stderr: the exit code still tells.
            let _ = writeln!(std::io::stderr(), "replay-guard: error: {:#}", f.error());
            f.exit_code()
        }
    }
}

/// A clap error on one line: its message without the usage block, and where to look.
fn one_line(e: &clap::Error) -> String {
    let rendered = e.render().to_string();
    let message = rendered.split("\n\nUsage:").next().unwrap_or(&rendered);
    let text: Vec<&str> = message
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with("For more information"))
        .collect();
    format!("{} (see --help)", text.join(" "))
}
