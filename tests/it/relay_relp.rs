//! The `syslog` sink over RELP (`relp://`, `relp+tls://`) against a real rsyslogd with imrelp
//! (Debian's rsyslog-relp) that the test starts, as `relay_syslog` starts its imtcp one (its
//! own config, work directory and pid file in a temp dir, a free loopback port, every message
//! written to a file before rsyslog answers it): every event arrives once, the same message as
//! over TCP; a receiver hung with SIGSTOP while the relay delivers gets nothing counted that
//! it did not answer, and after SIGKILL and a new rsyslogd on the same port every event
//! arrives and `relay status` and `verify` agree; the same scenario over plain `tcp://`
//! counts the hung receiver's events delivered and loses them, which is the difference RELP
//! makes; over TLS (imrelp's `tls="on"`, a CA made with openssl, mutual) every event arrives.

use std::collections::BTreeSet;
use std::path::Path;
use std::time::Duration;

use replay_guard::json::Json;

use super::broker::signal;
use super::common;
use super::relay::{field, stdout, stop};
use super::relay_syslog::{
    Input, Rsyslog, RsyslogTls, Setup, assert_messages_are_the_effects, pki, replay_guard_host,
    setup,
};

fn number(st: &Json, name: &str) -> u64 {
    field(st, name)
        .parse()
        .unwrap_or_else(|_| panic!("{name} in {}", st.to_compact()))
}

#[test]
fn every_event_arrives_over_relp_as_over_tcp() {
    let dir = tempfile::tempdir().unwrap();
    let rsyslog = Rsyslog::start_with(&dir.path().join("rsyslog"), None, Input::Relp);
    let s = setup(
        dir.path(),
        &format!("relp://127.0.0.1:{}", rsyslog.port),
        "hostname = \"eoc-1.example\"\nfacility = \"local3\"\nbatch_max = 7\nrelp_window = 4",
    );
    s.ingest(0, 40);
    let mut relay = s.relay();
    s.wait_all(&rsyslog, 40, Duration::from_secs(30));
    assert_eq!(stop(&mut relay), Some(0), "{}", s.log());
    let got = rsyslog.received();
    assert_eq!(got.len(), 40, "each event once: {got:?}");
    assert_messages_are_the_effects(&s, &got, 19, "eoc-1.example");
    assert_eq!(rsyslog.ids(), s.effects().keys().cloned().collect());
    let st = s.status();
    assert_eq!(field(&st, "kind"), "syslog");
    assert_eq!(field(&st, "cursor"), "40");
    assert_eq!(field(&st, "delivered"), "40");
}

/// What a sink to `scheme://` made of a receiver hung (SIGSTOP) while it delivered, then
/// killed (SIGKILL) and replaced by a new rsyslogd on the same port.
struct Hung {
    /// `relay status`'s `delivered` once the relay had done what it could with the hung
    /// receiver (RELP: its timeout on record; TCP: all counted).
    delivered_while_hung: u64,
    /// The ids of the events ingested while the receiver was hung that never arrived, once
    /// an event ingested after the restart has arrived.
    lost: usize,
    /// Every arrival, repeats included, at the end.
    arrivals: usize,
    s: Setup,
    rsyslog: Rsyslog,
}

const BEFORE: u64 = 20;
const WHILE_HUNG: u64 = 30;

/// 20 events delivered; the receiver hung; 30 more ingested; what the relay's status says of
/// them; the receiver killed and a new one started on the same port; one more event, and
/// what arrived by the time it did.
fn hung_receiver(dir: &Path, scheme: &str) -> Hung {
    let input = if scheme == "relp" {
        Input::Relp
    } else {
        Input::Tcp
    };
    let mut rsyslog = Rsyslog::start_with(&dir.join("rsyslog"), None, input);
    let s = setup(
        dir,
        &format!("{scheme}://127.0.0.1:{}", rsyslog.port),
        "batch_max = 10",
    );
    s.ingest(0, BEFORE);
    let mut relay = s.relay();
    s.wait_all(&rsyslog, BEFORE as usize, Duration::from_secs(30));
    common::wait_until(
        common::lazy(|| format!("the cursor passes the first events; log:\n{}", s.log())),
        Duration::from_secs(20),
        || number(&s.status(), "delivered") == BEFORE,
    );
    // A stuck rsyslogd: its socket still takes bytes, it reads nothing and answers nothing.
    signal(rsyslog.pid(), "STOP");
    s.ingest(BEFORE, BEFORE + WHILE_HUNG);
    let delivered_while_hung = if scheme == "relp" {
        // The relay sends, gets no `rsp` within timeout_ms (2 s), and says so; nothing of
        // what the hung receiver took in counts.
        common::wait_until(
            common::lazy(|| format!("the relay notices the hung receiver; log:\n{}", s.log())),
            Duration::from_secs(30),
            || field(&s.status(), "last_error").contains("no RELP answer within 2000 ms"),
        );
        number(&s.status(), "delivered")
    } else {
        // The receiver's kernel acknowledges every byte: counted delivered.
        common::wait_until(
            common::lazy(|| format!("the relay counts the events; log:\n{}", s.log())),
            Duration::from_secs(30),
            || number(&s.status(), "delivered") == BEFORE + WHILE_HUNG,
        );
        number(&s.status(), "delivered")
    };
    // The stuck receiver is killed (what it holds unread dies with it) and replaced.
    rsyslog.kill();
    rsyslog.spawn();
    s.ingest(BEFORE + WHILE_HUNG, BEFORE + WHILE_HUNG + 1);
    let last: BTreeSet<String> = s
        .effects()
        .into_iter()
        .filter(|(_, e)| e.record.sequence == BEFORE + WHILE_HUNG)
        .map(|(id, _)| id)
        .collect();
    assert_eq!(last.len(), 1);
    common::wait_until(
        common::lazy(|| format!("the event after the restart arrives; log:\n{}", s.log())),
        Duration::from_secs(30),
        || rsyslog.ids().is_superset(&last),
    );
    if scheme == "relp" {
        // Everything is sent again until answered: wait for all of it.
        s.wait_all(
            &rsyslog,
            (BEFORE + WHILE_HUNG + 1) as usize,
            Duration::from_secs(30),
        );
    }
    common::wait_until(
        common::lazy(|| format!("the relay catches up; log:\n{}", s.log())),
        Duration::from_secs(20),
        || field(&s.status(), "cursor") == (BEFORE + WHILE_HUNG + 1).to_string(),
    );
    assert_eq!(stop(&mut relay), Some(0), "{}", s.log());
    let all: BTreeSet<String> = s.effects().keys().cloned().collect();
    let lost = all.difference(&rsyslog.ids()).count();
    let arrivals = rsyslog.received().len();
    Hung {
        delivered_while_hung,
        lost,
        arrivals,
        s,
        rsyslog,
    }
}

#[test]
fn a_hung_relp_receiver_gets_nothing_counted_and_after_its_restart_nothing_is_lost() {
    let dir = tempfile::tempdir().unwrap();
    let h = hung_receiver(dir.path(), "relp");
    assert_eq!(
        h.delivered_while_hung, BEFORE,
        "nothing the hung receiver took in counts as delivered"
    );
    assert_eq!(h.lost, 0, "every event arrives after the restart");
    let total = (BEFORE + WHILE_HUNG + 1) as usize;
    assert!(h.arrivals >= total, "{}", h.arrivals);
    // Repeats are of what the hung receiver had answered before it hung, at most a window.
    assert!(h.arrivals <= total + 128, "{} arrivals", h.arrivals);
    assert_messages_are_the_effects(&h.s, &h.rsyslog.received(), 16, &replay_guard_host());
    let st = h.s.status();
    assert_eq!(
        (field(&st, "cursor"), field(&st, "delivered")),
        (total.to_string(), total.to_string())
    );
    stdout(&common::run(&[
        "verify",
        "--config",
        h.s.config.to_str().unwrap(),
    ]));
}

/// The same scenario over plain TCP: the hung receiver's kernel acknowledged the 30 events, so
/// the relay counted them delivered, and they died with the receiver. This is why the audit
/// stream should go over RELP; if the sink ever counted RELP messages as TCP does, the test
/// above would fail as this one passes.
#[test]
fn a_hung_tcp_receiver_gets_its_events_counted_and_loses_them() {
    let dir = tempfile::tempdir().unwrap();
    let h = hung_receiver(dir.path(), "tcp");
    assert_eq!(h.delivered_while_hung, BEFORE + WHILE_HUNG);
    assert_eq!(
        h.lost, WHILE_HUNG as usize,
        "the events the hung receiver's kernel took in are lost"
    );
}

#[test]
fn relp_over_tls_verifies_the_receiver_and_every_event_arrives() {
    let dir = tempfile::tempdir().unwrap();
    let ours = pki(&dir.path().join("pki"), "rg-relp-ca");
    let rsyslog = Rsyslog::start_with(
        &dir.path().join("rsyslog"),
        Some(RsyslogTls {
            pki: ours.clone(),
            auth_mode: "certvalid",
        }),
        Input::Relp,
    );
    let p = |f: &str| ours.join(f).to_str().unwrap().to_string();
    let s = setup(
        dir.path(),
        &format!("relp+tls://127.0.0.1:{}", rsyslog.port),
        &format!(
            "ca_file = {:?}\nclient_cert_file = {:?}\nclient_key_file = {:?}",
            p("ca.pem"),
            p("client.pem"),
            p("client.key")
        ),
    );
    s.ingest(0, 25);
    let mut relay = s.relay();
    s.wait_all(&rsyslog, 25, Duration::from_secs(30));
    assert_eq!(stop(&mut relay), Some(0), "{}", s.log());
    let got = rsyslog.received();
    assert_eq!(got.len(), 25);
    assert_messages_are_the_effects(&s, &got, 16, &replay_guard_host());
    assert_eq!(field(&s.status(), "delivered"), "25");
}
