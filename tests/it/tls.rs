//! MQTT over TLS with a CA and a client certificate made in the test (openssl): the consumer
//! verifies the broker and authenticates with its certificate (mTLS); a consumer trusting
//! another CA never gets a delivery; a client key that is not its certificate's is refused
//! when the config loads (`check-config`, and `run` before it opens the database), in
//! `[mqtt]` and in an `mqtt` sink.

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

use super::broker::{Broker, free_port};
use super::common;

fn openssl(dir: &Path, args: &[&str]) {
    let out = Command::new("openssl")
        .args(args)
        .current_dir(dir)
        .stdin(Stdio::null())
        .output()
        .expect("openssl must be installed");
    assert!(
        out.status.success(),
        "openssl {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A CA, a server certificate for 127.0.0.1 and a client certificate, all PEM, in `dir`.
pub(super) fn make_pki(dir: &Path, ca_name: &str) {
    let ca_subj = format!("/CN={ca_name}");
    openssl(
        dir,
        &[
            "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", "ca.key", "-out", "ca.pem",
            "-days", "2", "-subj", &ca_subj,
        ],
    );
    for (name, usage, san) in [
        ("server", "serverAuth", "subjectAltName=IP:127.0.0.1\n"),
        ("client", "clientAuth", ""),
    ] {
        std::fs::write(dir.join(format!("{name}.ext")), format!("{san}basicConstraints=CA:FALSE\nkeyUsage=digitalSignature,keyEncipherment\nextendedKeyUsage={usage}\n")).unwrap();
        openssl(
            dir,
            &[
                "req",
                "-newkey",
                "rsa:2048",
                "-nodes",
                "-keyout",
                &format!("{name}.key"),
                "-out",
                &format!("{name}.csr"),
                "-subj",
                &format!("/CN=rg-{name}"),
            ],
        );
        openssl(
            dir,
            &[
                "x509",
                "-req",
                "-in",
                &format!("{name}.csr"),
                "-CA",
                "ca.pem",
                "-CAkey",
                "ca.key",
                "-CAcreateserial",
                "-out",
                &format!("{name}.pem"),
                "-days",
                "2",
                "-extfile",
                &format!("{name}.ext"),
            ],
        );
    }
}

fn consumer_config(dir: &Path, tls_port: u16, pki: &Path, trusted_ca: &Path) -> std::path::PathBuf {
    let cfg = dir.join("rg.toml");
    std::fs::write(
        &cfg,
        format!(
            "[store]\npath = {:?}\n[mqtt]\nbrokers = [\"mqtts://127.0.0.1:{tls_port}\"]\nclient_id = \"rg-tls\"\ntopics = [\"incidents/#\"]\n\
             ca_file = {:?}\nclient_cert_file = {:?}\nclient_key_file = {:?}\nbackoff_initial_ms = 50\nbackoff_max_ms = 200\n",
            dir.join("rg.redb").to_str().unwrap(),
            trusted_ca.to_str().unwrap(),
            pki.join("client.pem").to_str().unwrap(),
            pki.join("client.key").to_str().unwrap(),
        ),
    )
    .unwrap();
    cfg
}

fn decided(db: &Path) -> u64 {
    replay_guard::store::Reader::open(db)
        .ok()
        .and_then(|r| r.begin().ok())
        .and_then(|s| s.summary().ok())
        .map_or(0, |s| s.audit_entries)
}

#[test]
fn consumer_verifies_the_broker_and_authenticates_with_a_client_certificate() {
    let dir = tempfile::tempdir().unwrap();
    let pki = dir.path().join("pki");
    std::fs::create_dir_all(&pki).unwrap();
    make_pki(&pki, "rg-test-ca");
    let tls_port = free_port();
    let extra = format!(
        "listener {tls_port} 127.0.0.1\ncafile {}\ncertfile {}\nkeyfile {}\nrequire_certificate true\n",
        pki.join("ca.pem").display(),
        pki.join("server.pem").display(),
        pki.join("server.key").display()
    );
    let broker = Broker::start_with(&dir.path().join("broker"), false, &extra);

    let cfg = consumer_config(dir.path(), tls_port, &pki, &pki.join("ca.pem"));
    let log = dir.path().join("rg.log");
    let mut child = common::logged_command(&["run", "--config", cfg.to_str().unwrap()], &log)
        .spawn()
        .unwrap();
    common::wait_subscribed(&log, 0, "");
    let lines: Vec<String> = (0..50)
        .map(|i| common::msg("A", "S", 0, i, "tls"))
        .collect();
    broker.publish_lines("incidents/x", &lines, "pub-tls");
    let db = dir.path().join("rg.redb");
    common::wait_until("50 decided over TLS", Duration::from_secs(20), || {
        decided(&db) >= 50
    });
    super::broker::signal(child.id() as i32, "TERM");
    assert_eq!(child.wait().unwrap().code(), Some(0));
    assert_eq!(common::effects(&db).len(), 50);

    // The same consumer (a client certificate the broker accepts) trusting another CA must
    // refuse the broker: server verification is always on.
    let other = dir.path().join("other");
    std::fs::create_dir_all(&other).unwrap();
    make_pki(&other, "someone-else");
    let dir2 = dir.path().join("c2");
    std::fs::create_dir_all(&dir2).unwrap();
    let cfg2 = consumer_config(&dir2, tls_port, &pki, &other.join("ca.pem"));
    let log2 = dir2.join("rg.log");
    let mut child2 = common::logged_command(&["run", "--config", cfg2.to_str().unwrap()], &log2)
        .spawn()
        .unwrap();
    common::wait_until(
        common::lazy(|| format!("the handshake fails:\n{}", common::log_from(&log2, 0))),
        Duration::from_secs(20),
        || common::log_from(&log2, 0).contains("connection lost"),
    );
    broker.publish_lines("incidents/x", &lines, "pub-tls2");
    common::assert_quiet(
        "decided a message from a broker it must not trust",
        Duration::from_millis(500),
        || decided(&dir2.join("rg.redb")) > 0,
    );
    super::broker::signal(child2.id() as i32, "TERM");
    child2.wait().unwrap();
    let log = common::log_from(&log2, 0);
    assert!(
        !log.contains("connected broker"),
        "connected to a broker it must not trust:\n{log}"
    );
    assert_eq!(decided(&dir2.join("rg.redb")), 0);
}

/// Every client config is built on ring, named explicitly: building one neither needs nor
/// installs a process-default provider (rumqttc's own `ClientConfig::builder()` would need one,
/// which is why the transport hands rumqttc a ready config).
#[test]
fn tls_clients_are_built_on_ring_without_a_process_default_provider() {
    use tokio_rustls::rustls::crypto::{CryptoProvider, ring};
    let dir = tempfile::tempdir().unwrap();
    make_pki(dir.path(), "rg-provider-ca");
    let p = |name: &str| dir.path().join(name);
    let client_cert = p("client.pem");
    let client_key = p("client.key");
    for identity in [
        None,
        Some([
            (client_cert.as_path(), "client_cert_file"),
            (client_key.as_path(), "client_key_file"),
        ]),
    ] {
        let cfg = replay_guard::tls::verifying_client((&p("ca.pem"), "ca_file"), identity)
            .expect("a client config from the test PKI");
        let groups = |p: &CryptoProvider| p.kx_groups.iter().map(|g| g.name()).collect::<Vec<_>>();
        assert_eq!(
            groups(cfg.crypto_provider()),
            groups(&ring::default_provider())
        );
        assert_eq!(
            cfg.crypto_provider().cipher_suites,
            ring::default_provider().cipher_suites
        );
        assert!(cfg.client_auth_cert_resolver.has_certs() == identity.is_some());
    }
    assert!(
        CryptoProvider::get_default().is_none(),
        "a process-default crypto provider was installed"
    );
}

/// A config whose MQTT client certificate and key come from different pairs (the client's
/// certificate, the server's key), in `[mqtt]` or in an `mqtt` `[[sink]]` (beside a plain
/// `[mqtt]`, so that `run` takes the file). No broker listens: nothing gets that far.
fn mismatched_pair_configs(dir: &Path, pki: &Path) -> [(std::path::PathBuf, &'static str); 2] {
    let files = format!(
        "ca_file = {:?}\nclient_cert_file = {:?}\nclient_key_file = {:?}\n",
        pki.join("ca.pem").to_str().unwrap(),
        pki.join("client.pem").to_str().unwrap(),
        pki.join("server.key").to_str().unwrap(),
    );
    let store = format!(
        "[store]\npath = {:?}\n",
        dir.join("rg.redb").to_str().unwrap()
    );
    let feed = format!(
        "[mqtt]\nbrokers = [\"mqtts://127.0.0.1:{}\"]\nclient_id = \"rg-pair\"\ntopics = [\"t/#\"]\n",
        free_port()
    );
    let feed_cfg = dir.join("feed.toml");
    std::fs::write(&feed_cfg, format!("{store}{feed}{files}")).unwrap();
    let sink_cfg = dir.join("sink.toml");
    std::fs::write(
        &sink_cfg,
        format!(
            "{store}[mqtt]\nbrokers = [\"mqtt://127.0.0.1:{}\"]\nclient_id = \"rg-pair\"\n\
             topics = [\"t/#\"]\n[[sink]]\nname = \"cop\"\nkind = \"mqtt\"\n\
             broker = \"mqtts://127.0.0.1:{}\"\nclient_id = \"rg-pair-sink\"\n\
             topic = \"cop/{{agency}}\"\n{files}",
            free_port(),
            free_port()
        ),
    )
    .unwrap();
    [(feed_cfg, "[mqtt]"), (sink_cfg, "[[sink]] \"cop\"")]
}

#[test]
fn check_config_refuses_a_client_key_that_is_not_the_certificates_in_mqtt_and_in_an_mqtt_sink() {
    let dir = tempfile::tempdir().unwrap();
    make_pki(dir.path(), "rg-pair-ca");
    for (cfg, section) in mismatched_pair_configs(dir.path(), dir.path()) {
        let out = common::run(&["check-config", cfg.to_str().unwrap()]);
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{section}: {err}");
        assert_eq!(err.lines().count(), 1, "one line: {err}");
        for want in [
            section,
            &format!(
                "client_cert_file {}",
                dir.path().join("client.pem").display()
            ),
            &format!(
                "client_key_file {}",
                dir.path().join("server.key").display()
            ),
            "is not the private key of",
        ] {
            assert!(err.contains(want), "{section}: {err} lacks {want}");
        }
    }
    // The matching pair passes, in both places.
    for (cfg, section) in mismatched_pair_configs(dir.path(), dir.path()) {
        let text = std::fs::read_to_string(&cfg)
            .unwrap()
            .replace("server.key", "client.key");
        std::fs::write(&cfg, text).unwrap();
        let out = common::run(&["check-config", cfg.to_str().unwrap()]);
        assert_eq!(out.status.code(), Some(0), "{section}: {out:?}");
    }
}

#[test]
fn run_refuses_a_client_key_that_is_not_the_certificates_before_opening_the_database() {
    let dir = tempfile::tempdir().unwrap();
    make_pki(dir.path(), "rg-pair-ca");
    for (cfg, section) in mismatched_pair_configs(dir.path(), dir.path()) {
        let mut child = Command::new(common::bin())
            .args(["run", "--config", cfg.to_str().unwrap()])
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let (status, err) = common::exit_and_stderr(
            &mut child,
            Duration::from_secs(10),
            &format!("{section}: run refusing the pair"),
        );
        assert_eq!(status.code(), Some(1), "{section}: {err}");
        assert!(
            err.contains("is not the private key of"),
            "{section}: {err}"
        );
        assert!(
            !dir.path().join("rg.redb").exists(),
            "{section}: the database was opened (created) before the refusal: {err}"
        );
    }
}
