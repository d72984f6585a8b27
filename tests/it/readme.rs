//! The README, followed literally: its set-up commands run (`demo`, the sample `ingest`), every
//! `$ replay-guard …` example runs in README order against the databases it names and prints
//! what the README shows (times, ports, temp paths and `…`-shortened hex masked), the example
//! config passes `check-config`, and every subcommand has `--help` and a README entry. So the
//! README cannot rot.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use super::common;

fn readme() -> String {
    std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("README.md")).unwrap()
}

/// Fenced code blocks: (info string, lines).
fn blocks(text: &str) -> Vec<(String, Vec<String>)> {
    let mut out = Vec::new();
    let mut open: Option<(String, Vec<String>)> = None;
    for line in text.lines() {
        match (&mut open, line.strip_prefix("```")) {
            (None, Some(info)) => open = Some((info.trim().to_string(), Vec::new())),
            (Some(_), Some(_)) => out.extend(open.take()),
            (Some((_, lines)), None) => lines.push(line.to_string()),
            (None, None) => {}
        }
    }
    out
}

/// Whether `s` at byte `at` has the shape `shape` ('d' = an ASCII digit, else literal).
fn shaped(s: &[u8], at: usize, shape: &str) -> bool {
    shape.len() + at <= s.len()
        && shape.bytes().zip(&s[at..]).all(|(p, c)| {
            if p == b'd' {
                c.is_ascii_digit()
            } else {
                p == *c
            }
        })
}

/// Times become `<T>`; the digits after `127.0.0.1:` and before ` s ago`, ` batches`,
/// ` reconnects` become `N` (they vary from run to run).
fn normalise(line: &str) -> String {
    let b = line.as_bytes();
    let mut out = String::new();
    let mut i = 0;
    while i < b.len() {
        if shaped(b, i, "dddd-dd-ddTdd:dd:dd.dddZ") {
            out.push_str("<T>");
            i += 24;
        } else if shaped(b, i, "dd:dd:dd.dddZ") {
            out.push_str("<T>");
            i += 13;
        } else {
            let c = line[i..].chars().next().unwrap();
            out.push(c);
            i += c.len_utf8();
        }
    }
    let mut s = mask_digits_after(&out, "127.0.0.1:");
    for suffix in [" s ago", " batches", " reconnects"] {
        s = mask_digits_before(&s, suffix);
    }
    s
}

fn mask_digits_after(s: &str, prefix: &str) -> String {
    let mut out = String::new();
    let mut rest = s;
    while let Some(at) = rest.find(prefix) {
        out.push_str(&rest[..at + prefix.len()]);
        rest = rest[at + prefix.len()..].trim_start_matches(|c: char| c.is_ascii_digit());
        out.push('N');
    }
    out + rest
}

fn mask_digits_before(s: &str, suffix: &str) -> String {
    let mut out = String::new();
    let mut rest = s;
    while let Some(at) = rest.find(suffix) {
        let head = rest[..at].trim_end_matches(|c: char| c.is_ascii_digit());
        out.push_str(head);
        if head.len() < at {
            out.push('N');
        }
        out.push_str(suffix);
        rest = &rest[at + suffix.len()..];
    }
    out + rest
}

/// `expected` with each `…` standing for a (possibly empty) run of lowercase hex digits.
fn matches(expected: &str, actual: &str) -> bool {
    match expected.split_once('…') {
        None => expected == actual,
        Some((head, tail)) => {
            let Some(rest) = actual.strip_prefix(head) else {
                return false;
            };
            let hex = rest
                .char_indices()
                .find(|(_, c)| !matches!(c, '0'..='9' | 'a'..='f'))
                .map_or(rest.len(), |(i, _)| i);
            (0..=hex).any(|k| matches(tail, &rest[k..]))
        }
    }
}

fn assert_output(command: &str, expected: &[String], actual: &str) {
    let got: Vec<String> = actual.lines().map(normalise).collect();
    let want: Vec<String> = expected.iter().map(|l| normalise(l)).collect();
    assert_eq!(
        got.len(),
        want.len(),
        "`{command}` printed {} lines, README shows {}:\n{actual}",
        got.len(),
        want.len()
    );
    for (w, g) in want.iter().zip(&got) {
        assert!(
            matches(w, g),
            "`{command}`: README shows\n  {w}\nbut it printed\n  {g}"
        );
    }
}

/// Splits a command line on spaces, keeping "double-quoted" words whole.
fn words(line: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut cur = String::new();
    let mut quoted = false;
    for c in line.chars() {
        match c {
            '"' => quoted = !quoted,
            ' ' if !quoted => {
                if !cur.is_empty() {
                    out.push(std::mem::take(&mut cur));
                }
            }
            c => cur.push(c),
        }
    }
    if !cur.is_empty() {
        out.push(cur);
    }
    out
}

struct Env {
    dir: tempfile::TempDir,
    sample: PathBuf,
    gaps: PathBuf,
}

impl Env {
    /// The README's database paths, mapped into the test's own directory.
    fn map(&self, arg: &str) -> Option<String> {
        match arg {
            "/tmp/replay-guard-sample.redb" => Some(self.sample.to_str().unwrap().into()),
            "/tmp/gaps-demo.redb" => Some(self.gaps.to_str().unwrap().into()),
            a if a.starts_with('/') && a.ends_with(".redb") => None,
            a => Some(a.into()),
        }
    }

    /// Runs `args` (README words) with the binary; `None` if it names a database the README
    /// does not build (a live system's path).
    fn run(&self, args: &[String]) -> Option<Output> {
        let mapped: Option<Vec<String>> = args.iter().map(|a| self.map(a)).collect();
        let mapped = mapped?;
        Some(
            Command::new(common::bin())
                .args(&mapped)
                .current_dir(env!("CARGO_MANIFEST_DIR"))
                .env("TMPDIR", self.dir.path())
                .env_remove("NO_COLOR")
                .output()
                .unwrap(),
        )
    }

    /// Puts back the README's spelling of the paths the test replaced.
    fn unmap(&self, text: &str) -> String {
        text.replace(
            self.sample.to_str().unwrap(),
            "/tmp/replay-guard-sample.redb",
        )
        .replace(self.gaps.to_str().unwrap(), "/tmp/gaps-demo.redb")
        .replace(
            common::bin().to_str().unwrap(),
            "target/release/replay-guard",
        )
    }
}

/// The gaps example's database, as the README describes it: sequences 1–5, 9 and 12–20 of
/// CALFIRE/E7-AVL epoch 3, then the sample feed.
fn build_gaps_db(path: &Path) {
    let mut feed = String::new();
    for seq in (1..=5).chain([9]).chain(12..=20) {
        feed.push_str(&common::msg("CALFIRE", "E7-AVL", 3, seq, "position"));
        feed.push('\n');
    }
    feed.push_str(
        &std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/feed.jsonl"))
            .unwrap(),
    );
    let out = common::run_with_stdin(
        &["ingest", "--db", path.to_str().unwrap(), "-"],
        feed.as_bytes(),
    );
    assert_eq!(out.status.code(), Some(0));
}

#[test]
fn readme_commands_work_as_written_and_print_what_it_shows() {
    let text = readme();
    let blocks = blocks(&text);
    let dir = tempfile::tempdir().unwrap();
    let env = Env {
        sample: dir.path().join("sample.redb"),
        gaps: dir.path().join("gaps.redb"),
        dir,
    };
    build_gaps_db(&env.gaps);

    // 1. The two set-up commands' block: every `cargo run --release -- …` line.
    let (_, setup) = blocks
        .iter()
        .find(|(info, lines)| info == "sh" && lines.iter().any(|l| l.contains("-- demo")))
        .expect("the two-commands block");
    let demo_shown = &blocks
        .iter()
        .find(|(_, l)| {
            l.first()
                .is_some_and(|f| f.starts_with("replay-guard demo:"))
        })
        .expect("the demo's output in the README")
        .1;
    let ingest_shown = &blocks
        .iter()
        .find(|(_, l)| {
            l.first()
                .is_some_and(|f| f.starts_with("replay-guard ingest:"))
        })
        .expect("the ingest's output in the README")
        .1;
    let mut ran = 0;
    let sample_setup: Vec<Vec<String>> = blocks
        .iter()
        .filter(|(info, _)| info == "sh")
        .flat_map(|(_, lines)| lines.iter())
        .chain(setup.iter())
        .filter_map(|l| l.strip_prefix("cargo run --release -- "))
        .map(words)
        .collect();
    let mut seen = std::collections::HashSet::new();
    for args in sample_setup {
        if !seen.insert(args.clone()) {
            continue;
        }
        let out = env
            .run(&args)
            .expect("set-up commands use the README's paths");
        let stdout = env.unmap(&String::from_utf8_lossy(&out.stdout));
        let stderr = env.unmap(&String::from_utf8_lossy(&out.stderr));
        assert_eq!(out.status.code(), Some(0), "{args:?}: {stderr}");
        match args[0].as_str() {
            "demo" => {
                // The temp directory differs from run to run: compare with the README's.
                let shown_db = demo_shown
                    .iter()
                    .find_map(|l| l.split(" -> ").nth(1))
                    .unwrap()
                    .to_string();
                let printed_db = stdout
                    .lines()
                    .find_map(|l| l.split(" -> ").nth(1))
                    .unwrap()
                    .to_string();
                assert_output("demo", demo_shown, &stdout.replace(&printed_db, &shown_db));
            }
            "ingest" => assert_output("ingest", ingest_shown, &stderr),
            _ => {}
        }
        ran += 1;
    }
    assert!(ran >= 3, "only {ran} set-up commands found");

    // 2. Every `$ replay-guard …` example, in README order, with the output shown under it.
    let mut examples = 0;
    for (_, lines) in &blocks {
        let mut i = 0;
        while i < lines.len() {
            let Some(cmd) = lines[i].strip_prefix("$ replay-guard ") else {
                i += 1;
                continue;
            };
            let mut shown = Vec::new();
            i += 1;
            while i < lines.len() && !lines[i].starts_with("$ ") {
                shown.push(lines[i].clone());
                i += 1;
            }
            let (cmd, head) = match cmd.split_once(" | head -") {
                Some((c, n)) => (c, n.trim().parse::<usize>().ok()),
                None => (cmd, None),
            };
            let args = words(cmd);
            let Some(out) = env.run(&args) else {
                continue; // a live system's database (e.g. --follow on /var/lib/…)
            };
            let stdout = env.unmap(&String::from_utf8_lossy(&out.stdout));
            assert_eq!(
                out.status.code(),
                Some(0),
                "{cmd}: {}",
                String::from_utf8_lossy(&out.stderr)
            );
            let printed: String = match head {
                Some(n) => stdout.lines().take(n).map(|l| format!("{l}\n")).collect(),
                None => stdout,
            };
            assert_output(cmd, &shown, &printed);
            examples += 1;
        }
    }
    assert!(examples >= 8, "only {examples} examples ran");
}

#[test]
fn every_subcommand_has_help_and_a_readme_entry_and_the_example_config_passes() {
    let text = readme();
    let help = common::run(&["--help"]);
    assert_eq!(help.status.code(), Some(0));
    let help = String::from_utf8(help.stdout).unwrap();
    let subcommands: Vec<String> = help
        .lines()
        .skip_while(|l| !l.starts_with("Commands:"))
        .skip(1)
        .take_while(|l| l.starts_with("  "))
        .filter_map(|l| l.split_whitespace().next())
        .filter(|c| *c != "help")
        .map(str::to_string)
        .collect();
    assert!(subcommands.len() >= 13, "{subcommands:?}");
    for sub in &subcommands {
        let out = common::run(&[sub, "--help"]);
        assert_eq!(out.status.code(), Some(0), "{sub} --help");
        assert!(
            text.lines()
                .filter(|l| l.starts_with("### "))
                .any(|l| l.contains(&format!("`{sub}"))),
            "README has no entry for `{sub}`"
        );
    }
    for sub in ["release", "discard"] {
        let out = common::run(&["quarantine", sub, "--help"]);
        assert_eq!(out.status.code(), Some(0), "quarantine {sub} --help");
    }
    let out = common::run(&["check-config", "systemd/replay-guard.toml"]);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn the_matcher_can_fail() {
    assert!(matches("a 12ab…,x", "a 12abff09,x"));
    assert!(!matches("a 12ab…,x", "a 12abzz,x"));
    assert!(!matches("applied=7", "applied=8"));
    assert_eq!(
        normalise("at 2026-11-30T06:17:47.206Z and 06:17:47.206Z on 127.0.0.1:4711 (3 s ago)"),
        "at <T> and <T> on 127.0.0.1:N (N s ago)"
    );
}
