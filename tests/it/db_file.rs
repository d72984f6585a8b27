//! The database path through the real binary: only a regular file or a missing path is ever
//! opened or created (a FIFO, a device behind a symlink, a directory and a zero-length file are
//! refused untouched), every path to one file meets the same feed-writer lock, new files are
//! 0600 whatever the umask, and a failed open leaves nothing behind.

use std::collections::BTreeSet;
use std::io::Write as _;
use std::os::unix::fs::{FileTypeExt as _, PermissionsExt as _};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use crate::common;

fn feed() -> String {
    concat!(env!("CARGO_MANIFEST_DIR"), "/examples/feed.jsonl").to_string()
}

fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

/// A `run` config whose broker is never reached (`run` opens the database first).
fn run_config(dir: &Path) -> PathBuf {
    let path = dir.join("run.toml");
    std::fs::write(
        &path,
        "[mqtt]\nbrokers = [\"mqtt://127.0.0.1:9\"]\nclient_id = \"db-file-test\"\n\
         topics = [\"t/#\"]\n",
    )
    .unwrap();
    path
}

/// Runs the binary with `args` (stdin closed), killing it after 20 s: a hang fails the test
/// instead of stalling the suite.
fn run_bounded(args: &[&str]) -> Output {
    spawn_bounded(Command::new(common::bin()), args)
}

/// Runs `command` with `args` appended (stdin closed, output captured), bounded as
/// `run_bounded` is.
fn spawn_bounded(mut command: Command, args: &[&str]) -> Output {
    let child = command
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    wait_bounded(child, args)
}

fn wait_bounded(mut child: Child, what: &[&str]) -> Output {
    let deadline = Instant::now() + Duration::from_secs(20);
    while child.try_wait().unwrap().is_none() {
        if Instant::now() > deadline {
            child.kill().unwrap();
            child.wait().unwrap();
            panic!("replay-guard {what:?} hung");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    child.wait_with_output().unwrap()
}

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// Asserts exit 2 and one line on stderr containing every needle.
fn refused(out: &Output, needles: &[&str]) {
    let err = stderr(out);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert_eq!(err.trim_end().lines().count(), 1, "not one line: {err}");
    for n in needles {
        assert!(err.contains(n), "{n:?} not in: {err}");
    }
}

/// Names in `dir` (hidden ones included).
fn listing(dir: &Path) -> BTreeSet<String> {
    std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect()
}

/// Every command, each given the database `db` (and the input `feed` for `ingest`).
fn every_command(db: &str, cfg: &str) -> Vec<Vec<String>> {
    let key = "258a39cc3f0c92fa60dba8e7ba9b0b86aa499b4773d2629e7332dd587c23fc7c";
    let f = feed();
    [
        vec!["ingest", "--db", db, &f],
        vec!["ingest", "--new-database", "--db", db, &f],
        vec!["run", "--config", cfg, "--db", db],
        vec!["dump-audit", "--db", db],
        vec!["dump-effects", "--db", db],
        vec!["dump-quarantine", "--db", db],
        vec!["verify", "--db", db],
        vec!["stats", "--db", db],
        vec!["gaps", "--db", db],
        vec!["report", "--db", db, "-o", "-"],
        vec!["explain", "--db", db, key],
        vec!["compact", "--db", db],
        vec!["quarantine", "discard", "0", "--db", db, "--reason", "test"],
    ]
    .iter()
    .map(|a| a.iter().map(|s| s.to_string()).collect())
    .collect()
}

fn mkfifo(path: &Path) {
    let st = Command::new("mkfifo").arg(path).status().unwrap();
    assert!(st.success(), "mkfifo failed");
}

#[test]
fn a_fifo_at_the_database_path_is_refused_by_every_command_without_hanging() {
    let dir = tempfile::tempdir().unwrap();
    let fifo = dir.path().join("db.redb");
    mkfifo(&fifo);
    let cfg = run_config(dir.path());
    let before = listing(dir.path());
    for args in every_command(s(&fifo), s(&cfg)) {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let out = run_bounded(&args);
        refused(&out, &["is a FIFO, not a database file"]);
        let t = std::fs::symlink_metadata(&fifo).unwrap().file_type();
        assert!(t.is_fifo(), "{args:?} replaced the FIFO");
        assert_eq!(listing(dir.path()), before, "{args:?} left a file behind");
    }
}

#[test]
fn a_device_behind_a_symlink_is_never_replaced_or_written() {
    let dir = tempfile::tempdir().unwrap();
    let link = dir.path().join("db.redb");
    std::os::unix::fs::symlink("/dev/null", &link).unwrap();
    let null_before = std::fs::metadata("/dev/null").unwrap();
    assert!(null_before.file_type().is_char_device());
    let cfg = run_config(dir.path());
    let before = listing(dir.path());
    for args in every_command(s(&link), s(&cfg)) {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let out = run_bounded(&args);
        refused(&out, &["is a character device, not a database file"]);
        assert_eq!(
            std::fs::read_link(&link).unwrap(),
            Path::new("/dev/null"),
            "{args:?} replaced the symlink"
        );
        let null = std::fs::metadata("/dev/null").unwrap();
        assert!(null.file_type().is_char_device(), "{args:?}: /dev/null");
        assert_eq!(
            std::os::unix::fs::MetadataExt::rdev(&null),
            std::os::unix::fs::MetadataExt::rdev(&null_before)
        );
        assert_eq!(listing(dir.path()), before, "{args:?} left a file behind");
    }
}

#[test]
fn a_directory_at_the_database_path_is_refused_and_left_alone() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path().join("db.redb");
    std::fs::create_dir(&d).unwrap();
    std::fs::write(d.join("keep"), b"x").unwrap();
    let cfg = run_config(dir.path());
    for args in every_command(s(&d), s(&cfg)) {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        refused(
            &run_bounded(&args),
            &["is a directory, not a database file"],
        );
        assert_eq!(std::fs::read(d.join("keep")).unwrap(), b"x");
    }
    assert_eq!(listing(dir.path()).len(), 2, "{:?}", listing(dir.path()));
}

#[test]
fn a_zero_length_database_file_is_refused_until_the_operator_asks_for_a_new_one() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("db.redb");
    std::fs::write(&db, b"").unwrap();
    let cfg = run_config(dir.path());
    let f = feed();
    for args in [
        vec!["ingest", "--db", s(&db), &f],
        vec!["run", "--config", s(&cfg), "--db", s(&db)],
    ] {
        let out = run_bounded(&args);
        refused(
            &out,
            &[
                "is empty (0 bytes)",
                "restore it from the backup",
                "--new-database",
            ],
        );
        assert_eq!(std::fs::metadata(&db).unwrap().len(), 0, "{args:?}");
    }
    for cmd in ["dump-audit", "verify", "stats", "compact"] {
        refused(
            &run_bounded(&[cmd, "--db", s(&db)]),
            &["is empty (0 bytes)"],
        );
    }

    // Asked for explicitly: a new database replaces the empty file.
    let out = run_bounded(&["ingest", "--new-database", "--db", s(&db), &f]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let rows = |db: &Path| {
        let out = run_bounded(&["dump-audit", "--db", s(db)]);
        assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
        out.stdout
            .split(|&b| b == b'\n')
            .filter(|l| !l.is_empty())
            .count()
    };
    assert_eq!(rows(&db), 14);
    // The flag never replaces a file that holds data.
    let out = run_bounded(&["ingest", "--new-database", "--db", s(&db), &f]);
    refused(&out, &["--new-database", "already holds data"]);
    let out = run_bounded(&["run", "--new-database", "--config", s(&cfg), "--db", s(&db)]);
    refused(&out, &["--new-database", "already holds data"]);
    assert_eq!(rows(&db), 14);
    assert_eq!(
        listing(dir.path()),
        ["db.redb", "run.toml"].map(String::from).into(),
        "no temporary or lock file is left"
    );
}

/// Starts `ingest --db db -` and waits until it has committed one line: it then holds the
/// feed lock until its stdin is closed.
fn holding_writer(db: &Path) -> (Child, std::process::ChildStdin) {
    let mut writer = Command::new(common::bin())
        .args(["ingest", "--db", s(db), "-"])
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut stdin = writer.stdin.take().unwrap();
    stdin
        .write_all((common::msg("Z", "Z", 0, 1, "x") + "\n").as_bytes())
        .unwrap();
    stdin.flush().unwrap();
    common::wait_until("the writer commits", Duration::from_secs(20), || {
        let out = run_bounded(&["dump-audit", "--db", s(db)]);
        out.status.success() && !out.stdout.is_empty()
    });
    (writer, stdin)
}

#[test]
fn a_second_feed_writer_through_a_symlink_or_a_hard_link_is_refused_naming_the_first() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("a.redb");
    let sym = dir.path().join("sym.redb");
    let hard = dir.path().join("hard.redb");
    let cfg = run_config(dir.path());
    let (writer, stdin) = holding_writer(&db);
    std::os::unix::fs::symlink("a.redb", &sym).unwrap();
    std::fs::hard_link(&db, &hard).unwrap();
    let pid = format!("PID {}", writer.id());
    let f = feed();
    for other in [&sym, &hard, &db] {
        for args in [
            vec!["ingest", "--db", s(other), &f],
            vec!["run", "--config", s(&cfg), "--db", s(other)],
        ] {
            let out = run_bounded(&args);
            refused(&out, &["another process is writing", &pid, "ingest"]);
        }
        // `compact` names the real holder, whichever path it was given.
        let out = run_bounded(&["compact", "--db", s(other)]);
        refused(
            &out,
            &[
                "in use by `run` or `ingest`",
                &pid,
                "stop the service first",
            ],
        );
    }
    // Operator writes and readers still work alongside, through any path.
    let out = run_bounded(&["dump-audit", "--db", s(&hard)]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));

    drop(stdin);
    let out = wait_bounded(writer, &["ingest"]);
    assert_eq!(out.status.code(), Some(0));
    // Released on exit: the next writer gets in through the symlink.
    let out = run_bounded(&["ingest", "--db", s(&sym), &f]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert_eq!(
        listing(dir.path()),
        ["a.redb", "hard.redb", "run.toml", "sym.redb"]
            .map(String::from)
            .into(),
        "no lock file is left"
    );
}

#[test]
fn the_feed_lock_is_released_by_kill_9() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("a.redb");
    let (mut writer, _stdin) = holding_writer(&db);
    writer.kill().unwrap();
    writer.wait().unwrap();
    let out = run_bounded(&["ingest", "--db", s(&db), &feed()]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let out = run_bounded(&["compact", "--db", s(&db)]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
}

/// Runs `sh -c 'umask U; exec replay-guard ARGS'` (the umask is per process).
fn with_umask(umask: &str, args: &[&str], env: &[(&str, &Path)]) -> Output {
    let mut cmd = Command::new("sh");
    cmd.arg("-c")
        .arg(format!("umask {umask}; exec \"$0\" \"$@\""))
        .arg(common::bin())
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    for (k, v) in env {
        cmd.env(k, v);
    }
    wait_bounded(cmd.spawn().unwrap(), args)
}

fn mode(p: &Path) -> u32 {
    std::fs::metadata(p).unwrap().permissions().mode() & 0o7777
}

#[test]
fn new_databases_are_0600_whatever_the_umask() {
    for umask in ["022", "000"] {
        let dir = tempfile::tempdir().unwrap();
        let db = dir.path().join("db.redb");
        let out = with_umask(umask, &["ingest", "--db", s(&db), &feed()], &[]);
        assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
        assert_eq!(mode(&db), 0o600, "umask {umask}");
        assert_eq!(
            listing(dir.path()),
            ["db.redb"].map(String::from).into(),
            "umask {umask}: only the database"
        );

        // `--new-database` over an empty file the operator made 0644.
        let other = dir.path().join("other.redb");
        std::fs::write(&other, b"").unwrap();
        std::fs::set_permissions(&other, std::fs::Permissions::from_mode(0o644)).unwrap();
        let args = ["ingest", "--new-database", "--db", s(&other), "/dev/null"];
        let out = with_umask(umask, &args, &[]);
        assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
        assert_eq!(mode(&other), 0o600, "umask {umask}");
    }
}

#[test]
fn the_demo_directory_is_0700_and_its_database_0600_whatever_the_umask() {
    let tmp = tempfile::tempdir().unwrap();
    let out = with_umask(
        "000",
        &["demo", "--messages", "40"],
        &[("TMPDIR", tmp.path())],
    );
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let dirs: Vec<PathBuf> = std::fs::read_dir(tmp.path())
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| {
            p.file_name()
                .unwrap()
                .to_string_lossy()
                .starts_with("replay-guard-demo-")
        })
        .collect();
    assert_eq!(dirs.len(), 1, "{dirs:?}");
    assert_eq!(mode(&dirs[0]), 0o700);
    assert_eq!(mode(&dirs[0].join("demo.redb")), 0o600);
}

#[test]
fn failed_opens_leave_no_file_behind() {
    let dir = tempfile::tempdir().unwrap();
    let notes = dir.path().join("notes.txt");
    std::fs::write(&notes, b"not a database\n").unwrap();
    let cfg = run_config(dir.path());
    let before = listing(dir.path());
    for args in every_command(s(&notes), s(&cfg)) {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let out = run_bounded(&args);
        assert_ne!(out.status.code(), Some(0), "{args:?} accepted a text file");
        assert_eq!(listing(dir.path()), before, "{args:?} left a file behind");
        assert_eq!(
            std::fs::read(&notes).unwrap(),
            b"not a database\n",
            "{args:?}"
        );
    }
    // A database that cannot be created (no such directory) leaves nothing either.
    let out = run_bounded(&["ingest", "--db", s(&dir.path().join("no/db.redb")), &feed()]);
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    assert_eq!(listing(dir.path()), before);
}

/// Runs the binary as `nobody` (root, which the suite runs as, bypasses file permissions).
/// `setpriv` is util-linux's, on every Debian: a missing one fails the test, never skips it.
fn run_as_nobody(bin: &Path, args: &[&str]) -> Output {
    let setpriv = ["/usr/bin/setpriv", "/bin/setpriv"]
        .into_iter()
        .find(|p| Path::new(p).exists())
        .expect("setpriv (util-linux) is needed to run the binary as another user");
    let mut command = Command::new(setpriv);
    command
        .args(["--reuid=nobody", "--regid=nogroup", "--clear-groups"])
        .arg(bin);
    spawn_bounded(command, args)
}

#[test]
fn a_database_another_user_may_not_read_is_reported_as_permission_denied_not_missing() {
    let dir = tempfile::tempdir().unwrap();
    // The binary must be reachable by `nobody`, whatever the checkout's modes.
    let bin = dir.path().join("replay-guard");
    std::fs::copy(common::bin(), &bin).unwrap();
    std::fs::set_permissions(&bin, std::fs::Permissions::from_mode(0o755)).unwrap();
    // A 0600 file in a traversable directory, and one in a directory `nobody` cannot search
    // (systemd's StateDirectoryMode=0700).
    let open = dir.path().join("open");
    let closed = dir.path().join("closed");
    for (d, m) in [(&open, 0o711), (&closed, 0o700)] {
        std::fs::create_dir(d).unwrap();
        let db = d.join("db.redb");
        let out = common::run(&["ingest", "--db", s(&db), &feed()]);
        assert!(out.status.success(), "{}", stderr(&out));
        std::fs::set_permissions(&db, std::fs::Permissions::from_mode(0o600)).unwrap();
        std::fs::set_permissions(d, std::fs::Permissions::from_mode(m)).unwrap();
    }
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o711)).unwrap();
    for d in [&open, &closed] {
        let db = d.join("db.redb");
        for cmd in ["health", "stats", "verify", "dump-audit"] {
            let out = run_as_nobody(&bin, &[cmd, "--db", s(&db)]);
            let text = format!(
                "{}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            );
            assert!(!out.status.success(), "{cmd} on {}: {text}", db.display());
            assert!(
                text.contains(&format!("permission denied on {}", db.display())),
                "{cmd}: {text}"
            );
            assert!(
                text.contains("as root (sudo) or as the user the service"),
                "{cmd}: {text}"
            );
            assert!(!text.contains("does not exist"), "{cmd}: {text}");
        }
    }
}
