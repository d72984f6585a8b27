//! systemd's notify protocol (sd_notify): READY, WATCHDOG, STATUS, STOPPING datagrams to
//! `$NOTIFY_SOCKET`. Std only; a no-op when not started by systemd.

use std::os::unix::net::UnixDatagram;
use std::time::Duration;

/// Where to send notifications, if anywhere.
pub struct Notifier {
    socket: Option<(UnixDatagram, std::path::PathBuf)>,
    abstract_name: Option<Vec<u8>>,
}

impl Notifier {
    /// Sends nothing (the service run inside `demo`).
    pub fn none() -> Notifier {
        Notifier {
            socket: None,
            abstract_name: None,
        }
    }

    /// Reads `$NOTIFY_SOCKET` (a path, or `@name` for the abstract namespace).
    pub fn from_env() -> Notifier {
        let Some(addr) = std::env::var_os("NOTIFY_SOCKET") else {
            return Notifier {
                socket: None,
                abstract_name: None,
            };
        };
        let Ok(sock) = UnixDatagram::unbound() else {
            return Notifier {
                socket: None,
                abstract_name: None,
            };
        };
        let bytes = addr.as_encoded_bytes();
        if let Some(name) = bytes.strip_prefix(b"@") {
            return Notifier {
                socket: Some((sock, std::path::PathBuf::new())),
                abstract_name: Some(name.to_vec()),
            };
        }
        Notifier {
            socket: Some((sock, std::path::PathBuf::from(addr))),
            abstract_name: None,
        }
    }

    /// Sends one notification (e.g. `READY=1`); errors are ignored, as systemd does.
    pub fn notify(&self, state: &str) {
        let Some((sock, path)) = &self.socket else {
            return;
        };
        match &self.abstract_name {
            #[cfg(target_os = "linux")]
            Some(name) => {
                use std::os::linux::net::SocketAddrExt as _;
                if let Ok(addr) = std::os::unix::net::SocketAddr::from_abstract_name(name) {
                    let _ = sock.send_to_addr(state.as_bytes(), &addr);
                }
            }
            #[cfg(not(target_os = "linux"))]
            Some(_) => {}
            None => {
                let _ = sock.send_to(state.as_bytes(), path);
            }
        }
    }

    /// Half of `$WATCHDOG_USEC`, if systemd asked for watchdog pings.
    pub fn watchdog_interval() -> Option<Duration> {
        let usec: u64 = std::env::var("WATCHDOG_USEC").ok()?.parse().ok()?;
        (usec > 0).then(|| Duration::from_micros(usec / 2).max(Duration::from_millis(1)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn notifications_reach_the_socket() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("notify.sock");
        let server = UnixDatagram::bind(&path).unwrap();
        let n = Notifier {
            socket: Some((UnixDatagram::unbound().unwrap(), path)),
            abstract_name: None,
        };
        n.notify("READY=1");
        let mut buf = [0u8; 64];
        let len = server.recv(&mut buf).unwrap();
        assert_eq!(&buf[..len], b"READY=1");
    }
}
