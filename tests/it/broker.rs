//! A real Mosquitto per test: started on a free loopback port with its own temp dir and
//! config, stopped (or killed) by PID. Never the machine's own broker on 1883.

use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use super::common;

pub struct Broker {
    pub port: u16,
    pub dir: PathBuf,
    child: Option<Child>,
}

/// A port that was free a moment ago on 127.0.0.1.
pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

impl Broker {
    /// Starts mosquitto in `dir` (created if needed). `persistence` keeps `mosquitto.db` there,
    /// saved only on SIGUSR1 or exit (autosave 0), as in a real failover test.
    pub fn start(dir: &Path, persistence: bool) -> Broker {
        Broker::start_on(dir, free_port(), persistence)
    }

    pub fn start_on(dir: &Path, port: u16, persistence: bool) -> Broker {
        Broker::start_full(dir, port, persistence, "")
    }

    /// Like `start`, with extra config lines (e.g. a TLS listener).
    pub fn start_with(dir: &Path, persistence: bool, extra: &str) -> Broker {
        Broker::start_full(dir, free_port(), persistence, extra)
    }

    /// Like `start`, with Mosquitto's stock queue limit (`max_queued_messages` left at its
    /// default of 1,000 per session: the rest is dropped without a word) and in-flight window.
    pub fn start_stock(dir: &Path, persistence: bool) -> Broker {
        Broker::start_conf(dir, free_port(), persistence, "", "")
    }

    fn start_full(dir: &Path, port: u16, persistence: bool, extra: &str) -> Broker {
        let limits = "max_queued_messages 0\nmax_inflight_messages 100\n";
        Broker::start_conf(dir, port, persistence, limits, extra)
    }

    fn start_conf(dir: &Path, port: u16, persistence: bool, limits: &str, extra: &str) -> Broker {
        std::fs::create_dir_all(dir).unwrap();
        let conf = dir.join("mosquitto.conf");
        let mut text =
            format!("listener {port} 127.0.0.1\nallow_anonymous true\nuser root\n{limits}");
        if persistence {
            text.push_str(&format!(
                "persistence true\npersistence_location {}/\nautosave_interval 0\n",
                dir.display()
            ));
        } else {
            text.push_str("persistence false\n");
        }
        text.push_str(extra);
        std::fs::write(&conf, text).unwrap();
        let log = std::fs::File::create(dir.join("mosquitto.log")).unwrap();
        let child = Command::new("mosquitto")
            .arg("-c")
            .arg(&conf)
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("mosquitto must be installed (apt-get install -y mosquitto mosquitto-clients)");
        let b = Broker {
            port,
            dir: dir.to_path_buf(),
            child: Some(child),
        };
        b.wait_ready();
        b
    }

    fn wait_ready(&self) {
        common::wait_until(
            format!("mosquitto listens on {}", self.port),
            Duration::from_secs(10),
            || TcpStream::connect(("127.0.0.1", self.port)).is_ok(),
        );
    }

    /// Waits until the broker has received `n` PUBACKs from `client_id` in all; it must have
    /// been started with `log_type all` (`start_with`), so that it logs each.
    pub fn wait_pubacks(&self, client_id: &str, n: usize) {
        let log = self.dir.join("mosquitto.log");
        let needle = format!("Received PUBACK from {client_id} (");
        let count = || common::log_from(&log, 0).matches(&needle).count();
        common::wait_until(
            common::lazy(|| {
                format!(
                    "{n} PUBACKs from {client_id} reach the broker (now {})",
                    count()
                )
            }),
            Duration::from_secs(20),
            || count() >= n,
        );
    }

    /// A handle on a broker another `Broker` owns (for publishing from another thread).
    pub fn attach(port: u16) -> Broker {
        Broker {
            port,
            dir: PathBuf::new(),
            child: None,
        }
    }

    pub fn url(&self) -> String {
        format!("mqtt://127.0.0.1:{}", self.port)
    }

    /// The broker process's PID (it runs).
    pub fn pid(&self) -> i32 {
        self.child.as_ref().map(|c| c.id() as i32).expect("running")
    }

    /// SIGUSR1: write the persistence file now.
    pub fn snapshot(&self) {
        let db = self.dir.join("mosquitto.db");
        let before = std::fs::metadata(&db).and_then(|m| m.modified()).ok();
        signal(self.pid(), "USR1");
        // Written to a temporary file renamed over the old one: complete once its time changed.
        common::wait_until("a snapshot is written", Duration::from_secs(10), || {
            let now = std::fs::metadata(&db).and_then(|m| m.modified()).ok();
            now.is_some() && now != before
        });
    }

    /// SIGKILL: the broker dies without saving anything.
    pub fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// A failover: this broker dies (SIGKILL) and a standby starts in `dir` on `port` from
    /// the persistence file it last wrote (`snapshot`), so it replays what was in flight then.
    pub fn kill_and_restore_into(&mut self, dir: &Path, port: u16) -> Broker {
        self.kill();
        std::fs::create_dir_all(dir).unwrap();
        std::fs::copy(self.dir.join("mosquitto.db"), dir.join("mosquitto.db")).unwrap();
        Broker::start_on(dir, port, true)
    }

    /// SIGTERM: the broker saves its persistence file (if it has one) and exits; waits for it.
    pub fn stop(&mut self) {
        if let Some(mut c) = self.child.take() {
            signal(c.id() as i32, "TERM");
            let _ = c.wait();
        }
    }

    /// Publishes each line as one QoS 1 message on `topic` and waits for every PUBACK.
    pub fn publish_lines(&self, topic: &str, lines: &[String], client_id: &str) {
        use std::io::Write as _;
        let mut child = Command::new("mosquitto_pub")
            .args([
                "-h",
                "127.0.0.1",
                "-p",
                &self.port.to_string(),
                "-q",
                "1",
                "-t",
                topic,
                "-i",
                client_id,
                "-l",
            ])
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("mosquitto_pub must be installed (apt-get install -y mosquitto-clients)");
        let mut stdin = child.stdin.take().unwrap();
        for l in lines {
            writeln!(stdin, "{l}").unwrap();
        }
        drop(stdin);
        let out = child.wait_with_output().unwrap();
        assert!(
            out.status.success(),
            "mosquitto_pub: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

impl Drop for Broker {
    fn drop(&mut self) {
        self.kill();
    }
}

pub fn signal(pid: i32, sig: &str) {
    let ok = Command::new("kill")
        .arg(format!("-{sig}"))
        .arg(pid.to_string())
        .status()
        .unwrap();
    assert!(ok.success(), "kill -{sig} {pid}");
}
