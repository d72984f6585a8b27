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
    while let Some(s) = rest.find("://") {
        // The URL starts at its scheme; a quote or backtick right before it is its opener,
        // and only that character (or a line end) closes it: a URL in single quotes may
        // hold a '"' and go on after it. An unquoted one runs to the line's end.
        let scheme_start = rest[..s]
            .char_indices()
            .rev()
            .find(|(_, c)| !(c.is_ascii_alphanumeric() || matches!(c, '+' | '-' | '.')))
            .map_or(0, |(i, c)| i + c.len_utf8());
        let opener = rest[..scheme_start]
            .chars()
            .next_back()
            .filter(|c| matches!(c, '"' | '\'' | '`'));
        let after = s + 3;
        let end = match opener {
            Some(q) => rest[after..].find([q, '\n']),
            None => rest[after..].find(['\n', '`']),
        }
        .map_or(rest.len(), |e| after + e);
        match rest[after..end].find(['?', '#']) {
            Some(q) if after + q + 1 < end => {
                out.push_str(&rest[..after + q + 1]);
                out.push_str(REDACTED_QUERY);
            }
            _ => out.push_str(&rest[..end]),
        }
        rest = &rest[end..];
    }
    out.push_str(rest);
    out
}

/// One URL value (as configured, whole) for an error message: everything after the first
/// `?` or `#` that follows its `://` hidden, whatever it holds (quotes, line breaks).
pub(super) fn redact_query_of(url: &str) -> String {
    match url
        .find("://")
        .and_then(|s| url[s + 3..].find(['?', '#']).map(|q| s + 3 + q + 1))
    {
        Some(k) if k < url.len() => format!("{}{REDACTED_QUERY}", &url[..k]),
        _ => url.to_string(),
    }
}

/// Whether the text from `line_start` on lies inside a multi-line string (`"""` or `'''`,
/// counted as they come) opened before it whose text so far holds a URL with a query: a TOML
/// error quoting such a line could quote the query's continuation, which holds no `://`.
fn in_multiline_url_query(text: &str, line_start: usize) -> bool {
    let before = text.get(..line_start).unwrap_or(text);
    let mut open: Option<(&str, usize)> = None;
    let mut i = 0;
    while i < before.len() {
        let rest = &before[i..];
        let delimiter = ["\"\"\"", "'''"].into_iter().find(|d| rest.starts_with(*d));
        match (open, delimiter) {
            (None, Some(d)) => {
                open = Some((d, i + 3));
                i += 3;
            }
            (Some((o, _)), Some(d)) if o == d => {
                open = None;
                i += 3;
            }
            _ => i += rest.chars().next().map_or(1, char::len_utf8),
        }
    }
    open.is_some_and(|(_, start)| {
        let content = &before[start..];
        content
            .find("://")
            .is_some_and(|s| content[s..].contains(['?', '#']))
    })
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
            let line_start = text
                .get(..start)
                .unwrap_or(text)
                .rfind('\n')
                .map_or(0, |i| i + 1);
            let shown = if in_multiline_url_query(text, line_start) {
                "<redacted: inside a multi-line string holding a URL query>".to_string()
            } else {
                redact_secret_line(line)
            };
            format!("line {line_no} `{shown}`: {message}")
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
            // Only its own quote ends a quoted URL: a '"' inside single quotes does not.
            (
                "line 6 `url = 'http://h:80/cop?a=1\"&token=S3cret' trailing`: expected",
                "line 6 `url = 'http://h:80/cop?<redacted>' trailing`: expected",
            ),
        ] {
            assert_eq!(redact_query(text), want, "{text}");
        }
    }

    #[test]
    fn a_url_value_hides_its_whole_query_and_a_multi_line_continuation_is_not_quoted() {
        assert_eq!(
            redact_query_of("http://h:x/cop?a=1\"&token=S3cret"),
            "http://h:x/cop?<redacted>"
        );
        assert_eq!(
            redact_query_of("http://h:x/cop?a=1\n&key=S3cret"),
            "http://h:x/cop?<redacted>"
        );
        assert_eq!(redact_query_of("http://h/p"), "http://h/p");
        for text in [
            "[[sink]]\nurl = \"\"\"http://h/cop?a=1\n&key=S3cret\"\"\" x\n",
            "[[sink]]\nurl = '''http://h/cop?a=1\nkey=S3cret''' x\n",
        ] {
            let e = Config::parse(text).unwrap_err().to_string();
            assert!(!e.contains("S3cret"), "{e}");
            assert!(
                e.contains("inside a multi-line string holding a URL query"),
                "{e}"
            );
        }
    }

    #[test]
    fn secrets_never_print() {
        let s = Secret("hunter2".into());
        assert!(!format!("{s:?}").contains("hunter2"));
    }
}
