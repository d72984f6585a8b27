//! The Debian package, built by `scripts/build-deb.sh --no-build` from the binary under test
//! in the test's own target directory (`CARGO_TARGET_DIR`), then read with `dpkg-deb`,
//! unpacked with `dpkg -x` into a throwaway root, and installed into a real systemd (PID 1 in
//! systemd-nspawn, `scripts/deb-systemd-test.sh`); and the `man` and `completions` commands
//! it is made from.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Command;

use clap::CommandFactory as _;
use replay_guard::cli::Cli;

use super::common;

/// The man page names the package must hold: one per command and subcommand (the same
/// walk as clap_mangen's), from the clap definitions themselves.
fn man_pages() -> BTreeSet<String> {
    fn walk(cmd: &clap::Command, name: &str, out: &mut BTreeSet<String>) {
        out.insert(format!("{name}.1.gz"));
        for sub in cmd.get_subcommands().filter(|s| !s.is_hide_set()) {
            if sub.get_name() != "help" {
                walk(sub, &format!("{name}-{}", sub.get_name()), out);
            }
        }
    }
    let mut out = BTreeSet::new();
    walk(&Cli::command(), "replay-guard", &mut out);
    out
}

fn output(cmd: &mut Command) -> String {
    let out = cmd.output().unwrap();
    assert!(
        out.status.success(),
        "{cmd:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

/// Builds the package from the binary under test; returns its path.
fn build_deb(dir: &Path) -> PathBuf {
    let target = dir.join("target");
    std::fs::create_dir_all(target.join("release")).unwrap();
    std::fs::copy(common::bin(), target.join("release/replay-guard")).unwrap();
    let deb = dir.join("replay-guard.deb");
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    output(
        Command::new(root.join("scripts/build-deb.sh"))
            .args(["--no-build", "--output"])
            .arg(&deb)
            .env("CARGO_TARGET_DIR", &target),
    );
    deb
}

#[test]
fn the_deb_holds_the_stripped_binary_unit_conffiles_man_pages_and_completions() {
    let dir = tempfile::tempdir().unwrap();
    let deb = build_deb(dir.path());

    // What the package lists, with modes.
    let listing = output(Command::new("dpkg-deb").arg("-c").arg(&deb));
    let entries: Vec<(&str, &str)> = listing
        .lines()
        .filter_map(|l| Some((l.split_whitespace().next()?, l.split_whitespace().last()?)))
        .collect();
    let mode_of = |path: &str| {
        entries
            .iter()
            .find(|(_, p)| p.trim_start_matches('.') == path)
            .map(|(m, _)| *m)
            .unwrap_or_else(|| panic!("{path} is not in the package:\n{listing}"))
    };
    assert_eq!(mode_of("/usr/bin/replay-guard"), "-rwxr-xr-x");
    for path in [
        "/usr/lib/systemd/system/replay-guard.service",
        "/usr/lib/systemd/system/replay-guard-relay.service",
        "/etc/replay-guard/replay-guard.toml",
        "/etc/replay-guard/relay.toml",
    ] {
        assert_eq!(mode_of(path), "-rw-r--r--", "{path}");
    }
    assert_eq!(mode_of("/etc/replay-guard/mqtt-password"), "-rw-------");
    for path in [
        "/usr/share/bash-completion/completions/replay-guard",
        "/usr/share/zsh/vendor-completions/_replay-guard",
        "/usr/share/fish/vendor_completions.d/replay-guard.fish",
        "/usr/share/doc/replay-guard/README.md",
        "/usr/share/doc/replay-guard/copyright",
        "/usr/share/doc/replay-guard/html/index.html",
        "/usr/share/doc/replay-guard/html/commands/run.html",
        "/usr/share/doc/replay-guard/html/spec/key-v1.html",
        "/usr/share/doc/replay-guard/examples/feed.jsonl",
    ] {
        mode_of(path);
    }
    let packaged: BTreeSet<String> = entries
        .iter()
        .filter_map(|(_, p)| p.strip_prefix("./usr/share/man/man1/"))
        .filter(|p| !p.is_empty())
        .map(str::to_string)
        .collect();
    assert_eq!(packaged, man_pages(), "one man page per command");

    // Control: the dependencies dpkg-shlibdeps found, and the conffiles.
    let fields = output(Command::new("dpkg-deb").arg("-f").arg(&deb).args([
        "Package",
        "Architecture",
        "Depends",
    ]));
    assert!(fields.contains("Package: replay-guard"), "{fields}");
    assert!(fields.contains("Depends: libc6"), "{fields}");
    let control = dir.path().join("control");
    output(Command::new("dpkg-deb").arg("-e").arg(&deb).arg(&control));
    let conffiles = std::fs::read_to_string(control.join("conffiles")).unwrap();
    assert_eq!(
        conffiles.lines().collect::<BTreeSet<_>>(),
        BTreeSet::from([
            "/etc/replay-guard/mqtt-password",
            "/etc/replay-guard/relay.toml",
            "/etc/replay-guard/replay-guard.toml"
        ])
    );
    // Each unit (the service, the standalone relay) is stopped on removal and restarted after
    // an upgrade, never enabled or started by a first install (its config must be edited
    // first).
    let postinst = std::fs::read_to_string(control.join("postinst")).unwrap();
    assert_eq!(
        postinst.matches("Automatically added by cargo-deb").count(),
        4
    );
    let prerm = std::fs::read_to_string(control.join("prerm")).unwrap();
    for unit in ["replay-guard.service", "replay-guard-relay.service"] {
        assert!(
            postinst.contains(&format!("try-restart {unit}")),
            "{postinst}"
        );
        assert!(prerm.contains(&format!("stop {unit}")), "{prerm}");
    }
    assert!(!postinst.contains("deb-systemd-invoke start"), "{postinst}");
    // A first install says what to do next (edit the config, then enable the unit).
    for step in [
        "/etc/replay-guard/replay-guard.toml",
        "systemctl enable --now replay-guard",
    ] {
        assert!(
            postinst.contains(step),
            "postinst does not print {step:?}:\n{postinst}"
        );
    }

    // Unpacked into a throwaway root.
    let root = dir.path().join("root");
    output(Command::new("dpkg").arg("-x").arg(&deb).arg(&root));
    let bin = root.join("usr/bin/replay-guard");
    let version = output(Command::new(&bin).arg("--version"));
    assert_eq!(
        version.trim(),
        format!("replay-guard {}", env!("CARGO_PKG_VERSION"))
    );
    let sections = output(Command::new("readelf").arg("-S").arg(&bin));
    assert!(!sections.contains(".debug_info"), "not stripped");
    assert!(
        std::fs::metadata(&bin).unwrap().len() < std::fs::metadata(common::bin()).unwrap().len(),
        "the packaged binary is no smaller than the debug build"
    );
    assert_eq!(
        std::fs::metadata(root.join("etc/replay-guard/mqtt-password"))
            .unwrap()
            .len(),
        0
    );
    // The example configs as shipped pass check-config with the packaged binary, but for the
    // relay's exec sink program, a placeholder to replace.
    let checked = output(
        Command::new(&bin)
            .arg("check-config")
            .arg(root.join("etc/replay-guard/replay-guard.toml")),
    );
    assert!(checked.contains(": ok (database"), "{checked}");
    let relay = Command::new(&bin)
        .arg("check-config")
        .arg(root.join("etc/replay-guard/relay.toml"))
        .output()
        .unwrap();
    let refused = String::from_utf8_lossy(&relay.stderr);
    assert_eq!(relay.status.code(), Some(1), "{refused}");
    assert!(
        refused.contains("program \"/usr/local/bin/cop-import\" does not exist"),
        "{refused}"
    );

    for (name, lines) in [
        (
            "replay-guard.service",
            &[
                "ExecStart=/usr/bin/replay-guard run --config /etc/replay-guard/replay-guard.toml",
                "RestartPreventExitStatus=1",
                "LoadCredential=mqtt-password:/etc/replay-guard/mqtt-password",
                "User=replay-guard",
            ][..],
        ),
        (
            "replay-guard-relay.service",
            &[
                "ExecStart=/usr/bin/replay-guard relay --config /etc/replay-guard/relay.toml",
                "RestartPreventExitStatus=1",
                "User=replay-guard",
            ],
        ),
    ] {
        let unit = std::fs::read_to_string(root.join("usr/lib/systemd/system").join(name)).unwrap();
        for line in lines {
            assert!(
                unit.lines().any(|l| l == *line),
                "{name} lacks {line}:\n{unit}"
            );
        }
        // Every page the unit's Documentation= names is in the package.
        let docs = unit
            .lines()
            .find_map(|l| l.strip_prefix("Documentation="))
            .expect("Documentation=");
        for doc in docs.split_whitespace() {
            let path = match doc.strip_prefix("man:") {
                Some(page) => {
                    let (name, section) = page.trim_end_matches(')').split_once('(').unwrap();
                    root.join(format!("usr/share/man/man{section}/{name}.{section}.gz"))
                }
                None => root.join(doc.strip_prefix("file:/").expect("man: or file: URI")),
            };
            assert!(
                path.exists(),
                "{name}: Documentation={doc}: {} missing",
                path.display()
            );
        }
    }

    // The pages are roff, the completions the shells' own formats.
    let page =
        output(Command::new("zcat").arg(root.join("usr/share/man/man1/replay-guard-run.1.gz")));
    assert!(page.contains(".TH replay-guard-run 1"), "{page}");
    assert!(page.contains("\\-\\-config"), "{page}");
    let read = |p: &str| std::fs::read_to_string(root.join(p)).unwrap();
    assert!(
        read("usr/share/bash-completion/completions/replay-guard")
            .contains("-o default replay-guard")
    );
    assert!(
        read("usr/share/zsh/vendor-completions/_replay-guard").starts_with("#compdef replay-guard")
    );
    assert!(
        read("usr/share/fish/vendor_completions.d/replay-guard.fish")
            .contains("complete -c replay-guard")
    );
}

/// The package as an operator meets it, in a Debian bookworm booted with systemd as PID 1:
/// `apt install`, not started until enabled, `Type=notify` under its hardening, a
/// redelivery suppressed, a config error not restarted, an upgrade restarting it, removal
/// stopping it and keeping the database (the script's own checks; it fails at the first).
/// The root file system is made once with debootstrap and kept in cargo's temp dir for
/// integration tests; the container runs on an overlay in its own network namespace.
#[test]
fn the_deb_installs_and_runs_under_a_real_systemd() {
    let dir = tempfile::tempdir().unwrap();
    let deb = build_deb(dir.path());
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let out = Command::new(root.join("scripts/deb-systemd-test.sh"))
        .arg(&deb)
        .env(
            "ROOTFS",
            Path::new(env!("CARGO_TARGET_TMPDIR")).join("replay-guard-bookworm-root"),
        )
        .env("TMPDIR", dir.path())
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && text.contains("all checks passed"),
        "{text}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// The absolute paths under `prefix` that the README and the book name: (document, path).
/// A path ends at the first character that cannot be part of one; trailing `.`/`,` go.
fn doc_paths(prefix: &str) -> Vec<(String, String)> {
    let mut out = Vec::new();
    for file in common::doc_files() {
        let text = std::fs::read_to_string(&file).unwrap();
        let mut rest = text.as_str();
        while let Some(at) = rest.find(prefix) {
            let before = rest[..at].chars().last();
            let tail = &rest[at..];
            let end = tail
                .find(|c: char| !(c.is_ascii_alphanumeric() || "/._-".contains(c)))
                .unwrap_or(tail.len());
            rest = &tail[end..];
            // Part of a longer path (e.g. /usr/local/bin/...) is not this prefix's.
            if before.is_some_and(|c| c.is_ascii_alphanumeric() || "/._-".contains(c)) {
                continue;
            }
            let path = tail[..end].trim_end_matches(['.', ',']);
            out.push((file.display().to_string(), path.to_string()));
        }
    }
    out
}

/// Every program path, unit path and documentation path the README and the book name in
/// the package's directories is one the package installs: the `health` timer, Nagios and
/// Icinga examples, the backup timer and the installs all call `/usr/bin/replay-guard`
/// (a unit naming a path the package does not install fails with 203/EXEC).
#[test]
fn every_package_path_the_docs_name_is_one_the_package_installs() {
    let dir = tempfile::tempdir().unwrap();
    let deb = build_deb(dir.path());
    let root = dir.path().join("root");
    output(Command::new("dpkg").arg("-x").arg(&deb).arg(&root));
    let mut checked = 0;
    let mut missing = Vec::new();
    for prefix in [
        "/usr/bin/",
        "/usr/local/bin/replay-guard",
        "/bin/replay-guard",
        "/usr/lib/systemd/system/",
        "/usr/share/doc/replay-guard",
        "/etc/replay-guard/replay-guard.toml",
        "/etc/replay-guard/relay.toml",
        "/etc/replay-guard/mqtt-password",
    ] {
        for (doc, path) in doc_paths(prefix) {
            // A unit the examples ask the operator to write is not the package's.
            if path.starts_with("/usr/bin/") && !path.starts_with("/usr/bin/replay-guard") {
                continue;
            }
            checked += 1;
            if !root.join(path.trim_start_matches('/')).exists() {
                missing.push(format!("{doc}: {path}"));
            }
        }
    }
    assert!(
        missing.is_empty(),
        "paths the docs name that the package does not install:\n{}",
        missing.join("\n")
    );
    assert!(checked >= 20, "only {checked} paths checked");
}

#[test]
fn man_and_completions_print_or_write_what_the_package_holds() {
    let page = common::run(&["man"]);
    assert_eq!(page.status.code(), Some(0));
    let text = String::from_utf8_lossy(&page.stdout);
    assert!(text.contains(".TH replay-guard 1"), "{text}");
    assert!(text.contains("relay"), "subcommands listed: {text}");

    let dir = tempfile::tempdir().unwrap();
    let pages = dir.path().join("man");
    let out = common::run(&["man", "--dir", pages.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    let written: BTreeSet<String> = std::fs::read_dir(&pages)
        .unwrap()
        .map(|e| format!("{}.gz", e.unwrap().file_name().to_string_lossy()))
        .collect();
    assert_eq!(written, man_pages());

    for (shell, want) in [
        ("bash", "-o default replay-guard"),
        ("zsh", "#compdef replay-guard"),
        ("fish", "complete -c replay-guard"),
    ] {
        let out = common::run(&["completions", shell]);
        assert_eq!(out.status.code(), Some(0), "{shell}");
        let script = String::from_utf8_lossy(&out.stdout);
        assert!(script.contains(want), "{shell}: {script}");
        assert!(
            script.contains("dump-audit"),
            "{shell} completes subcommands"
        );
    }
    let out = common::run(&["completions", "tcsh"]);
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("possible values: bash, zsh, fish"), "{err}");

    // A directory that cannot be made: exit 1, in words.
    let file = dir.path().join("plain");
    std::fs::write(&file, "").unwrap();
    let out = common::run(&["man", "--dir", file.join("sub").to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("cannot write manual pages into"), "{err}");
}
