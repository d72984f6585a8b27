//! Secrets and redaction: `Secret` never prints, and the redactors hide URL user info, URL
//! queries and secret-named lines wherever config text is echoed (errors, logs).

/// A secret that never prints.
#[derive(Clone, PartialEq, Eq)]
pub struct Secret(pub(super) String);
impl Secret {
    pub fn expose(&self) -> &str {
        &self.0
    }
}
impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Secret(<redacted>)")
    }
}

/// Replaces whatever precedes an '@' in a URL-like value (`"mqtt://user:pass@host"`,
/// `"user:pass@host"`) with `<redacted>`, keeping any `scheme://`: a TOML error echoes the
/// offending line and value, and must never echo a password. The hidden part reaches back to
/// the nearest `://`, else to the nearest quote or backtick (a password may hold spaces,
/// commas or quotes); hiding too much is harmless, too little is not.
pub(super) fn redact_userinfo(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(at) = rest.find('@') {
        let before = &rest[..at];
        let start = match before.rfind("://") {
            Some(i) => i + 3,
            None => before.rfind(['"', '\'', '`']).map_or(0, |i| i + 1),
        };
        out.push_str(&before[..start]);
        out.push_str("<redacted>@");
        rest = &rest[at + 1..];
    }
    out.push_str(rest);
    out
}

/// What stands for a URL's query (and fragment) wherever a URL is shown.
pub const REDACTED_QUERY: &str = "<redacted>";

/// `text` with the query of every URL in it hidden: in each stretch of `text` between quotes
/// or backticks (or line ends) that holds a `://`, everything after the first `?` or `#`
/// that follows the `://` becomes `<redacted>`; scheme, host, port and path stay. A URL's
/// query may carry a token (`?api_key=...`), and a URL reaches log lines, `relay status`,
/// a sink's stored error and config errors. Hiding too much is harmless, too little is not.
/// `HttpUrl` never holds its query in the clear (`HttpUrl::query`); this is for raw text: a
/// URL as typed, a TOML error quoting a line.
pub fn redact_query(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    loop {
        let (stretch, sep) = match rest.find(['"', '\'', '`', '\n']) {
            Some(i) => (&rest[..i], Some(&rest[i..i + 1])),
            None => (rest, None),
        };
        let keep = stretch
            .find("://")
            .and_then(|s| stretch[s + 3..].find(['?', '#']).map(|q| s + 3 + q + 1));
        match keep {
            Some(k) if k < stretch.len() => {
                out.push_str(&stretch[..k]);
                out.push_str(REDACTED_QUERY);
            }
            _ => out.push_str(stretch),
        }
        match sep {
            Some(sep) => {
                out.push_str(sep);
                rest = &rest[stretch.len() + 1..];
            }
            None => return out,
        }
    }
}

/// A URL for an error message: everything between the scheme and the last '@' hidden.
pub(super) fn redact_url(url: &str) -> String {
    match url.rfind('@') {
        None => url.to_string(),
        Some(at) => {
            let keep = url[..at].find("://").map_or(0, |i| i + 3);
            format!("{}<redacted>@{}", &url[..keep], &url[at + 1..])
        }
    }
}

/// A TOML error as one line: where it is, the offending line, and the message, with any URL
/// user info and query redacted (both can quote a broker or sink URL).
pub(super) fn one_line(e: &toml::de::Error, text: &str) -> String {
    let message = e.message().trim().replace('\n', " ");
    let line = redact_userinfo(&match e.span() {
        None => message,
        Some(span) => {
            let start = span.start.min(text.len());
            let line_no = text.get(..start).unwrap_or(text).matches('\n').count() + 1;
            let line = text.lines().nth(line_no - 1).unwrap_or("").trim();
            format!("line {line_no} `{}`: {message}", redact_secret_line(line))
        }
    });
    redact_query(&line)
}

/// A config line whose key names a secret (`password = "…"` typed where `password_file`
/// belongs) is quoted by its key alone.
fn redact_secret_line(line: &str) -> String {
    let key = line.split('=').next().unwrap_or(line).trim();
    let lower = key.to_ascii_lowercase();
    let secret = ["password", "passwd", "secret", "token", "authorization"]
        .iter()
        .any(|w| lower.contains(w));
    if secret && line.contains('=') && !lower.ends_with("_file") {
        format!("{key} = <redacted>")
    } else {
        line.to_string()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Config;

    #[test]
    fn a_secret_typed_inline_is_not_echoed_in_the_error() {
        let text = "[mqtt]\nbrokers = [\"mqtt://h\"]\nclient_id = \"x\"\ntopics = [\"t\"]\n\
                    password = \"hunter2\"\n";
        let e = Config::parse(text).unwrap_err().to_string();
        assert!(!e.contains("hunter2"), "{e}");
        assert!(
            e.contains("`password = <redacted>`") && e.contains("password"),
            "{e}"
        );
        // A file path is not a secret and is still quoted.
        let e = Config::parse("[mqtt]\npassword_file = 3\n")
            .unwrap_err()
            .to_string();
        assert!(e.contains("password_file = 3"), "{e}");
    }

    #[test]
    fn redact_query_hides_every_url_query_in_text_and_keeps_the_rest() {
        for (text, want) in [
            ("https://h:1/p?k=v", "https://h:1/p?<redacted>"),
            ("https://h/p#f", "https://h/p#<redacted>"),
            ("https://h/p", "https://h/p"),
            ("https://h/p?", "https://h/p?"),
            ("no url? here", "no url? here"),
            (
                "line 4 `url = \"http://h/?k=v w\" x`: expected newline",
                "line 4 `url = \"http://h/?<redacted>\" x`: expected newline",
            ),
            (
                "a \"http://h/?k\" and 'https://g/x?y' and `http://i?z`",
                "a \"http://h/?<redacted>\" and 'https://g/x?<redacted>' and `http://i?<redacted>`",
            ),
            // Unquoted, the rest of the line may be the query: it goes too.
            ("see http://h/?k=v w: more", "see http://h/?<redacted>"),
        ] {
            assert_eq!(redact_query(text), want, "{text}");
        }
    }

    #[test]
    fn secrets_never_print() {
        let s = Secret("hunter2".into());
        assert!(!format!("{s:?}").contains("hunter2"));
    }
}
