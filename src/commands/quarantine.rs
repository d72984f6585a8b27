//! `quarantine release|discard ID --reason TEXT [--operator NAME]`: an operator's decision on
//! one quarantined message, written while `run` may be writing too (redb `MultiWriter`).

use std::io::Write as _;

use anyhow::anyhow;

use super::Failure;
use crate::cli::{QuarantineAction, QuarantineArgs};
use crate::config::Config;
use crate::store::{Backend, Resolution, StoreError};
use crate::textsafe;
use crate::timefmt::now_ms;

pub fn run(args: &QuarantineArgs) -> Result<(), Failure> {
    let (a, release) = match &args.action {
        QuarantineAction::Release(a) => (a, true),
        QuarantineAction::Discard(a) => (a, false),
    };
    let (operator, reason) = who_and_why(&a.reason, a.operator.as_deref())?;
    let resolution = if release {
        Resolution::Release { operator, reason }
    } else {
        Resolution::Discard { operator, reason }
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
    let _ = writeln!(crate::output::stdout(), "{line}");
    // After the line: the resolution is committed whatever closing the file meets.
    store.close()?;
    Ok(())
}

/// The operator's name and reason, checked before anything is opened (`quarantine`, `relay
/// retry|rewind|forget`). The reason is kept as typed, trimmed (listings escape what they
/// print of it); the name must hold no ':' and no `textsafe::is_unsafe` character, whether typed or
/// taken from the environment: it is written into the audit entry's reason, where a line feed
/// or an escape sequence would let it pass for someone else.
pub(super) fn who_and_why(
    reason: &str,
    operator: Option<&str>,
) -> Result<(String, String), Failure> {
    let reason = reason.trim();
    if reason.is_empty() {
        return Err(Failure::Usage(anyhow!(
            "--reason must say why (it is what a reviewer reads in the audit log)"
        )));
    }
    // A typed name is checked before it is trimmed: `alice\n` is refused, not cleaned up.
    let (operator, found_in) = match operator {
        Some(o) if o.chars().any(textsafe::is_unsafe) => (o.to_string(), None),
        Some(o) if !o.trim().is_empty() => (o.trim().to_string(), None),
        Some(_) => return Err(Failure::Usage(anyhow!("--operator must not be empty"))),
        None => {
            let (name, found_in) = default_operator().ok_or_else(|| {
                Failure::Usage(anyhow!("cannot tell who you are: pass --operator NAME"))
            })?;
            (name, Some(found_in))
        }
    };
    if let Some(c) = operator.chars().find(|c| textsafe::is_unsafe(*c)) {
        let (what, what_to_do) = match &found_in {
            None => ("--operator", ""),
            Some(env) => (env.as_str(), ": pass --operator NAME"),
        };
        return Err(Failure::Usage(anyhow!(
            "{what} \"{}\" holds U+{:04X}: an operator name may not hold control, line \
             separator or bidi characters{what_to_do}",
            textsafe::escape_controls(&operator),
            u32::from(c)
        )));
    }
    // The audit entry reads `... by NAME: REASON`: a ':' in the name would move the split
    // (older entries are still read as they were written).
    if operator.contains(':') {
        let (what, what_to_do) = match &found_in {
            None => ("--operator", ""),
            Some(env) => (env.as_str(), ": pass --operator NAME"),
        };
        return Err(Failure::Usage(anyhow!(
            "{what} \"{}\" holds ':': an operator name may not hold ':', which separates it \
             from the reason in the audit entry{what_to_do}",
            textsafe::escape_controls(&operator)
        )));
    }
    Ok((operator, reason.to_string()))
}

/// The human behind the command, and where the name was found: `sudo` keeps the invoking
/// user in $SUDO_USER; else $USER, $LOGNAME, else the process's user id looked up in
/// /etc/passwd.
fn default_operator() -> Option<(String, String)> {
    ["SUDO_USER", "USER", "LOGNAME"]
        .iter()
        .filter_map(|v| Some((std::env::var(v).ok()?, format!("${v}"))))
        .find(|(v, _)| !v.trim().is_empty())
        .or_else(|| Some((user_from_uid()?, "the user name in /etc/passwd".to_string())))
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
