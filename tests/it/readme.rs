//! The README and the book (`docs/src/`), followed literally: the README's set-up commands run
//! (`demo`, the sample `ingest`), every `$ replay-guard …` example runs in order against the
//! databases it names and prints what the text shows (times, ports, temp paths and
//! `…`-shortened hex masked), the example config passes `check-config`, every subcommand has
//! `--help` and a page in the book, and every relative link and `#anchor` resolves. So the
//! documentation cannot rot.
//!
//! Order: the README first, then the book's pages in SUMMARY.md order, all against one set of
//! databases. An example may build on one of an earlier page (the `stats` example counts the
//! `quarantine release` and `quarantine discard` of the page before it), as a reader working
//! through the book would; SUMMARY.md's order is therefore part of what is tested.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use super::common;

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

fn readme() -> String {
    read(&root().join("README.md"))
}

/// Relative link targets in `text`, outside code (fenced blocks and inline code spans).
fn links(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut fenced = false;
    for line in text.lines() {
        if line.trim_start().starts_with("```") {
            fenced = !fenced;
            continue;
        }
        if fenced {
            continue;
        }
        // Drop inline code spans: text between backticks is never a link.
        let prose: String = line
            .split('`')
            .enumerate()
            .filter(|(i, _)| i % 2 == 0)
            .map(|(_, part)| part)
            .collect::<Vec<_>>()
            .join(" ");
        let mut rest = prose.as_str();
        while let Some(at) = rest.find("](") {
            rest = &rest[at + 2..];
            let end = rest.find(')').unwrap_or(rest.len());
            out.push(rest[..end].to_string());
            rest = &rest[end..];
        }
    }
    out
}

/// The book's pages in SUMMARY.md order (each link of SUMMARY.md, once).
fn summary_pages() -> Vec<PathBuf> {
    let src = root().join("docs/src");
    let mut pages: Vec<PathBuf> = Vec::new();
    for link in links(&read(&src.join("SUMMARY.md"))) {
        let page = src.join(&link);
        if !pages.contains(&page) {
            pages.push(page);
        }
    }
    assert!(
        pages.len() >= 30,
        "SUMMARY.md lists only {} pages",
        pages.len()
    );
    pages
}

/// The README, then the book's pages in SUMMARY.md order: (path, text).
fn documents() -> Vec<(PathBuf, String)> {
    std::iter::once(root().join("README.md"))
        .chain(summary_pages())
        .map(|p| {
            let text = read(&p);
            (p, text)
        })
        .collect()
}

/// The anchor mdBook (and GitHub) gives a heading: lowercase; letters, digits, `-` and `_`
/// kept, whitespace made `-`, everything else (backticks, punctuation) dropped.
fn anchor(heading: &str) -> String {
    heading
        .trim()
        .chars()
        .filter_map(|c| {
            if c.is_whitespace() {
                Some('-')
            } else if c.is_alphanumeric() || c == '-' || c == '_' {
                Some(c.to_lowercase().next().unwrap_or(c))
            } else {
                None
            }
        })
        .collect()
}

/// The anchors of a Markdown file's headings (outside fenced blocks); a repeated heading
/// gets `-1`, `-2`, … as mdBook numbers them.
fn anchors(text: &str) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    let mut fenced = false;
    for line in text.lines() {
        if line.trim_start().starts_with("```") {
            fenced = !fenced;
            continue;
        }
        let hashes = line.len() - line.trim_start_matches('#').len();
        if fenced || hashes == 0 || !line[hashes..].starts_with(' ') {
            continue;
        }
        let base = anchor(&line[hashes..]);
        let n = out
            .iter()
            .filter(|a| **a == base || a.starts_with(&format!("{base}-")))
            .count();
        out.push(if n == 0 { base } else { format!("{base}-{n}") });
    }
    out
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
        "`{command}` printed {} lines, the docs show {}:\n{actual}",
        got.len(),
        want.len()
    );
    for (w, g) in want.iter().zip(&got) {
        assert!(
            matches(w, g),
            "`{command}`: the docs show\n  {w}\nbut it printed\n  {g}"
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
                .current_dir(root())
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
    feed.push_str(&read(&root().join("examples/feed.jsonl")));
    let out = common::run_with_stdin(
        &["ingest", "--db", path.to_str().unwrap(), "-"],
        feed.as_bytes(),
    );
    assert_eq!(out.status.code(), Some(0));
}

#[test]
fn readme_and_book_commands_work_as_written_and_print_what_they_show() {
    let docs = documents();
    let blocks: Vec<(String, Vec<String>)> =
        docs.iter().flat_map(|(_, text)| blocks(text)).collect();
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

    // 2. Every `$ replay-guard …` example, in the README's and then the book's order, with the
    // output shown under it.
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
    assert!(examples >= 9, "only {examples} examples ran");
}

#[test]
fn every_subcommand_has_help_a_book_page_and_a_readme_line_and_the_example_config_passes() {
    let readme = readme();
    let titles: Vec<(PathBuf, String)> = summary_pages()
        .into_iter()
        .map(|p| {
            let title = read(&p)
                .lines()
                .find(|l| l.starts_with("# "))
                .unwrap_or_else(|| panic!("{} has no title", p.display()))
                .to_string();
            (p, title)
        })
        .collect();
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
            titles
                .iter()
                .any(|(p, t)| p.starts_with(root().join("docs/src/commands"))
                    && t.contains(&format!("`{sub}"))),
            "the book has no page for `{sub}` (a page under docs/src/commands/ in SUMMARY.md \
             whose title names it)"
        );
        assert!(
            readme.contains(&format!("`{sub}`")) || readme.contains(&format!("`{sub} ")),
            "the README's list of commands lacks `{sub}`"
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

/// Every relative link of README.md and of the book's pages names a file that exists, and its
/// `#anchor` a heading of that file (or of the page itself); every page under docs/src is in
/// SUMMARY.md. (Web links are not checked: the suite runs offline.)
#[test]
fn every_relative_link_and_anchor_in_the_readme_and_the_book_resolves() {
    let src = root().join("docs/src");
    let files = common::doc_files();
    let listed = summary_pages();
    let mut checked = 0;
    let mut broken = Vec::new();
    for file in &files {
        if file.starts_with(&src) && !file.ends_with("SUMMARY.md") && !listed.contains(file) {
            broken.push(format!("{}: not in SUMMARY.md", file.display()));
        }
        for link in links(&read(file)) {
            if link.contains("://") || link.starts_with("mailto:") {
                continue;
            }
            let (path, fragment) = match link.split_once('#') {
                Some((p, f)) => (p, Some(f)),
                None => (link.as_str(), None),
            };
            let target = if path.is_empty() {
                file.clone()
            } else {
                file.parent().unwrap().join(path)
            };
            checked += 1;
            if !target.exists() {
                broken.push(format!("{}: {link}: no such file", file.display()));
                continue;
            }
            if let Some(fragment) = fragment
                && !anchors(&read(&target)).iter().any(|a| a == fragment)
            {
                broken.push(format!("{}: {link}: no such heading", file.display()));
            }
        }
    }
    assert!(broken.is_empty(), "broken links:\n{}", broken.join("\n"));
    assert!(checked >= 100, "only {checked} links checked");
}

#[test]
fn the_link_checker_can_fail() {
    assert_eq!(
        anchor("`health`: monitoring (Nagios, Icinga, a systemd timer)"),
        "health-monitoring-nagios-icinga-a-systemd-timer"
    );
    assert_eq!(
        anchor("Filters, CSV and `--follow` (`dump-audit`, `dump-effects`)"),
        "filters-csv-and---follow-dump-audit-dump-effects"
    );
    assert_eq!(
        anchors("# A\n```\n# not a heading\n```\n## A\n#hashtag"),
        ["a", "a-1"]
    );
    assert_eq!(
        links("see [x](a.md#b), `[y](code.md)`, [z](https://e.org)\n```\n[w](no.md)\n```"),
        ["a.md#b", "https://e.org"]
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

/// The metrics page names every outcome label the endpoint exposes (a series per outcome).
#[test]
fn the_metrics_page_lists_every_outcome_label() {
    let page = read(&root().join("docs/src/operations/metrics.md"));
    let row = page
        .lines()
        .find(|l| l.starts_with("| `replay_guard_decisions_total{outcome}`"))
        .expect("the decisions counter's row");
    for outcome in replay_guard::model::Outcome::ALL {
        assert!(
            row.contains(&format!("`{}`", outcome.as_str())),
            "the metrics table lacks outcome {}",
            outcome.as_str()
        );
    }
}

/// The promise in bold at the top of "What green means", joined into one line.
fn green_promise(text: &str) -> String {
    let joined = text.split_whitespace().collect::<Vec<_>>().join(" ");
    let start = joined
        .find("**Green means delivered:")
        .unwrap_or_else(|| panic!("no green promise in:\n{text}"));
    let end = joined[start + 2..].find("**").unwrap() + start + 4;
    joined[start..end].to_string()
}

#[test]
fn the_readme_promises_word_for_word_what_the_green_page_says() {
    let page = read(&root().join("docs/src/green.md"));
    let promise = green_promise(&page);
    assert!(promise.contains("reached its receiver"), "{promise}");
    assert_eq!(green_promise(&readme()), promise);
}
