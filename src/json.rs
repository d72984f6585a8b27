//! A strict JSON reader and the two writers replay-guard needs (compact, canonical).
//!
//! Why our own: the digest must be exact, so numbers keep their source text (no f64 rounding),
//! duplicate member names are rejected (I-JSON; a parser that keeps "the last one" would let two
//! readers disagree on a message's key), and nesting depth is bounded before any recursion.

use std::borrow::Cow;

/// A parsed JSON value. Objects keep member order; numbers keep their text.
#[derive(Clone, Debug, PartialEq)]
pub enum Json {
    Null,
    Bool(bool),
    /// Validated JSON number text, exactly as received.
    Number(String),
    String(String),
    Array(Vec<Json>),
    Object(Vec<(String, Json)>),
}

/// Why a byte string is not acceptable JSON.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum JsonError {
    #[error("not valid UTF-8 (first bad byte at offset {0})")]
    NotUtf8(usize),
    #[error("invalid JSON at byte {offset}: {what}")]
    Syntax { offset: usize, what: &'static str },
    #[error("nesting deeper than {0} levels")]
    TooDeep(usize),
    #[error("duplicate member name {0:?}")]
    DuplicateKey(String),
    #[error("number {0} is out of the range replay-guard can canonicalise")]
    NumberRange(String),
}

/// Parses one JSON text (RFC 8259), allowing at most `max_depth` nested arrays/objects.
pub fn parse(bytes: &[u8], max_depth: usize) -> Result<Json, JsonError> {
    parse_borrowed(bytes, max_depth).map(Value::into_owned)
}

/// `parse`, into a tree that borrows its strings and numbers from `bytes` (a string is copied
/// only when it holds an escape). The one reader: `parse` is this, made owned.
pub(crate) fn parse_borrowed(bytes: &[u8], max_depth: usize) -> Result<Value<'_>, JsonError> {
    let text = std::str::from_utf8(bytes).map_err(|e| JsonError::NotUtf8(e.valid_up_to()))?;
    let mut p = Parser {
        s: text.as_bytes(),
        text,
        i: 0,
        max_depth,
    };
    p.ws();
    let v = p.value(0)?;
    p.ws();
    if p.i != p.s.len() {
        return Err(p.err("trailing characters after the value"));
    }
    Ok(v)
}

/// A parsed JSON value borrowing from its input (`parse_borrowed`): the feed's hot path reads
/// the contract's fields and the canonical form from it without copying the payload.
#[derive(Debug, PartialEq)]
pub(crate) enum Value<'a> {
    Null,
    Bool(bool),
    /// Validated JSON number text, exactly as received.
    Number(&'a str),
    String(Cow<'a, str>),
    Array(Vec<Value<'a>>),
    Object(Vec<(Cow<'a, str>, Value<'a>)>),
}

/// Objects up to this many members check a new name against each earlier one (no hashing, no
/// allocation); a larger object switches to a set, so a huge object stays linear.
const LINEAR_NAME_CHECK: usize = 16;

struct Parser<'a> {
    s: &'a [u8],
    text: &'a str,
    i: usize,
    max_depth: usize,
}

impl<'a> Parser<'a> {
    fn err(&self, what: &'static str) -> JsonError {
        JsonError::Syntax {
            offset: self.i,
            what,
        }
    }
    fn peek(&self) -> Option<u8> {
        self.s.get(self.i).copied()
    }
    fn ws(&mut self) {
        while let Some(b' ' | b'\t' | b'\n' | b'\r') = self.peek() {
            self.i += 1;
        }
    }
    fn eat(&mut self, lit: &[u8]) -> bool {
        if self.s.get(self.i..self.i + lit.len()) == Some(lit) {
            self.i += lit.len();
            true
        } else {
            false
        }
    }

    fn value(&mut self, depth: usize) -> Result<Value<'a>, JsonError> {
        match self.peek() {
            None => Err(self.err("unexpected end of input")),
            Some(b'{') => self.object(depth + 1),
            Some(b'[') => self.array(depth + 1),
            Some(b'"') => Ok(Value::String(self.string()?)),
            Some(b't') if self.eat(b"true") => Ok(Value::Bool(true)),
            Some(b'f') if self.eat(b"false") => Ok(Value::Bool(false)),
            Some(b'n') if self.eat(b"null") => Ok(Value::Null),
            Some(b'-' | b'0'..=b'9') => self.number(),
            Some(_) => Err(self.err("expected a value")),
        }
    }

    fn object(&mut self, depth: usize) -> Result<Value<'a>, JsonError> {
        if depth > self.max_depth {
            return Err(JsonError::TooDeep(self.max_depth));
        }
        self.i += 1;
        let mut members: Vec<(Cow<'a, str>, Value<'a>)> = Vec::with_capacity(8);
        // Built only once the object outgrows `LINEAR_NAME_CHECK`; a borrowed name costs no copy.
        let mut seen: Option<std::collections::HashSet<Cow<'a, str>>> = None;
        self.ws();
        if self.eat(b"}") {
            return Ok(Value::Object(members));
        }
        loop {
            self.ws();
            if self.peek() != Some(b'"') {
                return Err(self.err("expected a member name"));
            }
            let name = self.string()?;
            self.ws();
            if !self.eat(b":") {
                return Err(self.err("expected ':'"));
            }
            self.ws();
            let v = self.value(depth)?;
            let duplicate = match &mut seen {
                Some(set) => !set.insert(name.clone()),
                None => {
                    let found = members.iter().any(|(k, _)| *k == name);
                    if !found && members.len() >= LINEAR_NAME_CHECK {
                        let mut set: std::collections::HashSet<Cow<'a, str>> =
                            members.iter().map(|(k, _)| k.clone()).collect();
                        set.insert(name.clone());
                        seen = Some(set);
                    }
                    found
                }
            };
            if duplicate {
                return Err(JsonError::DuplicateKey(name.into_owned()));
            }
            members.push((name, v));
            self.ws();
            if self.eat(b",") {
                continue;
            }
            if self.eat(b"}") {
                return Ok(Value::Object(members));
            }
            return Err(self.err("expected ',' or '}'"));
        }
    }

    fn array(&mut self, depth: usize) -> Result<Value<'a>, JsonError> {
        if depth > self.max_depth {
            return Err(JsonError::TooDeep(self.max_depth));
        }
        self.i += 1;
        let mut items = Vec::new();
        self.ws();
        if self.eat(b"]") {
            return Ok(Value::Array(items));
        }
        loop {
            self.ws();
            items.push(self.value(depth)?);
            self.ws();
            if self.eat(b",") {
                continue;
            }
            if self.eat(b"]") {
                return Ok(Value::Array(items));
            }
            return Err(self.err("expected ',' or ']'"));
        }
    }

    fn hex4(&mut self) -> Result<u32, JsonError> {
        let digits = self
            .text
            .get(self.i..self.i + 4)
            .ok_or_else(|| self.err("truncated \\u escape"))?;
        let v = u32::from_str_radix(digits, 16).map_err(|_| self.err("bad \\u escape"))?;
        if !digits.bytes().all(|b| b.is_ascii_hexdigit()) {
            return Err(self.err("bad \\u escape"));
        }
        self.i += 4;
        Ok(v)
    }

    /// A string without escapes is borrowed as it stands; the first escape switches to a copy.
    fn string(&mut self) -> Result<Cow<'a, str>, JsonError> {
        self.i += 1; // opening quote
        let start = self.i;
        self.i += plain_prefix(&self.s[self.i..]);
        match self.peek() {
            None => return Err(self.err("unterminated string")),
            Some(b'"') => {
                let s = &self.text[start..self.i];
                self.i += 1;
                return Ok(Cow::Borrowed(s));
            }
            Some(b'\\') => {}
            Some(_) => return Err(self.err("control character in string")),
        }
        let mut out = String::with_capacity(self.i - start + 16);
        let mut run_start = start;
        loop {
            let Some(b) = self.peek() else {
                return Err(self.err("unterminated string"));
            };
            match b {
                b'"' => {
                    out.push_str(&self.text[run_start..self.i]);
                    self.i += 1;
                    return Ok(Cow::Owned(out));
                }
                b'\\' => {
                    out.push_str(&self.text[run_start..self.i]);
                    self.i += 1;
                    let Some(e) = self.peek() else {
                        return Err(self.err("unterminated escape"));
                    };
                    self.i += 1;
                    match e {
                        b'"' => out.push('"'),
                        b'\\' => out.push('\\'),
                        b'/' => out.push('/'),
                        b'b' => out.push('\u{8}'),
                        b'f' => out.push('\u{c}'),
                        b'n' => out.push('\n'),
                        b'r' => out.push('\r'),
                        b't' => out.push('\t'),
                        b'u' => {
                            let hi = self.hex4()?;
                            let c = if (0xD800..0xDC00).contains(&hi) {
                                if !self.eat(b"\\u") {
                                    return Err(self.err("lone surrogate in \\u escape"));
                                }
                                let lo = self.hex4()?;
                                if !(0xDC00..0xE000).contains(&lo) {
                                    return Err(self.err("lone surrogate in \\u escape"));
                                }
                                char::from_u32(0x10000 + ((hi - 0xD800) << 10) + (lo - 0xDC00))
                            } else {
                                char::from_u32(hi)
                            };
                            out.push(c.ok_or_else(|| self.err("lone surrogate in \\u escape"))?);
                        }
                        _ => return Err(self.err("unknown escape")),
                    }
                    run_start = self.i;
                }
                0x00..=0x1f => return Err(self.err("control character in string")),
                _ => self.i += 1,
            }
        }
    }

    fn digits(&mut self) -> usize {
        let start = self.i;
        while let Some(b'0'..=b'9') = self.peek() {
            self.i += 1;
        }
        self.i - start
    }

    fn number(&mut self) -> Result<Value<'a>, JsonError> {
        let start = self.i;
        self.eat(b"-");
        if self.eat(b"0") {
            if let Some(b'0'..=b'9') = self.peek() {
                return Err(self.err("leading zero in number"));
            }
        } else if self.digits() == 0 {
            return Err(self.err("expected digits"));
        }
        if self.eat(b".") && self.digits() == 0 {
            return Err(self.err("expected digits after '.'"));
        }
        if let Some(b'e' | b'E') = self.peek() {
            self.i += 1;
            if let Some(b'+' | b'-') = self.peek() {
                self.i += 1;
            }
            if self.digits() == 0 {
                return Err(self.err("expected exponent digits"));
            }
        }
        Ok(Value::Number(&self.text[start..self.i]))
    }
}

impl<'a> Value<'a> {
    /// The owned `Json` of this value.
    pub(crate) fn into_owned(self) -> Json {
        match self {
            Value::Null => Json::Null,
            Value::Bool(b) => Json::Bool(b),
            Value::Number(n) => Json::Number(n.to_string()),
            Value::String(s) => Json::String(s.into_owned()),
            Value::Array(items) => Json::Array(items.into_iter().map(Value::into_owned).collect()),
            Value::Object(members) => Json::Object(
                members
                    .into_iter()
                    .map(|(k, v)| (k.into_owned(), v.into_owned()))
                    .collect(),
            ),
        }
    }

    /// RFC 6901 JSON pointer lookup, as `Json::pointer`.
    pub(crate) fn pointer(&self, pointer: &Pointer) -> Option<&Value<'a>> {
        let mut cur = self;
        for token in &pointer.tokens {
            cur = match cur {
                Value::Object(members) => {
                    members.iter().find(|(k, _)| k == token).map(|(_, v)| v)?
                }
                Value::Array(items) => items.get(array_index(token)?)?,
                _ => return None,
            };
        }
        Some(cur)
    }

    /// Writes the canonical form, as `Json::to_canonical` does, sorting each object's members
    /// in place first (so no list of references is allocated per object).
    pub(crate) fn write_canonical(&mut self, out: &mut impl Sink) -> Result<(), JsonError> {
        match self {
            Value::Null => out.put("null"),
            Value::Bool(b) => out.put(if *b { "true" } else { "false" }),
            Value::Number(n) => write_canonical_number(out, n)?,
            Value::String(s) => write_string(out, s),
            Value::Array(items) => {
                out.put_byte(b'[');
                for (i, v) in items.iter_mut().enumerate() {
                    if i > 0 {
                        out.put_byte(b',');
                    }
                    v.write_canonical(out)?;
                }
                out.put_byte(b']');
            }
            Value::Object(members) => {
                members.sort_by(|a, b| member_order(&a.0, &b.0));
                out.put_byte(b'{');
                for (i, (k, v)) in members.iter_mut().enumerate() {
                    if i > 0 {
                        out.put_byte(b',');
                    }
                    write_string(out, k);
                    out.put_byte(b':');
                    v.write_canonical(out)?;
                }
                out.put_byte(b'}');
            }
        }
        Ok(())
    }
}

/// Where the writers put text: a `String`, or a hasher that never holds the text whole
/// (`key::message_digest` streams the canonical form into SHA-256).
pub trait Sink {
    fn put(&mut self, s: &str);
    /// Puts one ASCII byte (a quote, a bracket, a separator).
    fn put_byte(&mut self, b: u8);
}

impl Sink for String {
    fn put(&mut self, s: &str) {
        self.push_str(s);
    }
    fn put_byte(&mut self, b: u8) {
        debug_assert!(b.is_ascii());
        self.push(char::from(b));
    }
}

/// The canonical order of member names: by UTF-16 code units (RFC 8785). UTF-8 byte order is
/// code point order, which differs from UTF-16 order only between a character in
/// U+E000..=U+FFFF (lead byte 0xEE or 0xEF) and one above U+FFFF (lead byte 0xF0 or more), so
/// names compare as bytes unless both differ first at such a lead byte.
fn member_order(a: &str, b: &str) -> std::cmp::Ordering {
    let (x, y) = (a.as_bytes(), b.as_bytes());
    match x.iter().zip(y).position(|(p, q)| p != q) {
        None => x.len().cmp(&y.len()),
        Some(i) if x[i] >= 0xEE && y[i] >= 0xEE => a.encode_utf16().cmp(b.encode_utf16()),
        Some(i) => x[i].cmp(&y[i]),
    }
}

/// How many bytes at the start of `s` a JSON string holds as they stand: up to the first `"`,
/// `\\` or control character (or all of `s`). Eight bytes at a time.
fn plain_prefix(s: &[u8]) -> usize {
    const ONES: u64 = 0x0101_0101_0101_0101;
    const HIGH: u64 = 0x8080_8080_8080_8080;
    let mut i = 0;
    while let Some(chunk) = s.get(i..i + 8) {
        let mut word = [0u8; 8];
        word.copy_from_slice(chunk);
        let w = u64::from_le_bytes(word);
        let quote = w ^ (ONES * u64::from(b'"'));
        let backslash = w ^ (ONES * u64::from(b'\\'));
        // Nonzero exactly when some byte is below 0x20, or equal to `"` or `\\` (zero after
        // the xor); which byte is then found one at a time below.
        let hit = ((w.wrapping_sub(ONES * 0x20) & !w)
            | (quote.wrapping_sub(ONES) & !quote)
            | (backslash.wrapping_sub(ONES) & !backslash))
            & HIGH;
        if hit != 0 {
            break;
        }
        i += 8;
    }
    while let Some(&b) = s.get(i) {
        if b < 0x20 || b == b'"' || b == b'\\' {
            break;
        }
        i += 1;
    }
    i
}

impl Json {
    /// RFC 6901 JSON pointer lookup ("" is the whole document).
    pub fn pointer(&self, pointer: &Pointer) -> Option<&Json> {
        let mut cur = self;
        for token in &pointer.tokens {
            cur = match cur {
                Json::Object(members) => {
                    members.iter().find(|(k, _)| k == token).map(|(_, v)| v)?
                }
                Json::Array(items) => items.get(array_index(token)?)?,
                _ => return None,
            };
        }
        Some(cur)
    }

    /// A copy without the values the `pointers` name. Every pointer is resolved against this
    /// (original) document first and only then are the resolved nodes left out of the copy, so
    /// the result is the same whatever the order of `pointers`, and a repeated pointer removes
    /// its value once: `/list/0` and `/list/1` remove exactly the original items 0 and 1.
    /// Pointers naming nothing are ignored.
    pub fn without(&self, pointers: &[Pointer]) -> Json {
        let mut marks = Marks::default();
        for p in pointers {
            if let Some(path) = self.resolve(p) {
                marks.mark(&path);
            }
        }
        self.copy_without(&marks)
    }

    /// The child positions (member index, array index) a pointer walks to, if it names a value.
    fn resolve(&self, pointer: &Pointer) -> Option<Vec<usize>> {
        let mut cur = self;
        let mut path = Vec::with_capacity(pointer.tokens.len());
        for token in &pointer.tokens {
            let (i, next) = match cur {
                Json::Object(members) => members
                    .iter()
                    .enumerate()
                    .find(|(_, (k, _))| k == token)
                    .map(|(i, (_, v))| (i, v))?,
                Json::Array(items) => {
                    let i = array_index(token)?;
                    (i, items.get(i)?)
                }
                _ => return None,
            };
            path.push(i);
            cur = next;
        }
        Some(path)
    }

    fn copy_without(&self, marks: &Marks) -> Json {
        let keep = |i: usize| match marks.children.get(&i) {
            Some(m) if m.removed => None,
            other => Some(other),
        };
        match self {
            Json::Object(members) => Json::Object(
                members
                    .iter()
                    .enumerate()
                    .filter_map(|(i, (k, v))| {
                        keep(i).map(|m| {
                            (
                                k.clone(),
                                m.map_or_else(|| v.clone(), |m| v.copy_without(m)),
                            )
                        })
                    })
                    .collect(),
            ),
            Json::Array(items) => Json::Array(
                items
                    .iter()
                    .enumerate()
                    .filter_map(|(i, v)| {
                        keep(i).map(|m| m.map_or_else(|| v.clone(), |m| v.copy_without(m)))
                    })
                    .collect(),
            ),
            other => other.clone(),
        }
    }

    /// Compact form, members in received order, numbers as received.
    pub fn to_compact(&self) -> String {
        let mut out = String::new();
        self.write(&mut out);
        out
    }

    /// Canonical form (RFC 8785 JCS rules for structure and strings; numbers are written as
    /// exact normalised decimals, see `canonical_number`). Fails only on absurd exponents.
    pub fn to_canonical(&self) -> Result<String, JsonError> {
        let mut out = String::new();
        self.write_canonical(&mut out)?;
        Ok(out)
    }

    fn write(&self, out: &mut String) {
        match self {
            Json::Null => out.push_str("null"),
            Json::Bool(b) => out.push_str(if *b { "true" } else { "false" }),
            Json::Number(n) => out.push_str(n),
            Json::String(s) => write_string(out, s),
            Json::Array(items) => {
                out.push('[');
                for (i, v) in items.iter().enumerate() {
                    if i > 0 {
                        out.push(',');
                    }
                    v.write(out);
                }
                out.push(']');
            }
            Json::Object(members) => {
                out.push('{');
                for (i, (k, v)) in members.iter().enumerate() {
                    if i > 0 {
                        out.push(',');
                    }
                    write_string(out, k);
                    out.push(':');
                    v.write(out);
                }
                out.push('}');
            }
        }
    }

    fn write_canonical(&self, out: &mut String) -> Result<(), JsonError> {
        match self {
            Json::Number(n) => write_canonical_number(out, n)?,
            Json::Array(items) => {
                out.push('[');
                for (i, v) in items.iter().enumerate() {
                    if i > 0 {
                        out.push(',');
                    }
                    v.write_canonical(out)?;
                }
                out.push(']');
            }
            Json::Object(members) => {
                let mut sorted: Vec<&(String, Json)> = members.iter().collect();
                sorted.sort_by(|a, b| member_order(&a.0, &b.0));
                out.push('{');
                for (i, (k, v)) in sorted.into_iter().enumerate() {
                    if i > 0 {
                        out.push(',');
                    }
                    write_string(out, k);
                    out.push(':');
                    v.write_canonical(out)?;
                }
                out.push('}');
            }
            other => other.write(out),
        }
        Ok(())
    }
}

fn array_index(token: &str) -> Option<usize> {
    if token.is_empty() || (token.len() > 1 && token.starts_with('0')) {
        return None;
    }
    if !token.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    token.parse().ok()
}

/// Resolved removals: a tree of child positions, `removed` where a whole value goes.
#[derive(Default)]
struct Marks {
    removed: bool,
    children: std::collections::BTreeMap<usize, Marks>,
}

impl Marks {
    fn mark(&mut self, path: &[usize]) {
        match path.split_first() {
            None => self.removed = true,
            Some((first, rest)) => self.children.entry(*first).or_default().mark(rest),
        }
    }
}

/// A parsed RFC 6901 JSON pointer such as `/agency` or `/meta/source~1id`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Pointer {
    text: String,
    tokens: Vec<String>,
}

impl std::fmt::Display for Pointer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.text)
    }
}

impl Pointer {
    /// Whether one pointer names the other's value or something inside it (equal pointers
    /// included), so that leaving both out of a digest would mean something different from
    /// leaving out one. Tokens compare as decoded strings, which is exact: an array index has
    /// one spelling only (`0`, never `00` or `-0`, see `array_index`), and a token that is not
    /// a valid index (`00`) can only name an object member of that name.
    pub fn overlaps(&self, other: &Pointer) -> bool {
        self.tokens.iter().zip(&other.tokens).all(|(a, b)| a == b)
    }

    pub fn parse(s: &str) -> Result<Pointer, PointerError> {
        if s.is_empty() {
            return Ok(Pointer {
                text: String::new(),
                tokens: Vec::new(),
            });
        }
        let Some(rest) = s.strip_prefix('/') else {
            return Err(PointerError::NoLeadingSlash(s.to_string()));
        };
        let mut tokens = Vec::new();
        for raw in rest.split('/') {
            let mut t = String::with_capacity(raw.len());
            let mut chars = raw.chars();
            while let Some(c) = chars.next() {
                if c == '~' {
                    match chars.next() {
                        Some('0') => t.push('~'),
                        Some('1') => t.push('/'),
                        _ => return Err(PointerError::BadEscape(s.to_string())),
                    }
                } else {
                    t.push(c);
                }
            }
            tokens.push(t);
        }
        Ok(Pointer {
            text: s.to_string(),
            tokens,
        })
    }
}

/// Why a JSON pointer (RFC 6901) as written cannot be read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PointerError {
    #[error("JSON pointer {0:?} must be empty or start with '/'")]
    NoLeadingSlash(String),
    /// A `~` not followed by `0` or `1`.
    #[error("JSON pointer {0:?} has a bad '~' escape")]
    BadEscape(String),
}

/// Writes a JSON string with JCS escaping: `\"`, `\\`, `\b \f \n \r \t`, other controls as
/// `\u00xx` (lowercase hex), everything else literally.
pub fn write_string(out: &mut (impl Sink + ?Sized), s: &str) {
    out.put_byte(b'"');
    let bytes = s.as_bytes();
    let mut run_start = 0;
    loop {
        let i = run_start + plain_prefix(&bytes[run_start..]);
        let Some(&b) = bytes.get(i) else { break };
        out.put(&s[run_start..i]);
        match b {
            b'"' => out.put("\\\""),
            b'\\' => out.put("\\\\"),
            0x08 => out.put("\\b"),
            0x0c => out.put("\\f"),
            b'\n' => out.put("\\n"),
            b'\r' => out.put("\\r"),
            b'\t' => out.put("\\t"),
            _ => {
                const HEX: &[u8; 16] = b"0123456789abcdef";
                for c in [
                    b'\\',
                    b'u',
                    b'0',
                    b'0',
                    HEX[usize::from(b >> 4)],
                    HEX[usize::from(b & 0xf)],
                ] {
                    out.put_byte(c);
                }
            }
        }
        run_start = i + 1;
    }
    out.put(&s[run_start..]);
    out.put_byte(b'"');
}

/// Writes `canonical_number(text)`. The usual spellings (an integer of at most 21 digits, a
/// decimal fraction without trailing zeros or exponent and, below 1, at most five zeros after
/// the point) are already canonical and are written as they stand, with no allocation.
fn write_canonical_number(out: &mut (impl Sink + ?Sized), text: &str) -> Result<(), JsonError> {
    if is_canonical_number(text) {
        out.put(text);
    } else {
        out.put(&canonical_number(text)?);
    }
    Ok(())
}

/// Whether a valid JSON number's text is its own canonical form, for the common shapes only
/// (`false` means "compute it", never "it is not").
fn is_canonical_number(text: &str) -> bool {
    let unsigned = text.strip_prefix('-').unwrap_or(text);
    let (int, frac) = match unsigned.split_once('.') {
        Some((i, f)) => (i, Some(f)),
        None => (unsigned, None),
    };
    let digits = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit());
    // JSON allows a leading zero only as the whole integer part.
    if !digits(int) || (int.len() > 1 && int.starts_with('0')) {
        return false;
    }
    match frac {
        // `-0` is written `0`; more than 21 digits take the exponent form.
        None => int.len() <= 21 && text != "-0",
        Some(f) => {
            if !digits(f) || f.ends_with('0') {
                return false;
            }
            // Below 1: `0.` and up to five zeros before the first digit (then `1e-7` form).
            int != "0" || f.bytes().take_while(|&b| b == b'0').count() <= 5
        }
    }
}

/// Largest exponent magnitude read or written: 15 digits.
const MAX_EXPONENT: u64 = 999_999_999_999_999;

/// Normalises a JSON number's text to one exact decimal spelling, so `1`, `1.0`, `10e-1` and
/// `0.1E1` are all `1`, while `0.1` and `0.10000000000000000001` stay different (no f64).
/// Integers are written in full up to 21 digits; beyond that, and below 1e-6, `d.ddde±N`.
pub fn canonical_number(text: &str) -> Result<String, JsonError> {
    use std::fmt::Write as _;
    let range = || JsonError::NumberRange(text.to_string());
    let (negative, rest) = match text.strip_prefix('-') {
        Some(r) => (true, r),
        None => (false, text),
    };
    let (mantissa, exp_text) = match rest.find(['e', 'E']) {
        Some(i) => (&rest[..i], Some(&rest[i + 1..])),
        None => (rest, None),
    };
    let mut exponent: i64 = match exp_text {
        None => 0,
        Some(e) => {
            let digits = e.trim_start_matches(['+', '-']).trim_start_matches('0');
            if digits.len() > 15 {
                return Err(range());
            }
            let v: i64 = if digits.is_empty() {
                0
            } else {
                digits.parse().map_err(|_| range())?
            };
            if e.starts_with('-') { -v } else { v }
        }
    };
    let (int_part, frac_part) = match mantissa.find('.') {
        Some(i) => (&mantissa[..i], &mantissa[i + 1..]),
        None => (mantissa, ""),
    };
    let mut digits: String = format!("{int_part}{frac_part}");
    exponent -= i64::try_from(frac_part.len()).map_err(|_| range())?;
    let trimmed = digits.trim_start_matches('0');
    if trimmed.is_empty() {
        return Ok("0".to_string());
    }
    digits = trimmed.to_string();
    let before = digits.len();
    digits.truncate(digits.trim_end_matches('0').len());
    exponent += i64::try_from(before - digits.len()).map_err(|_| range())?;

    let n = i64::try_from(digits.len()).map_err(|_| range())?;
    let point = n + exponent; // position of the decimal point from the left of `digits`
    let mut out = String::new();
    if negative {
        out.push('-');
    }
    if exponent >= 0 && point <= 21 {
        out.push_str(&digits);
        out.extend(std::iter::repeat_n(
            '0',
            usize::try_from(exponent).map_err(|_| range())?,
        ));
    } else if exponent < 0 && point > 0 {
        let p = usize::try_from(point).map_err(|_| range())?;
        out.push_str(&digits[..p]);
        out.push('.');
        out.push_str(&digits[p..]);
    } else if exponent < 0 && point > -6 {
        out.push_str("0.");
        out.extend(std::iter::repeat_n(
            '0',
            usize::try_from(-point).map_err(|_| range())?,
        ));
        out.push_str(&digits);
    } else {
        out.push_str(&digits[..1]);
        if digits.len() > 1 {
            out.push('.');
            out.push_str(&digits[1..]);
        }
        let e = point - 1;
        // The canonical text must itself be canonicalisable (a fixed point): its exponent may
        // have at most the 15 digits accepted on input above.
        if e.unsigned_abs() > MAX_EXPONENT {
            return Err(range());
        }
        let _ = write!(
            out,
            "e{}{}",
            if e < 0 { '-' } else { '+' },
            e.unsigned_abs()
        );
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(s: &str) -> Result<Json, JsonError> {
        parse(s.as_bytes(), 32)
    }

    #[test]
    fn numbers_normalise_exactly() {
        for (a, b) in [
            ("1", "1"),
            ("1.0", "1"),
            ("10e-1", "1"),
            ("0.1E1", "1"),
            ("-0", "0"),
            ("-0.0e5", "0"),
            ("0.1", "0.1"),
            ("0.10000000000000000001", "0.10000000000000000001"),
            (
                "123456789012345678901234567890",
                "1.2345678901234567890123456789e+29",
            ),
            ("1e20", "100000000000000000000"),
            ("1e21", "1e+21"),
            ("0.000001", "0.000001"),
            ("0.0000001", "1e-7"),
            ("-12.50", "-12.5"),
            ("18446744073709551615", "18446744073709551615"),
        ] {
            assert_eq!(canonical_number(a).unwrap(), b, "{a}");
        }
        assert!(canonical_number("1e9999999999999999999").is_err());
    }

    #[test]
    fn a_canonical_number_is_its_own_canonical_form_even_at_the_exponent_limit() {
        // Found by the `decode` fuzz target: 15 exponent digits on input, 16 after
        // normalising, which the canonical form's own re-parse refused.
        let text = "999999999999999999999999999998190e999999999999991";
        assert!(canonical_number(text).is_err());
        for ok in [
            "1e999999999999999",
            "-1.5e-999999999999998",
            "12e999999999999998",
        ] {
            let c = canonical_number(ok).unwrap();
            assert_eq!(canonical_number(&c).unwrap(), c, "{ok}");
        }
    }

    #[test]
    fn canonical_form_sorts_members_and_drops_whitespace() {
        let a = p(r#"{ "b": [1, 2.0], "a": "x\u0041", "c": {"z":null,"y":true} }"#).unwrap();
        assert_eq!(
            a.to_canonical().unwrap(),
            r#"{"a":"xA","b":[1,2],"c":{"y":true,"z":null}}"#
        );
        assert_eq!(
            a.to_compact(),
            r#"{"b":[1,2.0],"a":"xA","c":{"z":null,"y":true}}"#
        );
    }

    #[test]
    fn canonical_strings_use_jcs_escapes() {
        let v = p(r#"["\u0007\n\"\\\/é😀"]"#).unwrap();
        assert_eq!(v.to_canonical().unwrap(), "[\"\\u0007\\n\\\"\\\\/é😀\"]");
    }

    #[test]
    fn members_sort_by_utf16_code_units() {
        // U+FF61 sorts before U+1F600 in UTF-8 byte order but after it in UTF-16
        // (0xFF61 > 0xD83D, the high surrogate of U+1F600).
        let v = p("{\"\u{FF61}\":2,\"\u{1F600}\":1}").unwrap();
        assert_eq!(
            v.to_canonical().unwrap(),
            "{\"\u{1F600}\":1,\"\u{FF61}\":2}"
        );
    }

    #[test]
    fn duplicate_member_names_are_refused_in_small_and_large_objects_alike() {
        // Small objects compare names one by one; from LINEAR_NAME_CHECK members on, a set.
        for n in [
            1,
            2,
            LINEAR_NAME_CHECK - 1,
            LINEAR_NAME_CHECK,
            LINEAR_NAME_CHECK + 5,
            200,
        ] {
            let names: Vec<String> = (0..n).map(|i| format!("\"m{i}\":{i}")).collect();
            let ok = format!("{{{}}}", names.join(","));
            assert!(p(&ok).is_ok(), "{n} distinct members");
            for dup in [0, n / 2, n - 1] {
                let text = format!("{{{},\"m{dup}\":null}}", names.join(","));
                assert_eq!(
                    p(&text),
                    Err(JsonError::DuplicateKey(format!("m{dup}"))),
                    "{n} members, m{dup} again"
                );
            }
        }
        // Names compare decoded: an escape spells the same name.
        assert_eq!(
            p(r#"{"ab":1,"a\u0062":2}"#),
            Err(JsonError::DuplicateKey("ab".into()))
        );
        let many: Vec<String> = (0..40).map(|i| format!("\"k{i}\":0")).collect();
        let text = format!("{{{},\"\\u006b7\":1}}", many.join(","));
        assert_eq!(p(&text), Err(JsonError::DuplicateKey("k7".into())));
        // A later syntax error is not reached: the duplicate is refused where it is read.
        assert!(matches!(
            p(r#"{"a":1,"a":2,"#),
            Err(JsonError::DuplicateKey(_))
        ));
    }

    #[test]
    fn strings_without_escapes_are_borrowed_and_with_escapes_decoded() {
        let text = r#"{"plain":"abc def ghijklmnop","esc":"a\"b\u00e9","k\n":"x"}"#;
        let Ok(Value::Object(members)) = parse_borrowed(text.as_bytes(), 4) else {
            panic!("an object")
        };
        assert!(matches!(members[0].0, Cow::Borrowed("plain")));
        assert!(matches!(
            members[0].1,
            Value::String(Cow::Borrowed("abc def ghijklmnop"))
        ));
        assert_eq!(members[1].1, Value::String(Cow::Owned("a\"bé".into())));
        assert_eq!(members[2].0, "k\n");
        // A control character is refused at its own offset, as before the fast scan.
        for (text, at) in [
            ("\"abcdefghij\u{1}\"", 11),
            ("\"a\u{1f}\"", 2),
            ("\"\\n\u{0}\"", 3),
        ] {
            assert_eq!(
                p(text),
                Err(JsonError::Syntax {
                    offset: at,
                    what: "control character in string"
                }),
                "{text:?}"
            );
        }
    }

    #[test]
    fn the_plain_prefix_stops_at_the_first_byte_a_string_must_escape() {
        let naive = |s: &[u8]| {
            s.iter()
                .position(|&b| b < 0x20 || b == b'"' || b == b'\\')
                .unwrap_or(s.len())
        };
        let mut cases: Vec<Vec<u8>> = vec![b"".to_vec(), "é€😀 plain text".into()];
        for len in 0..20 {
            for at in 0..len {
                for special in [b'"', b'\\', 0x00, 0x1f, 0x20, 0x7f, 0x80, 0xff, b'!', b']'] {
                    let mut v = vec![b'a'; len];
                    v[at] = special;
                    cases.push(v);
                }
            }
        }
        for c in &cases {
            assert_eq!(plain_prefix(c), naive(c), "{c:?}");
        }
    }

    #[test]
    fn strictness() {
        assert!(matches!(
            p(r#"{"a":1,"a":2}"#),
            Err(JsonError::DuplicateKey(_))
        ));
        assert!(matches!(p("[[[[1]]]]").map(|_| ()), Ok(())));
        assert!(matches!(parse(b"[[[[1]]]]", 3), Err(JsonError::TooDeep(3))));
        assert!(matches!(parse(b"\"\xff\"", 3), Err(JsonError::NotUtf8(1))));
        for bad in [
            "",
            "01",
            "1.",
            "-",
            "[1,]",
            "{\"a\"}",
            "\"\\ud800\"",
            "\"a\tb\"",
            "1 2",
            "nul",
        ] {
            assert!(p(bad).is_err(), "{bad:?} should fail");
        }
    }

    #[test]
    fn pointers_follow_rfc6901() {
        let v = p(r#"{"a/b":{"m~n":[10,20]}}"#).unwrap();
        let ptr = Pointer::parse("/a~1b/m~0n/1").unwrap();
        assert_eq!(v.pointer(&ptr), Some(&Json::Number("20".into())));
        assert!(Pointer::parse("a").is_err());
        let w = v.without(&[Pointer::parse("/a~1b/m~0n/0").unwrap()]);
        assert_eq!(w.to_compact(), r#"{"a/b":{"m~n":[20]}}"#);
        assert_eq!(v.without(&[Pointer::parse("/nope").unwrap()]), v);
    }

    #[test]
    fn removal_resolves_every_pointer_against_the_original_document() {
        let v = p(r#"{"list":["a","b","c","d"],"m":{"x":1,"y":2},"k":0}"#).unwrap();
        let ptr = |s: &str| Pointer::parse(s).unwrap();
        let set = [ptr("/list/0"), ptr("/list/1"), ptr("/m/x"), ptr("/k")];
        let want = r#"{"list":["c","d"],"m":{"y":2}}"#;
        // Every order of the list, and repeats, give the same result.
        let orders: [&[usize]; 5] = [
            &[0, 1, 2, 3],
            &[3, 2, 1, 0],
            &[1, 0, 3, 2],
            &[0, 0, 1, 1, 2, 3],
            &[1, 3, 1, 0, 2, 0],
        ];
        for order in orders {
            let list: Vec<Pointer> = order.iter().map(|&i| set[i].clone()).collect();
            assert_eq!(v.without(&list).to_compact(), want, "{order:?}");
        }
        // A pointer into a removed value, and pointers naming nothing, change nothing more.
        let more = [
            ptr("/m"),
            ptr("/m/x"),
            ptr("/list/9"),
            ptr("/list/00"),
            ptr("/k/0"),
        ];
        assert_eq!(
            v.without(&more).to_compact(),
            r#"{"list":["a","b","c","d"],"k":0}"#
        );
    }

    #[test]
    fn pointers_overlap_when_one_contains_the_other() {
        let ptr = |s: &str| Pointer::parse(s).unwrap();
        assert!(ptr("/a").overlaps(&ptr("/a")));
        assert!(ptr("/a").overlaps(&ptr("/a/b")));
        assert!(ptr("/a/b").overlaps(&ptr("/a")));
        assert!(ptr("/a~1b").overlaps(&ptr("/a~1b/0")));
        assert!(!ptr("/a").overlaps(&ptr("/ab")));
        assert!(!ptr("/a~1b").overlaps(&ptr("/a/b")));
        // `00` is not an array index, so it never names what `0` names.
        assert!(!ptr("/list/0").overlaps(&ptr("/list/00")));
        let v = p(r#"{"list":["x"]}"#).unwrap();
        assert_eq!(v.pointer(&ptr("/list/00")), None);
        assert_eq!(v.pointer(&ptr("/list/-0")), None);
    }

    #[test]
    fn numbers_with_an_exponent_of_16_or_more_digits_are_out_of_range() {
        // The documented range: an exponent of at most 15 significant digits.
        assert_eq!(
            canonical_number("1e999999999999999").unwrap(),
            "1e+999999999999999"
        );
        assert_eq!(
            canonical_number("-2.5E-000000000000000000000999999999999999").unwrap(),
            "-2.5e-999999999999999"
        );
        for text in [
            "1e1000000000000000",
            "1e-1000000000000000",
            "1e9999999999999999999",
        ] {
            assert_eq!(
                canonical_number(text),
                Err(JsonError::NumberRange(text.into())),
                "{text}"
            );
        }
        // Valid JSON: it parses; only the canonical form (the digest) refuses it.
        let v = p(r#"{"x":1e9999999999999999999}"#).unwrap();
        assert!(matches!(v.to_canonical(), Err(JsonError::NumberRange(_))));
    }
}

/// The strict reader against serde_json, the reference reader: on documents without duplicate
/// member names both accept and reject the same texts and read the same values, and what
/// `to_compact` writes reads back as the same value in both.
#[cfg(test)]
mod vs_serde_json {
    use proptest::prelude::*;

    use super::*;

    /// Depth both readers allow (serde_json's recursion limit is 128).
    const DEPTH: usize = 100;

    /// Our value as serde_json's (numbers through serde_json's own number reader).
    fn to_serde(v: &Json) -> serde_json::Value {
        match v {
            Json::Null => serde_json::Value::Null,
            Json::Bool(b) => serde_json::Value::Bool(*b),
            Json::Number(n) => serde_json::from_str(n).expect("a number serde_json reads"),
            Json::String(s) => serde_json::Value::String(s.clone()),
            Json::Array(a) => serde_json::Value::Array(a.iter().map(to_serde).collect()),
            Json::Object(m) => {
                serde_json::Value::Object(m.iter().map(|(k, v)| (k.clone(), to_serde(v))).collect())
            }
        }
    }

    /// A number whose magnitude serde_json (f64) can hold: it refuses the rest, we keep the text.
    fn in_f64_range(v: &Json) -> bool {
        match v {
            Json::Number(n) => serde_json::from_str::<serde_json::Value>(n).is_ok(),
            Json::Array(a) => a.iter().all(in_f64_range),
            Json::Object(m) => m.iter().all(|(_, v)| in_f64_range(v)),
            _ => true,
        }
    }

    fn check(text: &str) -> Result<(), TestCaseError> {
        let ours = parse(text.as_bytes(), DEPTH);
        let theirs = serde_json::from_str::<serde_json::Value>(text);
        match (&ours, &theirs) {
            // serde_json keeps the last of two equal names: not comparable.
            (Err(JsonError::DuplicateKey(_)), _) => {}
            (Ok(v), Ok(t)) => {
                prop_assert_eq!(&to_serde(v), t, "{:?}", text);
                let again: serde_json::Value = serde_json::from_str(&v.to_compact())
                    .map_err(|e| TestCaseError::fail(format!("{e}: {text:?}")))?;
                prop_assert_eq!(&again, t, "compact of {:?}", text);
                let reread = parse(v.to_compact().as_bytes(), DEPTH);
                prop_assert_eq!(reread.as_ref(), Ok(v));
            }
            (Ok(v), Err(e)) => prop_assert!(
                !in_f64_range(v) && e.to_string().contains("number out of range"),
                "we accept, serde_json refuses ({e}): {text:?}"
            ),
            (Err(e), Ok(_)) => prop_assert!(false, "we refuse ({e}), serde_json accepts: {text:?}"),
            (Err(_), Err(_)) => {}
        }
        Ok(())
    }

    /// JSON-shaped text: valid documents, then cut, doubled or with one character changed.
    fn doc() -> impl Strategy<Value = String> {
        let leaf = prop_oneof![
            Just("null".to_string()),
            Just("true".to_string()),
            Just("false".to_string()),
            "-?(0|[1-9][0-9]{0,20})(\\.[0-9]{1,8})?([eE][+-]?[0-9]{1,3})?",
            "\"([a-zA-Z0-9 é€😀]|\\\\[\"\\\\/bfnrt]|\\\\u[0-9a-fA-F]{4}){0,8}\"",
        ];
        let value = leaf.prop_recursive(4, 32, 5, |inner| {
            prop_oneof![
                prop::collection::vec(inner.clone(), 0..5)
                    .prop_map(|v| format!("[{}]", v.join(","))),
                prop::collection::vec(("[a-e]{1,2}", inner), 0..5).prop_map(|v| {
                    let members: Vec<String> = v
                        .into_iter()
                        .map(|(k, v)| format!("\"{k}\" : {v}"))
                        .collect();
                    format!("{{ {} }}", members.join(","))
                }),
            ]
        });
        (
            value,
            0usize..4,
            any::<prop::sample::Index>(),
            prop_oneof![
                Just(' '),
                Just(','),
                Just('"'),
                Just('\\'),
                Just('}'),
                Just(']'),
                Just('0'),
                Just('e'),
                Just('\u{1}'),
                Just('\t')
            ],
        )
            .prop_map(|(text, how, at, c)| {
                let at = at.index(text.len() + 1);
                let at = (0..=at)
                    .rev()
                    .find(|i| text.is_char_boundary(*i))
                    .unwrap_or(0);
                match how {
                    0 => text,
                    1 => text[..at].to_string(),
                    2 => format!("{}{c}{}", &text[..at], &text[at..]),
                    _ => format!(" {text}\n{c}"),
                }
            })
    }

    /// The borrowed reader's canonical form (the feed's digest) is the owned tree's, byte for
    /// byte, and both readers accept and refuse alike.
    fn canonical_alike(text: &str) -> Result<(), TestCaseError> {
        let owned = parse(text.as_bytes(), DEPTH);
        let borrowed = parse_borrowed(text.as_bytes(), DEPTH);
        match (owned, borrowed) {
            (Ok(o), Ok(mut b)) => {
                let mut direct = String::new();
                let got = b.write_canonical(&mut direct).map(|()| direct);
                prop_assert_eq!(got, o.to_canonical(), "{:?}", text);
            }
            (o, b) => prop_assert_eq!(o.map(|_| ()), b.map(|_| ())),
        }
        Ok(())
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(4000))]

        #[test]
        fn documents_read_alike(text in doc()) {
            check(&text)?;
            canonical_alike(&text)?;
        }

        #[test]
        fn canonical_forms_of_both_trees_are_identical(
            names in prop::collection::vec("([a-d]|[é€]|\u{FF61}|\u{1F600}|\u{E000}|\u{10000}){0,3}", 0..8),
            numbers in prop::collection::vec("-?(0|[1-9][0-9]{0,24})(\\.[0-9]{1,9})?([eE][+-]?[0-9]{1,3})?", 8),
        ) {
            let mut seen = std::collections::HashSet::new();
            let members: Vec<String> = names
                .iter()
                .filter(|n| seen.insert(n.as_str()))
                .zip(numbers.iter().cycle())
                .map(|(k, v)| format!("{}:[{v},\"{k}\"]", Json::String(k.clone()).to_compact()))
                .collect();
            canonical_alike(&format!("{{{}}}", members.join(",")))?;
        }

        #[test]
        fn a_number_written_as_it_stands_is_its_canonical_form(
            text in "-?(0|[1-9][0-9]{0,25})(\\.[0-9]{1,12})?([eE][+-]?[0-9]{1,3})?"
        ) {
            if is_canonical_number(&text) {
                prop_assert_eq!(canonical_number(&text).ok(), Some(text.clone()));
            }
        }

        #[test]
        fn member_order_is_utf16_order(a in "\\PC{0,6}", b in "\\PC{0,6}") {
            prop_assert_eq!(member_order(&a, &b), a.encode_utf16().cmp(b.encode_utf16()));
        }

        #[test]
        fn any_text_is_accepted_or_refused_alike(text in "\\PC{0,24}") {
            check(&text)?;
        }
    }

    #[test]
    fn the_edges_read_alike() {
        for text in [
            "",
            " ",
            "0",
            "-0",
            "01",
            "1.",
            ".5",
            "1e",
            "1e+",
            "+1",
            "\"\\ud800\"",
            "\"\\ud83d\\ude00\"",
            "\"\\u00e9\"",
            "[1,]",
            "{\"a\":1,}",
            "{\"a\" 1}",
            "nul",
            "\"\u{7f}\"",
            "\"\u{1f}\"",
            "[[[]]]",
            "{\"\":{}}",
            "1 2",
            "\u{feff}1",
            "1e400",
            "-1e-400",
        ] {
            check(text).unwrap();
            canonical_alike(text).unwrap();
        }
    }
}
