//! The one URL parser of the config: `scheme://host[:port]` for brokers and syslog
//! receivers, plus a path and a query for http sinks; `BrokerUrl`, `SyslogUrl` and `HttpUrl`
//! are what it returns, split.

use super::redact::{REDACTED_QUERY, Secret, redact_query_of, redact_url};

/// A scheme (without `://`) and its default port.
type Scheme = (&'static str, u16);

/// What one kind of URL allows, and what its errors call it.
struct Grammar {
    /// What an error calls the URL (`broker "…"`, `url "…"`).
    label: &'static str,
    /// The plain and the TLS scheme (without `://`), each with its default port.
    plain: Scheme,
    tls: Scheme,
    /// A second pair, for a second protocol over the same grammar (syslog's RELP), or none.
    alt: Option<(Scheme, Scheme)>,
    /// The schemes an error lists (`tcp:// or tls://`).
    schemes: &'static str,
    /// Whether a path and a query may follow the authority. Without them, everything after
    /// `scheme://` is the authority (a '?' or '#' there is part of the host, and errors quote
    /// the URL whole), so any '@' is user info and is refused before the scheme is even looked
    /// at (a mistyped scheme must not get the password echoed). With them, an '@' may stand in
    /// the path, only the authority's is user info, and errors hide the query.
    path: bool,
    /// Where the credentials belong instead, said when the URL holds user info.
    credentials_hint: &'static str,
}

const BROKER: Grammar = Grammar {
    label: "broker",
    plain: ("mqtt", 1883),
    tls: ("mqtts", 8883),
    alt: None,
    schemes: "mqtt:// or mqtts://",
    path: false,
    credentials_hint: "use [mqtt] username and password_file",
};

const HTTP: Grammar = Grammar {
    label: "url",
    plain: ("http", 80),
    tls: ("https", 443),
    alt: None,
    schemes: "http:// or https://",
    path: true,
    credentials_hint: "a token belongs in authorization_file",
};

/// A syslog receiver: TCP (RFC 6587) on 514 by default, TLS (RFC 5425) on 6514; RELP
/// (rsyslog's imrelp, which has no default port: 2514, the port of rsyslog's examples) and
/// RELP over TLS, on 2514 too.
const SYSLOG: Grammar = Grammar {
    label: "url",
    plain: ("tcp", 514),
    tls: ("tls", 6514),
    alt: Some((("relp", 2514), ("relp+tls", 2514))),
    schemes: "tcp://, tls://, relp:// or relp+tls://",
    path: false,
    credentials_hint: "a syslog receiver takes a client certificate (client_cert_file and \
                       client_key_file), not a password",
};

/// Why a URL was refused. Its text quotes the URL with any user info hidden, and, for a URL
/// that may have a query, the query hidden too.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UrlError {
    label: &'static str,
    shown: String,
    problem: UrlProblem,
}

impl UrlError {
    /// What is wrong, without the quoted URL.
    #[cfg(test)]
    pub fn problem(&self) -> &UrlProblem {
        &self.problem
    }
}

/// What is wrong with a URL.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum UrlProblem {
    #[error("must start with {schemes}")]
    Scheme { schemes: &'static str },
    #[error("a user name or password in the URL is not accepted (it would be logged); {hint}")]
    UserInfo { hint: &'static str },
    #[error("unclosed '['")]
    UnclosedBracket,
    #[error("unexpected {0:?} after the host")]
    AfterHost(String),
    /// For a grammar without paths, a host holding a '/' too (a path after the host).
    #[error("{}", if *path_allowed { "no host" } else { "no host, or a path after it" })]
    NoHost { path_allowed: bool },
    #[error("bad port {0:?}")]
    BadPort(String),
    /// A host holding whitespace or a control character: no resolver takes it, and a name
    /// that looks right in a listing would fail at every connect.
    #[error("the host {0:?} holds a space or a control character")]
    HostSpace(String),
    #[error("the path and query may not hold a fragment, spaces or control characters")]
    PathOrQuery,
}

impl std::fmt::Display for UrlError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let (label, shown) = (self.label, &self.shown);
        match &self.problem {
            UrlProblem::Scheme { .. } => write!(f, "{label} {shown:?} {}", self.problem),
            other => write!(f, "{label} {shown:?}: {other}"),
        }
    }
}

impl std::error::Error for UrlError {}

/// A URL split by `parse`.
struct Parts<'a> {
    tls: bool,
    /// The grammar's second pair of schemes (`alt`).
    alt: bool,
    host: &'a str,
    port: u16,
    /// Starts with `/` (`/` when the URL has none); empty for a grammar without paths.
    path: &'a str,
    query: Option<&'a str>,
}

/// Splits `s` as `g` allows: the scheme, the authority (`host[:port]`, an IPv6 host in
/// brackets, no user info; a port is 1 to 65535, the scheme's default when absent), then, for
/// a grammar with paths, the path and the query. The first problem found is the error.
fn parse<'a>(g: &Grammar, s: &'a str) -> Result<Parts<'a>, UrlError> {
    let shown = if g.path {
        redact_query_of(&redact_url(s))
    } else {
        redact_url(s)
    };
    let error = |problem: UrlProblem| UrlError {
        label: g.label,
        shown: shown.clone(),
        problem,
    };
    let user_info = || {
        error(UrlProblem::UserInfo {
            hint: g.credentials_hint,
        })
    };
    if !g.path && s.contains('@') {
        return Err(user_info());
    }
    let after_scheme = |scheme: &str| s.strip_prefix(scheme)?.strip_prefix("://");
    let alt_after = |tls: bool| {
        let (plain, secure) = g.alt?;
        after_scheme(if tls { secure.0 } else { plain.0 })
    };
    let (tls, alt, rest) = if let Some(r) = after_scheme(g.tls.0) {
        (true, false, r)
    } else if let Some(r) = after_scheme(g.plain.0) {
        (false, false, r)
    } else if let Some(r) = alt_after(true) {
        (true, true, r)
    } else if let Some(r) = alt_after(false) {
        (false, true, r)
    } else {
        // Without a scheme `redact_query` cannot know where a query starts: nothing from the
        // first '?' or '#' on is quoted.
        let shown = if g.path {
            shown.split(['?', '#']).next().unwrap_or("").to_string()
        } else {
            shown
        };
        return Err(UrlError {
            label: g.label,
            shown,
            problem: UrlProblem::Scheme { schemes: g.schemes },
        });
    };
    let (authority, path, query) = if g.path {
        let (authority, path) = match rest.find(['/', '?', '#']) {
            Some(i) => rest.split_at(i),
            None => (rest, "/"),
        };
        if authority.contains('@') {
            return Err(user_info());
        }
        let (path, query) = match path.split_once('?') {
            Some((p, q)) => (p, Some(q)),
            None => (path, None),
        };
        let path = if path.is_empty() { "/" } else { path };
        let bad = |t: &str| t.contains('#') || t.chars().any(|c| c.is_ascii_control() || c == ' ');
        if bad(path) || query.is_some_and(bad) {
            return Err(error(UrlProblem::PathOrQuery));
        }
        (authority, path, query)
    } else {
        (rest, "", None)
    };
    let (host, port) = match authority.strip_prefix('[') {
        Some(r) => {
            let (h, after) = r
                .split_once(']')
                .ok_or_else(|| error(UrlProblem::UnclosedBracket))?;
            match after.strip_prefix(':') {
                Some(p) => (h, Some(p)),
                None if after.is_empty() => (h, None),
                None => return Err(error(UrlProblem::AfterHost(after.to_string()))),
            }
        }
        None => match authority.rsplit_once(':') {
            Some((h, p)) => (h, Some(p)),
            None => (authority, None),
        },
    };
    if host.is_empty() || host.contains('/') {
        return Err(error(UrlProblem::NoHost {
            path_allowed: g.path,
        }));
    }
    if host.chars().any(|c| c.is_whitespace() || c.is_control()) {
        return Err(error(UrlProblem::HostSpace(host.to_string())));
    }
    let (plain, secure) = match g.alt {
        Some(pair) if alt => pair,
        _ => (g.plain, g.tls),
    };
    let port = match port {
        None if tls => secure.1,
        None => plain.1,
        Some(p) => p
            .parse::<u16>()
            .ok()
            .filter(|p| *p != 0)
            .ok_or_else(|| error(UrlProblem::BadPort(p.to_string())))?,
    };
    Ok(Parts {
        tls,
        alt,
        host,
        port,
        path,
        query,
    })
}

/// `scheme://host:port`, an IPv6 host in brackets.
fn write_origin(
    f: &mut std::fmt::Formatter<'_>,
    g: &Grammar,
    (tls, alt): (bool, bool),
    host: &str,
    port: u16,
) -> std::fmt::Result {
    let (plain, secure) = match g.alt {
        Some(pair) if alt => pair,
        _ => (g.plain, g.tls),
    };
    let scheme = if tls { secure.0 } else { plain.0 };
    if host.contains(':') {
        write!(f, "{scheme}://[{host}]:{port}")
    } else {
        write!(f, "{scheme}://{host}:{port}")
    }
}

/// One broker address from `[mqtt] brokers` (or an mqtt sink's `broker`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BrokerUrl {
    pub tls: bool,
    pub host: String,
    pub port: u16,
}

impl std::fmt::Display for BrokerUrl {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write_origin(f, &BROKER, (self.tls, false), &self.host, self.port)
    }
}

impl BrokerUrl {
    /// `mqtt://host[:port]` or `mqtts://host[:port]` (IPv6 hosts in brackets). User info
    /// (`user:pass@`) is refused without being echoed: it would be printed in every log line
    /// naming the broker, and resolved as part of the host name.
    pub fn parse(s: &str) -> Result<BrokerUrl, UrlError> {
        let p = parse(&BROKER, s)?;
        Ok(BrokerUrl {
            tls: p.tls,
            host: p.host.to_string(),
            port: p.port,
        })
    }
}

/// A `syslog` sink's receiver: `tcp://host[:port]` or `tls://host[:port]`, or
/// `relp://host[:port]` or `relp+tls://host[:port]`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SyslogUrl {
    pub tls: bool,
    /// RELP (`relp://`, `relp+tls://`) rather than plain syslog over TCP or TLS.
    pub relp: bool,
    pub host: String,
    pub port: u16,
}

impl std::fmt::Display for SyslogUrl {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write_origin(f, &SYSLOG, (self.tls, self.relp), &self.host, self.port)
    }
}

impl SyslogUrl {
    /// `tcp://host[:port]` (default 514), `tls://host[:port]` (default 6514, RFC 5425),
    /// `relp://host[:port]` or `relp+tls://host[:port]` (default 2514 both); no user info, path
    /// or query.
    pub fn parse(s: &str) -> Result<SyslogUrl, UrlError> {
        let p = parse(&SYSLOG, s)?;
        Ok(SyslogUrl {
            tls: p.tls,
            relp: p.alt,
            host: p.host.to_string(),
            port: p.port,
        })
    }
}

/// An `http://` or `https://` URL, split. Its query may carry a token, so it is kept as a
/// `Secret`: `Display` (every log line, error and status naming the URL) shows it as
/// `?<redacted>`, and only `request_target` hands it out, for the request line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HttpUrl {
    pub tls: bool,
    pub host: String,
    pub port: u16,
    /// The path, starting with `/`, without the query.
    pub path: String,
    /// What follows the `?`, if the URL has one.
    query: Option<Secret>,
}

impl std::fmt::Display for HttpUrl {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write_origin(f, &HTTP, (self.tls, false), &self.host, self.port)?;
        f.write_str(&self.path)?;
        if self.query.is_some() {
            write!(f, "?{REDACTED_QUERY}")?;
        }
        Ok(())
    }
}

impl HttpUrl {
    /// The request target: the path and the query, as sent on the request line.
    pub fn request_target(&self) -> String {
        match &self.query {
            None => self.path.clone(),
            Some(q) => format!("{}?{}", self.path, q.expose()),
        }
    }

    /// Parses `s`; errors quote it with any user info and query hidden.
    pub fn parse(s: &str) -> Result<HttpUrl, UrlError> {
        let p = parse(&HTTP, s)?;
        Ok(HttpUrl {
            tls: p.tls,
            host: p.host.to_string(),
            port: p.port,
            path: p.path.to_string(),
            query: p.query.map(|q| Secret(q.to_string())),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Config;
    use crate::config::redact::redact_userinfo;

    #[test]
    fn accepted_urls_split_into_host_port_and_path_with_each_schemes_default_port() {
        for (url, shown) in [
            ("mqtt://h", "mqtt://h:1883"),
            ("mqtts://h", "mqtts://h:8883"),
            ("mqtt://127.0.0.1:65535", "mqtt://127.0.0.1:65535"),
            ("mqtt://[::1]", "mqtt://[::1]:1883"),
            ("mqtts://[fe80::1%eth0]:8884", "mqtts://[fe80::1%eth0]:8884"),
            // Rust's integer parsing takes a leading '+'.
            ("mqtt://h:+1", "mqtt://h:1"),
        ] {
            assert_eq!(BrokerUrl::parse(url).unwrap().to_string(), shown, "{url}");
        }
        for (url, shown, tls, relp) in [
            ("tcp://h", "tcp://h:514", false, false),
            ("tls://h", "tls://h:6514", true, false),
            ("relp://h", "relp://h:2514", false, true),
            ("relp+tls://[::1]", "relp+tls://[::1]:2514", true, true),
            ("relp://h:20514", "relp://h:20514", false, true),
        ] {
            let u = SyslogUrl::parse(url).unwrap();
            assert_eq!((u.to_string().as_str(), u.tls, u.relp), (shown, tls, relp));
        }
        for bad in ["relp+tcp://h", "RELP://h", "relp:/h"] {
            assert_eq!(
                SyslogUrl::parse(bad).unwrap_err().to_string(),
                format!("url {bad:?} must start with tcp://, tls://, relp:// or relp+tls://")
            );
        }
        for (url, shown, target) in [
            ("http://h", "http://h:80/", "/"),
            ("https://h", "https://h:443/", "/"),
            ("http://h:8080/a/b", "http://h:8080/a/b", "/a/b"),
            ("https://[::1]/in", "https://[::1]:443/in", "/in"),
            (
                "http://[::1]:81?k=v",
                "http://[::1]:81/?<redacted>",
                "/?k=v",
            ),
            ("http://h/p?", "http://h:80/p?<redacted>", "/p?"),
            ("http://h/p?a?b", "http://h:80/p?<redacted>", "/p?a?b"),
            // An '@' in the path is no user info.
            ("http://h/a@b", "http://h:80/a@b", "/a@b"),
        ] {
            let u = HttpUrl::parse(url).unwrap();
            assert_eq!(
                (u.to_string().as_str(), u.request_target().as_str()),
                (shown, target)
            );
        }
    }

    /// A problem's name, for the tables.
    fn kind(p: &UrlProblem) -> &'static str {
        match p {
            UrlProblem::Scheme { .. } => "scheme",
            UrlProblem::UserInfo { .. } => "userinfo",
            UrlProblem::UnclosedBracket => "bracket",
            UrlProblem::AfterHost(_) => "after",
            UrlProblem::NoHost { .. } => "host",
            UrlProblem::BadPort(_) => "port",
            UrlProblem::PathOrQuery => "path",
            UrlProblem::HostSpace(_) => "space",
        }
    }

    #[test]
    fn refused_broker_urls_say_why_quoting_the_url_without_user_info() {
        let userinfo = "a user name or password in the URL is not accepted (it would be logged); \
                        use [mqtt] username and password_file";
        for (url, want_kind, text) in [
            (
                "tcp://h:1",
                "scheme",
                "\"tcp://h:1\" must start with mqtt:// or mqtts://",
            ),
            (
                "MQTT://h",
                "scheme",
                "\"MQTT://h\" must start with mqtt:// or mqtts://",
            ),
            (
                "mqtt://u:p@ss@h:1883",
                "userinfo",
                "\"mqtt://<redacted>@h:1883\": ",
            ),
            // Any '@' is user info, even where the scheme is wrong or missing.
            ("tcp://u:p@h", "userinfo", "\"tcp://<redacted>@h\": "),
            ("u:p@h", "userinfo", "\"<redacted>@h\": "),
            ("mqtt://[::1", "bracket", "\"mqtt://[::1\": unclosed '['"),
            (
                "mqtt://[::1]x",
                "after",
                "\"mqtt://[::1]x\": unexpected \"x\" after the host",
            ),
            (
                "mqtt://[::1]/",
                "after",
                "\"mqtt://[::1]/\": unexpected \"/\" after the host",
            ),
            (
                "mqtt://",
                "host",
                "\"mqtt://\": no host, or a path after it",
            ),
            (
                "mqtt://:1883",
                "host",
                "\"mqtt://:1883\": no host, or a path after it",
            ),
            (
                "mqtt://[]:1",
                "host",
                "\"mqtt://[]:1\": no host, or a path after it",
            ),
            (
                "mqtt://h/x",
                "host",
                "\"mqtt://h/x\": no host, or a path after it",
            ),
            ("mqtt://h:0", "port", "\"mqtt://h:0\": bad port \"0\""),
            (
                "mqtt://h:65536",
                "port",
                "\"mqtt://h:65536\": bad port \"65536\"",
            ),
            ("mqtt://h:-1", "port", "\"mqtt://h:-1\": bad port \"-1\""),
            ("mqtt://h:", "port", "\"mqtt://h:\": bad port \"\""),
            ("mqtt://h:1/x", "port", "\"mqtt://h:1/x\": bad port \"1/x\""),
            (
                "mqtt://cad .example.org:1883",
                "space",
                "\"mqtt://cad .example.org:1883\": the host \"cad .example.org\" holds a space \
                 or a control character",
            ),
            (
                "mqtt://cad\t:1883",
                "space",
                "\"mqtt://cad\\t:1883\": the host \"cad\\t\" holds a space or a control character",
            ),
        ] {
            let e = BrokerUrl::parse(url).unwrap_err();
            let text = match want_kind {
                "userinfo" => format!("broker {text}{userinfo}"),
                _ => format!("broker {text}"),
            };
            assert_eq!(e.to_string(), text, "{url}");
            assert_eq!(kind(e.problem()), want_kind, "{url}");
        }
    }

    #[test]
    fn refused_http_urls_say_why_quoting_the_url_without_user_info_or_query() {
        let userinfo = "a user name or password in the URL is not accepted (it would be logged); \
                        a token belongs in authorization_file";
        let chars = "the path and query may not hold a fragment, spaces or control characters";
        for (url, want_kind, text) in [
            // Without a scheme, where a query starts is unknown: the quote stops at '?'.
            (
                "ftp://h/?k=secret",
                "scheme",
                "\"ftp://h/\" must start with http:// or https://",
            ),
            // Without a scheme an '@' may be a path's: the scheme is what is refused.
            (
                "ftp://u:p@h/",
                "scheme",
                "\"ftp://<redacted>@h/\" must start with http:// or https://",
            ),
            (
                "http://u:p@ss@h/?k=secret",
                "userinfo",
                "\"http://<redacted>@h/?<redacted>\": ",
            ),
            (
                "http://[::1/?k=secret",
                "bracket",
                "\"http://[::1/?<redacted>\": unclosed '['",
            ),
            (
                "http://[::1]x/",
                "after",
                "\"http://[::1]x/\": unexpected \"x\" after the host",
            ),
            ("http://", "host", "\"http://\": no host"),
            (
                "http://:80/?k=secret",
                "host",
                "\"http://:80/?<redacted>\": no host",
            ),
            ("http://h:0/", "port", "\"http://h:0/\": bad port \"0\""),
            (
                "http://h:99999",
                "port",
                "\"http://h:99999\": bad port \"99999\"",
            ),
            (
                "http://h:x/?k=secret",
                "port",
                "\"http://h:x/?<redacted>\": bad port \"x\"",
            ),
            ("http://h/p q", "path", "\"http://h/p q\": "),
            ("http://h/p#f", "path", "\"http://h/p#<redacted>\": "),
            ("http://h/?k=secret#f", "path", "\"http://h/?<redacted>\": "),
            ("http://h/\u{7}", "path", "\"http://h/\\u{7}\": "),
            (
                "http://cop .example.org/in?k=secret",
                "space",
                "\"http://cop .example.org/in?<redacted>\": the host \"cop .example.org\" holds \
                 a space or a control character",
            ),
        ] {
            let e = HttpUrl::parse(url).unwrap_err();
            let text = match want_kind {
                "userinfo" => format!("url {text}{userinfo}"),
                "path" => format!("url {text}{chars}"),
                _ => format!("url {text}"),
            };
            assert_eq!(e.to_string(), text, "{url}");
            assert_eq!(kind(e.problem()), want_kind, "{url}");
        }
    }

    #[test]
    fn broker_urls_parse_or_say_why_not() {
        let b = BrokerUrl::parse("mqtt://127.0.0.1:1884").unwrap();
        assert_eq!((b.tls, b.host.as_str(), b.port), (false, "127.0.0.1", 1884));
        assert_eq!(BrokerUrl::parse("mqtts://broker.local").unwrap().port, 8883);
        assert_eq!(BrokerUrl::parse("mqtt://[::1]:1885").unwrap().host, "::1");
        assert_eq!(
            BrokerUrl::parse("mqtt://[::1]:1885").unwrap().to_string(),
            "mqtt://[::1]:1885"
        );
        for bad in [
            "tcp://x:1",
            "mqtt://:1883",
            "mqtt://h:0",
            "mqtt://h:99999",
            "mqtt://h/x",
        ] {
            assert!(BrokerUrl::parse(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn credentials_in_broker_urls_are_refused_and_never_echoed() {
        for url in [
            "mqtt://user:s3cret@h:1883",
            "mqtts://user:s3cret@[::1]",
            "mqtt://:s3cret@h",
            "tcp://user:s3cret@h",
            "user:s3cret@h",
            "mqtt://us@er:s3cret@h",
            "mqtt://user:s3cr/et@h",
            "mqtt://user:s3cr et@h",
            "mqtt://user:s3cr\"et@h",
        ] {
            let e = BrokerUrl::parse(url).unwrap_err().to_string();
            assert!(!e.contains("s3cr"), "{url}: {e}");
            assert!(e.contains("password_file"), "{url}: {e}");
            let e = Config::parse(&format!(
                "[mqtt]\nbrokers = [{url:?}]\nclient_id = \"c\"\ntopics = [\"t\"]\n"
            ))
            .unwrap_err()
            .to_string();
            assert!(!e.contains("s3cr"), "{url}: {e}");
        }
        // TOML errors quote the line and the value: redacted too.
        for text in [
            "[mqtt]\nbrokers = \"mqtt://user:s3cret@h\"\n",
            "[mqtt]\nbrokers = [\"mqtt://user:s3cret@h\", 5]\n",
            "[mqtt]\nbrokers = [\"user:s3cret@h\"] x\n",
            "[mqtt]\nbrokers = [\"mqtt://user:s3c, ret@h\", 5]\n",
            "[mqtt]\nbrokers = [mqtt://user:s3cret@h]\n",
            "[mqtt]\nbrokers = 'mqtt://user:s3c\"ret@h'\n",
        ] {
            let e = Config::parse(text).unwrap_err().to_string();
            assert!(!e.contains("s3c"), "{text}: {e}");
        }
        assert_eq!(
            redact_userinfo("line 2 `brokers = [\"mqtt://u:p@h:1\", \"u2:p2@h2\"]`"),
            "line 2 `brokers = [\"mqtt://<redacted>@h:1\", \"<redacted>@h2\"]`"
        );
    }
}
