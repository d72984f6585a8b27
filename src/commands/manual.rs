//! `completions` and `man`: the shell completion scripts and manual pages, generated from the
//! clap definitions in `cli.rs` so they cannot drift from the flags. The only module that
//! names clap_complete and clap_mangen.

use std::io::Write as _;

use clap::CommandFactory as _;

use super::Failure;
use crate::cli::{Cli, CompletionShell, ManArgs};

const BIN: &str = "replay-guard";

/// Prints the completion script for `shell`.
pub fn completions(shell: CompletionShell) -> Result<(), Failure> {
    use clap_complete::Shell;
    let shell = match shell {
        CompletionShell::Bash => Shell::Bash,
        CompletionShell::Zsh => Shell::Zsh,
        CompletionShell::Fish => Shell::Fish,
    };
    // Rendered in memory first: clap_complete panics on a failed write, a closed pipe must
    // not.
    let mut script = Vec::new();
    clap_complete::generate(shell, &mut Cli::command(), BIN, &mut script);
    write_stdout(&script)
}

/// Prints `replay-guard.1`, or writes every command's page into `--dir`.
pub fn man(args: &ManArgs) -> Result<(), Failure> {
    match &args.dir {
        Some(dir) => {
            std::fs::create_dir_all(dir).map_err(|e| cannot_write(dir, e))?;
            clap_mangen::generate_to(Cli::command(), dir).map_err(|e| cannot_write(dir, e))
        }
        None => {
            let mut page = Vec::new();
            clap_mangen::Man::new(Cli::command()).render(&mut page)?;
            write_stdout(&page)
        }
    }
}

fn cannot_write(dir: &std::path::Path, e: std::io::Error) -> Failure {
    Failure::Usage(
        anyhow::Error::new(e).context(format!("cannot write manual pages into {}", dir.display())),
    )
}

/// Writes `bytes` to stdout (a closed pipe ends the command with success, in `main`).
fn write_stdout(bytes: &[u8]) -> Result<(), Failure> {
    let mut out = crate::output::stdout();
    out.write_all(bytes).and_then(|()| out.flush())?;
    Ok(())
}
