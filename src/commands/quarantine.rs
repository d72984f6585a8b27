//! `quarantine release|discard ID --reason TEXT [--operator NAME]`: an operator's decision on
//! one quarantined message, written while `run` may be writing too (redb `MultiWriter`).

use std::io::Write as _;

use anyhow::anyhow;

use super::Failure;
use crate::cli::{QuarantineAction, QuarantineArgs};
use crate::config::Config;
use crate::store::{Backend, Resolution, StoreError};
use crate::timefmt::now_ms;

pub fn run(args: &QuarantineArgs) -> Result<(), Failure> {
    let (a, release) = match &args.action {
        QuarantineAction::Release(a) => (a, true),
        QuarantineAction::Discard(a) => (a, false),
    };
    let reason = a.reason.trim();
    if reason.is_empty() {
        return Err(Failure::Usage(anyhow!(
            "--reason must say why (it is what a reviewer reads in the audit log)"
        )));
    }
    let operator = match &a.operator {
        Some(o) if !o.trim().is_empty() => o.trim().to_string(),
        Some(_) => return Err(Failure::Usage(anyhow!("--operator must not be empty"))),
        None => default_operator().ok_or_else(|| {
            Failure::Usage(anyhow!("cannot tell who you are: pass --operator NAME"))
        })?,
    };
    let resolution = if release {
        Resolution::Release {
            operator,
            reason: reason.to_string(),
        }
    } else {
        Resolution::Discard {
            operator,
            reason: reason.to_string(),
        }
    };
    let config = Config::resolve(a.db.config.as_deref(), a.db.db.as_deref())?;
    let mut store = super::open_operator(&config)?;
    let decided = match &mut store {
        Backend::Redb(s) => s.resolve_quarantined(a.id, &resolution, &config.feed, now_ms()),
        Backend::Postgres(s) => s.resolve_quarantined(a.id, &resolution, &config.feed, now_ms()),
    };
    let decided = decided.map_err(|e| match e {
        StoreError::Refused(why) => Failure::Usage(anyhow!(why)),
        other => Failure::from(other),
    })?;
    let mut line = format!(
        "quarantine #{} {}: audit entry {}",
        a.id, decided.outcome, decided.audit_index
    );
    if let Some(offset) = decided.effect_offset {
        line.push_str(&format!(", effect #{offset} (released: true)"));
    }
    let _ = writeln!(std::io::stdout(), "{line}");
    // After the line: the resolution is committed whatever closing the file meets.
    store.close()?;
    Ok(())
}

/// The human behind the command: `sudo` keeps the invoking user in $SUDO_USER; else $USER,
/// $LOGNAME, else the process's user id looked up in /etc/passwd.
pub(super) fn default_operator() -> Option<String> {
    ["SUDO_USER", "USER", "LOGNAME"]
        .iter()
        .filter_map(|v| std::env::var(v).ok())
        .find(|v| !v.trim().is_empty())
        .or_else(user_from_uid)
}

fn user_from_uid() -> Option<String> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let uid = status
        .lines()
        .find_map(|l| l.strip_prefix("Uid:"))?
        .split_whitespace()
        .next()?
        .to_string();
    let passwd = std::fs::read_to_string("/etc/passwd").unwrap_or_default();
    let name = passwd.lines().find_map(|l| {
        let mut f = l.split(':');
        let name = f.next()?;
        (f.nth(1)? == uid).then(|| name.to_string())
    });
    Some(name.unwrap_or_else(|| format!("uid {uid}")))
}
