//! TLS to PostgreSQL against a PostgreSQL server of the test's own (harness below): initdb in
//! a temp dir, a free loopback port, its socket in the temp dir, a server certificate for
//! 127.0.0.1 signed by a CA made with openssl; stopped (`-m immediate`) when the guard goes.
//! The shared server on 5432 is not touched. Each `sslmode`: verify-full commits a feed
//! through `ingest` and `verify` passes, another CA and another host name are refused in
//! words (`run` and `ingest` exit 1 at once: a configuration error, not an outage to wait
//! for), require takes any certificate, require against a server without TLS fails, prefer
//! and disable; a SCRAM password bound to the channel; a client certificate; the relay's
//! postgres sink over verify-full, and its refusals said as such. Whether a session is encrypted is read from the server's
//! `pg_stat_ssl`, not assumed.

use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::{Duration, Instant};

use replay_guard::config::Config;
use replay_guard::store::StoreOptions;
use replay_guard::store::postgres::{PgConfig, PgStore};

use super::broker::free_port;
use super::common;
use super::tls::make_pki;

/// A PostgreSQL server of this test's own; stopped when dropped, panics included.
struct PgServer {
    dir: tempfile::TempDir,
    bindir: PathBuf,
    port: u16,
}

/// The newest installed server's programs (Debian: /usr/lib/postgresql/N/bin), else
/// `pg_config --bindir`. `scripts/test.sh` installs the server package if initdb is missing.
fn bindir() -> PathBuf {
    let mut found: Vec<(u32, PathBuf)> = std::fs::read_dir("/usr/lib/postgresql")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| {
            let version = e.file_name().to_str()?.parse().ok()?;
            let bin = e.path().join("bin");
            bin.join("initdb").exists().then_some((version, bin))
        })
        .collect();
    found.sort();
    if let Some((_, bin)) = found.pop() {
        return bin;
    }
    let out = Command::new("pg_config").arg("--bindir").output();
    let bin = out
        .ok()
        .map(|o| PathBuf::from(String::from_utf8_lossy(&o.stdout).trim()))
        .filter(|b| b.join("initdb").exists());
    bin.expect("PostgreSQL's initdb (the postgresql server package; scripts/test.sh installs it)")
}

fn root() -> bool {
    std::fs::metadata("/proc/self").unwrap().uid() == 0
}

/// initdb refuses to run as root: the server's programs run as `postgres` then.
fn as_server_user(program: &Path) -> Command {
    if root() {
        let mut c = Command::new("runuser");
        c.args(["-u", "postgres", "--"]).arg(program);
        c
    } else {
        Command::new(program)
    }
}

fn ok(what: &str, out: std::io::Result<Output>) -> String {
    let out = out.unwrap_or_else(|e| panic!("{what}: {e}"));
    assert!(
        out.status.success(),
        "{what}: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

/// Gives `path` to the server's user (when the test runs as root).
fn give(path: &Path) {
    if root() {
        let uid: u32 = ok("id", Command::new("id").args(["-u", "postgres"]).output())
            .parse()
            .unwrap();
        std::os::unix::fs::chown(path, Some(uid), None).unwrap();
    }
}

impl PgServer {
    /// With `pki` (a `make_pki` directory): ssl = on with its server certificate, and its CA
    /// trusted for client certificates. Without: ssl = off.
    fn start(pki: Option<&Path>) -> PgServer {
        let dir = tempfile::tempdir().unwrap();
        give(dir.path());
        let bindir = bindir();
        let data = dir.path().join("data");
        ok(
            "initdb",
            as_server_user(&bindir.join("initdb"))
                .arg("-D")
                .arg(&data)
                .args(["-U", "postgres", "-A", "trust", "--no-sync", "-E", "UTF8"])
                .output(),
        );
        let port = free_port();
        let d = dir.path().display();
        let mut conf = format!(
            "listen_addresses = '127.0.0.1'\nport = {port}\nunix_socket_directories = '{d}'\n\
             fsync = off\nsynchronous_commit = off\nfull_page_writes = off\n\
             max_connections = 20\nshared_buffers = 16MB\n"
        );
        if let Some(pki) = pki {
            for f in ["server.pem", "server.key", "ca.pem"] {
                let to = dir.path().join(f);
                std::fs::copy(pki.join(f), &to).unwrap();
                std::fs::set_permissions(&to, std::fs::Permissions::from_mode(0o600)).unwrap();
                give(&to);
            }
            conf.push_str(&format!(
                "ssl = on\nssl_cert_file = '{d}/server.pem'\nssl_key_file = '{d}/server.key'\n\
                 ssl_ca_file = '{d}/ca.pem'\n"
            ));
        } else {
            conf.push_str("ssl = off\n");
        }
        let append = |file: &str, text: &str| {
            let path = data.join(file);
            let mut all = if file == "pg_hba.conf" {
                String::new()
            } else {
                std::fs::read_to_string(&path).unwrap()
            };
            all.push_str(text);
            std::fs::write(&path, all).unwrap();
        };
        append("postgresql.conf", &conf);
        append(
            "pg_hba.conf",
            "local all all trust\n\
             hostssl all rg_scram 127.0.0.1/32 scram-sha-256\n\
             hostssl all rg-client 127.0.0.1/32 cert\n\
             host all all 127.0.0.1/32 trust\n",
        );
        let server = PgServer { dir, bindir, port };
        ok(
            "pg_ctl start",
            as_server_user(&server.bindir.join("pg_ctl"))
                .arg("-D")
                .arg(&data)
                .arg("-l")
                .arg(server.dir.path().join("log"))
                .args(["-w", "-t", "20", "start"])
                .output(),
        );
        server.psql(
            "CREATE ROLE rg_scram LOGIN SUPERUSER PASSWORD 'hunter2'; \
             CREATE ROLE \"rg-client\" LOGIN SUPERUSER",
        );
        server
    }

    /// `psql` as postgres over the server's Unix socket (never TLS); rows one a line.
    fn psql(&self, sql: &str) -> String {
        ok(
            "psql",
            Command::new("psql")
                .arg("-h")
                .arg(self.dir.path())
                .args([
                    "-p",
                    &self.port.to_string(),
                    "-U",
                    "postgres",
                    "-d",
                    "postgres",
                ])
                .args(["-X", "-A", "-t", "-q", "-v", "ON_ERROR_STOP=1", "-c", sql])
                .output(),
        )
    }

    /// A dsn to this server over TCP; `extra` adds keys (`sslmode=...`).
    fn dsn(&self, extra: &str) -> String {
        format!(
            "host=127.0.0.1 port={} user=postgres dbname=postgres connect_timeout=5 {extra}",
            self.port
        )
    }

    /// Whether the connections with `application_name` are encrypted, as the server sees them.
    fn ssl_of(&self, application_name: &str) -> Vec<String> {
        self.psql(&format!(
            "SELECT s.ssl FROM pg_stat_ssl s JOIN pg_stat_activity a USING (pid) \
             WHERE a.application_name = '{application_name}'"
        ))
        .lines()
        .map(str::to_string)
        .collect()
    }
}

impl Drop for PgServer {
    fn drop(&mut self) {
        let _ = as_server_user(&self.bindir.join("pg_ctl"))
            .arg("-D")
            .arg(self.dir.path().join("data"))
            .args(["-m", "immediate", "-w", "stop"])
            .output();
    }
}

/// A CA and a server certificate for IP 127.0.0.1 (`tls::make_pki`), in a temp dir.
fn pki(ca_name: &str) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    make_pki(dir.path(), ca_name);
    dir
}

/// Opens the store over `dsn`, and says whether the server sees that session encrypted.
fn open_store(server: &PgServer, dsn: &str) -> Result<bool, String> {
    let app = format!("rg_tls_{}", free_port());
    let cfg = PgConfig::parse(&format!("{dsn} application_name={app}"), "replay_guard")
        .map_err(|e| e.to_string())?;
    let store = PgStore::open(cfg, StoreOptions::default(), 1_000).map_err(|e| e.to_string())?;
    let ssl = server.ssl_of(&app);
    drop(store);
    assert_eq!(ssl.len(), 1, "one session named {app}: {ssl:?}");
    Ok(ssl[0] == "t")
}

fn store_config(dir: &Path, dsn: &str) -> PathBuf {
    let path = dir.join("rg.toml");
    std::fs::write(
        &path,
        format!("[store]\nbackend = \"postgres\"\ndsn = {dsn:?}\nschema = \"rg_tls\"\n"),
    )
    .unwrap();
    path
}

fn text(out: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

#[test]
fn pg_tls_verify_full_with_the_right_ca_commits_a_feed_and_verify_passes() {
    let pki = pki("rg-pg-ca");
    let server = PgServer::start(Some(pki.path()));
    let ca = pki.path().join("ca.pem");
    let dsn = server.dsn(&format!("sslmode=verify-full sslrootcert={}", ca.display()));
    let cfg = store_config(pki.path(), &dsn);
    let feed: String = (1..=20)
        .map(|seq| common::msg("fd", "e1", 1, seq, "casualties 0") + "\n")
        .collect();
    let t0 = Instant::now();
    let out = common::run_with_stdin(
        &["ingest", "--config", cfg.to_str().unwrap(), "-"],
        feed.as_bytes(),
    );
    assert_eq!(out.status.code(), Some(0), "ingest: {}", text(&out));
    let verify = common::run(&["verify", "--config", cfg.to_str().unwrap()]);
    assert_eq!(verify.status.code(), Some(0), "verify: {}", text(&verify));
    assert!(t0.elapsed() < Duration::from_secs(20));
    assert_eq!(server.psql("SELECT count(*) FROM rg_tls.effects"), "20");
    assert!(
        open_store(&server, &dsn).unwrap(),
        "verify-full is encrypted"
    );
}

#[test]
fn pg_tls_verify_full_with_another_ca_is_refused_in_words_without_the_password() {
    let pki = pki("rg-pg-ca");
    let other = self::pki("someone-else");
    let server = PgServer::start(Some(pki.path()));
    let dsn = server.dsn(&format!(
        "password=hunter2 sslmode=verify-full sslrootcert={}",
        other.path().join("ca.pem").display()
    ));
    let cfg = store_config(pki.path(), &dsn);
    let out = common::run(&["verify", "--config", cfg.to_str().unwrap()]);
    let said = text(&out);
    assert_eq!(out.status.code(), Some(1), "a configuration error: {said}");
    assert!(
        said.contains(&format!(
            "not trusted by sslrootcert {}",
            other.path().join("ca.pem").display()
        )),
        "{said}"
    );
    assert!(!said.contains("hunter2"), "{said}");
    let e = open_store(&server, &dsn).unwrap_err();
    assert!(
        e.contains("not trusted by sslrootcert") && !e.contains("hunter2"),
        "{e}"
    );
}

#[test]
fn pg_tls_verify_full_refuses_a_certificate_for_another_host_name_and_verify_ca_takes_it() {
    let pki = pki("rg-pg-ca");
    let server = PgServer::start(Some(pki.path()));
    let ca = pki.path().join("ca.pem");
    // TCP to 127.0.0.1, but the name checked is localhost: the certificate names only the IP.
    let by_name = |mode: &str| {
        format!(
            "host=localhost hostaddr=127.0.0.1 port={} user=postgres dbname=postgres \
             sslmode={mode} sslrootcert={}",
            server.port,
            ca.display()
        )
    };
    let e = open_store(&server, &by_name("verify-full")).unwrap_err();
    assert!(e.contains("host name mismatch"), "{e}");
    assert!(e.contains("not valid for localhost"), "{e}");
    assert!(open_store(&server, &by_name("verify-ca")).unwrap());
}

#[test]
fn pg_tls_require_encrypts_with_a_certificate_nobody_vouches_for() {
    let pki = pki("rg-pg-ca");
    let server = PgServer::start(Some(pki.path()));
    assert!(open_store(&server, &server.dsn("sslmode=require")).unwrap());
    assert!(open_store(&server, &server.dsn("sslmode=prefer")).unwrap());
    // A given sslrootcert is checked under require too, as libpq does.
    let other = self::pki("someone-else");
    let e = open_store(
        &server,
        &server.dsn(&format!(
            "sslmode=require sslrootcert={}",
            other.path().join("ca.pem").display()
        )),
    )
    .unwrap_err();
    assert!(e.contains("not trusted by sslrootcert"), "{e}");
}

#[test]
fn pg_tls_require_against_a_server_without_tls_fails_and_prefer_and_disable_stay_plain() {
    let server = PgServer::start(None);
    let e = open_store(&server, &server.dsn("sslmode=require")).unwrap_err();
    assert!(e.contains("server does not support TLS"), "{e}");
    assert!(!open_store(&server, &server.dsn("sslmode=prefer")).unwrap());
    assert!(!open_store(&server, &server.dsn("sslmode=disable")).unwrap());
    assert!(!open_store(&server, &server.dsn("")).unwrap());
}

#[test]
fn pg_tls_disable_and_no_sslmode_stay_plain_on_a_server_that_offers_tls() {
    let pki = pki("rg-pg-ca");
    let server = PgServer::start(Some(pki.path()));
    assert!(!open_store(&server, &server.dsn("sslmode=disable")).unwrap());
    assert!(!open_store(&server, &server.dsn("")).unwrap());
    // prefer over the Unix socket: the server declines TLS there, and the session is plain.
    let socket = format!(
        "host={} port={} user=postgres dbname=postgres sslmode=prefer",
        server.dir.path().display(),
        server.port
    );
    assert!(!open_store(&server, &socket).unwrap());
}

#[test]
fn pg_tls_a_scram_password_is_bound_to_the_tls_channel_and_a_client_certificate_logs_in() {
    let pki = pki("rg-pg-ca");
    let server = PgServer::start(Some(pki.path()));
    // channel_binding=require: SCRAM-SHA-256-PLUS or nothing, so the tls-server-end-point
    // hash must be the one the server computes.
    let scram = format!(
        "host=127.0.0.1 port={} user=rg_scram password=hunter2 dbname=postgres \
         channel_binding=require",
        server.port
    );
    let scram = format!("{scram} sslmode=require");
    assert!(open_store(&server, &scram).unwrap());
    let e = open_store(&server, &scram.replace("hunter2", "wrong")).unwrap_err();
    assert!(
        e.contains("password authentication failed") || e.contains("28P01"),
        "{e}"
    );
    assert!(!e.contains("wrong"), "{e}");
    let cert = |keys: &str| {
        format!(
            "host=127.0.0.1 port={} user=rg-client dbname=postgres sslmode=verify-full \
             sslrootcert={} {keys}",
            server.port,
            pki.path().join("ca.pem").display()
        )
    };
    let with = format!(
        "sslcert={} sslkey={}",
        pki.path().join("client.pem").display(),
        pki.path().join("client.key").display()
    );
    assert!(open_store(&server, &cert(&with)).unwrap());
    let e = open_store(&server, &cert("")).unwrap_err();
    assert!(e.contains("certificate"), "{e}");
}

#[test]
fn pg_tls_the_relay_postgres_sink_delivers_over_verify_full() {
    use replay_guard::relay::{CursorAfter, Sink};
    let pki = pki("rg-pg-ca");
    let server = PgServer::start(Some(pki.path()));
    let dsn = server.dsn(&format!(
        "sslmode=verify-full sslrootcert={}",
        pki.path().join("ca.pem").display()
    ));
    let config = Config::parse(&format!(
        "[[sink]]\nname = \"cop-db\"\nkind = \"postgres\"\ndsn = {dsn:?}\n\
         table = \"cop_events\"\ntimeout_ms = 5000\n"
    ))
    .unwrap();
    let mut sink = Sink::new(&config.relay.sinks[0]).unwrap();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let batch: Vec<_> = (0..3).map(|o| super::relay_pg::event(o, "b")).collect();
    let cursor = CursorAfter {
        store: [7; 16],
        generation: 0,
        next_after: 3,
    };
    let attempt = rt.block_on(sink.deliver(&batch, cursor));
    assert_eq!(attempt.delivered, 3, "{:?}", attempt.failure);
    assert_eq!(server.psql("SELECT count(*) FROM cop_events"), "3");
    assert_eq!(
        server.psql(
            "SELECT bool_and(s.ssl) FROM pg_stat_ssl s JOIN pg_stat_activity a USING (pid) \
             WHERE a.application_name = 'replay-guard sink cop-db'"
        ),
        "t"
    );
}

/// The two refusals of a `verify-full` dsn to `server`: (what, dsn, words the error carries).
fn refused_dsns(
    server: &PgServer,
    ca: &Path,
    other_ca: &Path,
) -> [(&'static str, String, String); 2] {
    [
        (
            "another CA",
            server.dsn(&format!(
                "password=hunter2 sslmode=verify-full sslrootcert={}",
                other_ca.display()
            )),
            format!("not trusted by sslrootcert {}", other_ca.display()),
        ),
        (
            "another host name",
            // TCP to 127.0.0.1, but the name checked is localhost: the certificate names the IP.
            format!(
                "host=localhost hostaddr=127.0.0.1 port={} user=postgres password=hunter2 \
                 dbname=postgres connect_timeout=5 sslmode=verify-full sslrootcert={}",
                server.port,
                ca.display()
            ),
            "host name mismatch: the server's certificate is not valid for localhost".into(),
        ),
    ]
}

#[test]
fn pg_tls_a_refused_certificate_or_host_name_makes_run_and_ingest_exit_1_at_once_naming_it() {
    let pki = pki("rg-pg-ca");
    let other = self::pki("someone-else");
    let server = PgServer::start(Some(pki.path()));
    let dir = tempfile::tempdir().unwrap();
    // No broker listens: `run` must stop before it would connect to one.
    let mqtt = format!(
        "[mqtt]\nbrokers = [\"mqtt://127.0.0.1:{}\"]\nclient_id = \"rg-tls-refused\"\n\
         topics = [\"t/#\"]\n",
        free_port()
    );
    let ca = pki.path().join("ca.pem");
    for (what, dsn, words) in refused_dsns(&server, &ca, &other.path().join("ca.pem")) {
        let cfg = store_config(dir.path(), &dsn);
        let store = std::fs::read_to_string(&cfg).unwrap();
        std::fs::write(&cfg, format!("{store}{mqtt}")).unwrap();
        let cfg = cfg.to_str().unwrap();
        let start = Instant::now();
        let mut child = Command::new(common::bin())
            .args(["run", "--config", cfg])
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        let status = loop {
            if let Some(status) = child.try_wait().unwrap() {
                break status;
            }
            if start.elapsed() > Duration::from_secs(20) {
                let _ = child.kill();
                let out = child.wait_with_output().unwrap();
                panic!(
                    "{what}: run still waits after 20 s:\n{}",
                    String::from_utf8_lossy(&out.stderr)
                );
            }
            std::thread::sleep(Duration::from_millis(20));
        };
        let took = start.elapsed();
        let mut log = String::new();
        std::io::Read::read_to_string(child.stderr.as_mut().unwrap(), &mut log).unwrap();
        eprintln!("{what}: run exited {status} after {took:?}");
        assert_eq!(status.code(), Some(1), "{what}: {log}");
        assert!(log.contains(&words), "{what}: {log}");
        assert!(log.contains("a configuration error"), "{what}: {log}");
        assert!(!log.contains("unreachable"), "{what}: {log}");
        assert!(!log.contains("hunter2"), "{what}: {log}");
        assert!(took < Duration::from_secs(10), "{what}: {took:?}");

        let start = Instant::now();
        let out = common::run_with_stdin(
            &["ingest", "--config", cfg, "-"],
            (common::msg("fd", "e1", 1, 1, "x") + "\n").as_bytes(),
        );
        let said = text(&out);
        assert_eq!(out.status.code(), Some(1), "{what}: {said}");
        assert!(said.contains(&words), "{what}: {said}");
        assert!(
            !said.contains("try again once the server answers"),
            "{what}: {said}"
        );
        assert!(!said.contains("hunter2"), "{what}: {said}");
        assert!(start.elapsed() < Duration::from_secs(10), "{what}");
    }
    assert_eq!(
        server.psql("SELECT count(*) FROM pg_namespace WHERE nspname = 'rg_tls'"),
        "0",
        "nothing was made through a refused handshake"
    );
}

#[test]
fn pg_tls_the_postgres_sink_says_a_refused_certificate_or_host_name_is_a_configuration_error() {
    use replay_guard::relay::{CursorAfter, Failure, Sink};
    let pki = pki("rg-pg-ca");
    let other = self::pki("someone-else");
    let server = PgServer::start(Some(pki.path()));
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let ca = pki.path().join("ca.pem");
    for (what, dsn, words) in refused_dsns(&server, &ca, &other.path().join("ca.pem")) {
        let config = Config::parse(&format!(
            "[[sink]]\nname = \"cop-db\"\nkind = \"postgres\"\ndsn = {dsn:?}\n\
             table = \"cop_events\"\ntimeout_ms = 5000\n"
        ))
        .unwrap();
        let mut sink = Sink::new(&config.relay.sinks[0]).unwrap();
        let batch: Vec<_> = (0..3).map(|o| super::relay_pg::event(o, "b")).collect();
        let cursor = CursorAfter {
            store: [7; 16],
            generation: 0,
            next_after: 3,
        };
        let attempt = rt.block_on(sink.deliver(&batch, cursor));
        assert_eq!(attempt.delivered, 0, "{what}");
        // A sink cannot stop the process: it retries, and says why in words.
        let Some(Failure::Retry { error, .. }) = attempt.failure else {
            panic!("{what}: {:?}", attempt.failure)
        };
        assert!(error.contains(&words), "{what}: {error}");
        assert!(error.contains("TLS to PostgreSQL"), "{what}: {error}");
        assert!(
            error.contains("a configuration error, not an outage"),
            "{what}: {error}"
        );
        assert!(!error.contains("hunter2"), "{what}: {error}");
    }
    assert_eq!(
        server.psql("SELECT count(*) FROM pg_class WHERE relname = 'cop_events'"),
        "0"
    );
}
