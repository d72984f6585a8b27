//! TLS to PostgreSQL, as libpq's `sslmode`: the dsn's `sslmode`, `sslrootcert`, `sslcert` and
//! `sslkey` (tokio-postgres parses none but `sslmode`, and that only in part) taken out of the
//! dsn here, a rustls client per mode on `crate::tls`'s provider, and tokio-postgres's TLS
//! traits over tokio-rustls. The store and the relay's `postgres` sink connect through
//! `parse_dsn`; nothing here prints the dsn.

use std::future::Future;
use std::io;
use std::ops::Range;
use std::path::PathBuf;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use sha2::Digest;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio_postgres::config::{Host, SslMode as PgSslMode};
use tokio_postgres::tls::{ChannelBinding, MakeTlsConnect, TlsConnect, TlsStream};
use tokio_rustls::TlsConnector;
use tokio_rustls::rustls::client::danger::{
    HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier,
};
use tokio_rustls::rustls::crypto::{
    CryptoProvider, verify_tls12_signature, verify_tls13_signature,
};
use tokio_rustls::rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use tokio_rustls::rustls::server::ParsedCertificate;
use tokio_rustls::rustls::{
    self, AlertDescription, CertificateError, ClientConfig, DigitallySignedStruct, RootCertStore,
    SignatureScheme,
};

/// libpq's `sslmode`, without `allow` (plain first, TLS only if the server insists).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SslMode {
    /// Plain TCP: the default when the dsn names no `sslmode`.
    Disable,
    /// TLS if the server offers it, else plain (no protection against an active attacker).
    Prefer,
    /// TLS or nothing; the certificate is not checked (unless `sslrootcert` is given).
    Require,
    /// TLS, the certificate chain checked against `sslrootcert`, not the host name.
    VerifyCa,
    /// TLS, the chain checked against `sslrootcert` and the certificate valid for the host.
    VerifyFull,
}

/// Why a dsn cannot be used. Never quotes the dsn (it may hold a password): names the key,
/// the mode and the files.
#[derive(Debug, thiserror::Error)]
pub enum DsnError {
    #[error(
        "sslmode=allow is not supported: use disable, prefer, require, verify-ca or verify-full"
    )]
    AllowMode,
    #[error("sslmode={0:?} is not one of disable, prefer, require, verify-ca, verify-full")]
    UnknownMode(String),
    /// tokio-postgres refused the rest of the dsn (`describe`d).
    #[error("the postgres dsn is not understood: {0}")]
    NotUnderstood(String),
    #[error(
        "sslmode={mode} needs host= (the name the server's certificate is checked against), \
         not only hostaddr"
    )]
    NoHostName { mode: &'static str },
    #[error(
        "sslmode={mode}: host {} is a Unix socket, which PostgreSQL never encrypts: use \
         sslmode=disable for it",
        socket.display()
    )]
    UnixSocket { mode: &'static str, socket: PathBuf },
    #[error(
        "sslmode={mode}: sslrootcert=system is not supported (replay-guard reads no system \
         trust store): name the CA certificates' PEM file"
    )]
    SystemRoots { mode: &'static str },
    #[error(
        "sslmode={mode} needs sslrootcert=FILE in the dsn (the CA certificates, PEM): \
         replay-guard reads no system trust store"
    )]
    NoRootCert { mode: &'static str },
    /// rustls cannot verify with the anchors of `sslrootcert`.
    #[error("sslrootcert {}: {error}", path.display())]
    Verifier {
        path: PathBuf,
        error: rustls::client::VerifierBuilderError,
    },
    #[error("sslcert and sslkey go together: give both or neither")]
    HalfIdentity,
    #[error(transparent)]
    Tls(#[from] crate::tls::TlsError),
}

/// The dsn's TLS keys, taken out of it (sans-IO).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TlsKeys {
    pub mode: SslMode,
    pub rootcert: Option<PathBuf>,
    pub cert: Option<PathBuf>,
    pub key: Option<PathBuf>,
}

/// Splits `dsn` (`key=value` pairs or a `postgres[ql]://` URL) into the dsn tokio-postgres
/// parses and the TLS keys it does not. Errors never quote the dsn.
pub fn split_dsn(dsn: &str) -> Result<(String, TlsKeys), DsnError> {
    let dsn = dsn.trim();
    let url = dsn.starts_with("postgres://") || dsn.starts_with("postgresql://");
    let pairs = if url { url_pairs(dsn) } else { kv_pairs(dsn) };
    let mut keys = TlsKeys {
        mode: SslMode::Disable,
        rootcert: None,
        cert: None,
        key: None,
    };
    let mut rest = String::new();
    let mut from = 0;
    for (span, k, v) in pairs {
        let path = || Some(PathBuf::from(&v));
        match k.as_str() {
            "sslmode" => keys.mode = ssl_mode(&v)?,
            "sslrootcert" => keys.rootcert = path(),
            "sslcert" => keys.cert = path(),
            "sslkey" => keys.key = path(),
            _ => continue,
        }
        rest.push_str(&dsn[from..span.start]);
        from = span.end;
    }
    rest.push_str(&dsn[from..]);
    if url {
        // A query left empty, or with a stray separator where a pair was taken out.
        rest = rest.replace("?&", "?").replace("&&", "&");
        while rest.ends_with(['?', '&']) {
            rest.pop();
        }
    }
    Ok((rest, keys))
}

fn ssl_mode(v: &str) -> Result<SslMode, DsnError> {
    Ok(match v {
        "disable" => SslMode::Disable,
        "prefer" => SslMode::Prefer,
        "require" => SslMode::Require,
        "verify-ca" => SslMode::VerifyCa,
        "verify-full" => SslMode::VerifyFull,
        "allow" => return Err(DsnError::AllowMode),
        _ => return Err(DsnError::UnknownMode(v.to_string())),
    })
}

/// `key=value` pairs (libpq quoting: `'...'`, backslash escapes), each with its span.
fn kv_pairs(dsn: &str) -> Vec<(Range<usize>, String, String)> {
    let mut out = Vec::new();
    let mut it = dsn.char_indices().peekable();
    loop {
        while it.next_if(|(_, c)| c.is_whitespace()).is_some() {}
        let Some(&(start, _)) = it.peek() else { break };
        let mut k = String::new();
        while let Some((_, c)) = it.next_if(|(_, c)| *c != '=' && !c.is_whitespace()) {
            k.push(c);
        }
        while it.next_if(|(_, c)| c.is_whitespace()).is_some() {}
        if it.next_if(|(_, c)| *c == '=').is_none() {
            break; // not a dsn tokio-postgres takes either: left for it to refuse
        }
        while it.next_if(|(_, c)| c.is_whitespace()).is_some() {}
        let mut v = String::new();
        if it.next_if(|(_, c)| *c == '\'').is_some() {
            while let Some((_, c)) = it.next() {
                match c {
                    '\\' => v.extend(it.next().map(|(_, c)| c)),
                    '\'' => break,
                    c => v.push(c),
                }
            }
        } else {
            while let Some((_, c)) = it.next_if(|(_, c)| !c.is_whitespace()) {
                match c {
                    '\\' => v.extend(it.next().map(|(_, c)| c)),
                    c => v.push(c),
                }
            }
        }
        let end = it.peek().map_or(dsn.len(), |(i, _)| *i);
        out.push((start..end, k, v));
    }
    out
}

/// A URL's query pairs (percent-decoded), each with its span.
fn url_pairs(dsn: &str) -> Vec<(Range<usize>, String, String)> {
    let Some(q) = dsn.find('?') else {
        return Vec::new();
    };
    let mut out = Vec::new();
    let mut at = q + 1;
    for pair in dsn[q + 1..].split('&') {
        if let Some((k, v)) = pair.split_once('=') {
            out.push((at..at + pair.len(), percent_decode(k), percent_decode(v)));
        }
        at += pair.len() + 1;
    }
    out
}

fn percent_decode(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        let hex = b
            .get(i + 1..i + 3)
            .and_then(|h| std::str::from_utf8(h).ok());
        match hex.and_then(|h| u8::from_str_radix(h, 16).ok()) {
            Some(byte) if b[i] == b'%' => {
                out.push(byte);
                i += 3;
            }
            _ => {
                out.push(b[i]);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// Parses `dsn` for tokio-postgres and makes its TLS connector (reading `sslrootcert`,
/// `sslcert`, `sslkey`). Errors name the files and the mode, never the dsn.
pub fn parse_dsn(dsn: &str) -> Result<(tokio_postgres::Config, PgTls), DsnError> {
    let (rest, keys) = split_dsn(dsn)?;
    let mut config: tokio_postgres::Config = rest
        .parse()
        .map_err(|e| DsnError::NotUnderstood(super::describe(&e)))?;
    config.ssl_mode(match keys.mode {
        SslMode::Disable => PgSslMode::Disable,
        SslMode::Prefer => PgSslMode::Prefer,
        _ => PgSslMode::Require,
    });
    let name = mode_name(keys.mode);
    if keys.mode != SslMode::Disable && keys.mode != SslMode::Prefer {
        if config.get_hosts().is_empty() {
            return Err(DsnError::NoHostName { mode: name });
        }
        if let Some(Host::Unix(p)) = config
            .get_hosts()
            .iter()
            .find(|h| matches!(h, Host::Unix(_)))
        {
            return Err(DsnError::UnixSocket {
                mode: name,
                socket: p.clone(),
            });
        }
    }
    Ok((config, PgTls::new(&keys)?))
}

fn mode_name(m: SslMode) -> &'static str {
    match m {
        SslMode::Disable => "disable",
        SslMode::Prefer => "prefer",
        SslMode::Require => "require",
        SslMode::VerifyCa => "verify-ca",
        SslMode::VerifyFull => "verify-full",
    }
}

/// tokio-postgres's `MakeTlsConnect`: the rustls client for the dsn's mode (none for
/// `disable`, where tokio-postgres never asks for TLS).
#[derive(Clone)]
pub struct PgTls {
    client: Option<Arc<ClientConfig>>,
    /// The trust anchors' file, for the errors.
    rootcert: Option<PathBuf>,
}

impl PgTls {
    fn new(keys: &TlsKeys) -> Result<PgTls, DsnError> {
        let name = mode_name(keys.mode);
        if keys.mode == SslMode::Disable {
            return Ok(PgTls {
                client: None,
                rootcert: None,
            });
        }
        let provider = crate::tls::provider();
        let verifier: Arc<dyn ServerCertVerifier> = match &keys.rootcert {
            Some(p) if p.as_os_str() == "system" => {
                return Err(DsnError::SystemRoots { mode: name });
            }
            Some(p) => {
                let roots = Arc::new(crate::tls::roots(p, "sslrootcert")?);
                if keys.mode == SslMode::VerifyFull {
                    // The chain and the host name, as the http sink checks.
                    rustls::client::WebPkiServerVerifier::builder_with_provider(
                        roots,
                        provider.clone(),
                    )
                    .build()
                    .map_err(|error| DsnError::Verifier {
                        path: p.clone(),
                        error,
                    })?
                } else {
                    Arc::new(NoHostName {
                        roots: Some(roots),
                        provider: provider.clone(),
                    })
                }
            }
            None if matches!(keys.mode, SslMode::VerifyCa | SslMode::VerifyFull) => {
                return Err(DsnError::NoRootCert { mode: name });
            }
            None => Arc::new(NoHostName {
                roots: None,
                provider: provider.clone(),
            }),
        };
        let builder = ClientConfig::builder_with_provider(provider.clone())
            .with_safe_default_protocol_versions()
            .map_err(crate::tls::TlsError::Setup)?
            .dangerous()
            .with_custom_certificate_verifier(verifier);
        let mut client = match (&keys.cert, &keys.key) {
            (None, None) => builder.with_no_client_auth(),
            (Some(c), Some(k)) => {
                crate::tls::with_identity(builder, (c, "sslcert"), (k, "sslkey"))?
            }
            _ => return Err(DsnError::HalfIdentity),
        };
        // What libpq 17 sends, and what PostgreSQL 17 requires with sslnegotiation=direct.
        client.alpn_protocols = vec![b"postgresql".to_vec()];
        Ok(PgTls {
            client: Some(Arc::new(client)),
            rootcert: keys.rootcert.clone(),
        })
    }
}

/// Why a TLS handshake with PostgreSQL failed. `refused`: a certificate or host name was
/// refused (the server's by us, or ours by the server), which no retry can mend: a
/// configuration error, not an outage. tokio-postgres keeps it as the source of its error,
/// where `conn::classify` and the postgres sink find it.
#[derive(Debug)]
pub struct HandshakeError {
    pub refused: bool,
    text: String,
}

impl std::fmt::Display for HandshakeError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.text)
    }
}

impl std::error::Error for HandshakeError {}

impl HandshakeError {
    fn other(text: String) -> HandshakeError {
        HandshakeError {
            refused: false,
            text,
        }
    }

    /// The refusal among `e`'s causes, if a certificate or host name was refused.
    pub fn refusal_in<'a>(e: &'a (dyn std::error::Error + 'static)) -> Option<&'a HandshakeError> {
        let mut cause = Some(e);
        while let Some(c) = cause {
            if let Some(h) = c.downcast_ref::<HandshakeError>()
                && h.refused
            {
                return Some(h);
            }
            cause = c.source();
        }
        None
    }
}

impl MakeTlsConnect<tokio_postgres::Socket> for PgTls {
    type Stream = PgTlsStream;
    type TlsConnect = Handshake;
    type Error = HandshakeError;

    /// Called for every connection, also under `disable` and for a Unix socket (`host` is
    /// empty then), where no handshake is asked for.
    fn make_tls_connect(&mut self, host: &str) -> Result<Handshake, HandshakeError> {
        let Some(client) = self.client.clone().filter(|_| !host.is_empty()) else {
            return Ok(Handshake {
                to: None,
                rootcert: None,
            });
        };
        // The host names what the certificate is checked against: one that cannot be is
        // as much a configuration error as a certificate that does not match it.
        let name = ServerName::try_from(host.to_string()).map_err(|e| HandshakeError {
            refused: true,
            text: format!("host {host:?} is not a TLS server name: {e}"),
        })?;
        Ok(Handshake {
            to: Some((client, name)),
            rootcert: self.rootcert.clone(),
        })
    }
}

/// One TLS handshake, to a server name (none under `disable`).
pub struct Handshake {
    to: Option<(Arc<ClientConfig>, ServerName<'static>)>,
    rootcert: Option<PathBuf>,
}

type HandshakeFuture = Pin<Box<dyn Future<Output = Result<PgTlsStream, HandshakeError>> + Send>>;

impl TlsConnect<tokio_postgres::Socket> for Handshake {
    type Stream = PgTlsStream;
    type Error = HandshakeError;
    type Future = HandshakeFuture;

    fn connect(self, stream: tokio_postgres::Socket) -> HandshakeFuture {
        Box::pin(async move {
            let (client, name) = self.to.ok_or_else(|| {
                HandshakeError::other(
                    "no TLS for this connection (sslmode=disable, or no host name)".into(),
                )
            })?;
            TlsConnector::from(client)
                .connect(name.clone(), stream)
                .await
                .map(|s| PgTlsStream(Box::new(s)))
                .map_err(|e| explain(&e, &name, self.rootcert.as_ref()))
        })
    }
}

/// A handshake failure in words an operator can act on.
fn explain(e: &io::Error, host: &ServerName<'_>, rootcert: Option<&PathBuf>) -> HandshakeError {
    let host = host.to_str();
    let file = rootcert.map_or_else(String::new, |p| p.display().to_string());
    let refused = |text: String| HandshakeError {
        refused: true,
        text,
    };
    match crate::tls::rustls_error(e) {
        Some(rustls::Error::InvalidCertificate(c)) => refused(match c {
            CertificateError::UnknownIssuer => format!(
                "the server's certificate is not trusted by sslrootcert {file} (unknown issuer)"
            ),
            CertificateError::NotValidForName => {
                format!("host name mismatch: the server's certificate is not valid for {host}")
            }
            CertificateError::NotValidForNameContext { presented, .. } => format!(
                "host name mismatch: the server's certificate is not valid for {host} (it names {})",
                presented.join(", ")
            ),
            other => format!("the server's certificate is refused: {other}"),
        }),
        // The server's word on our certificate (sslcert), or on its absence.
        Some(rustls::Error::AlertReceived(
            a @ (AlertDescription::BadCertificate
            | AlertDescription::UnsupportedCertificate
            | AlertDescription::CertificateRevoked
            | AlertDescription::CertificateExpired
            | AlertDescription::CertificateUnknown
            | AlertDescription::UnknownCA
            | AlertDescription::CertificateRequired),
        )) => refused(format!(
            "the server refused the client certificate (sslcert): {a:?}"
        )),
        Some(other) => HandshakeError::other(format!("TLS handshake with {host}: {other}")),
        None => HandshakeError::other(format!("TLS handshake with {host}: {e}")),
    }
}

/// The TLS session tokio-postgres talks through.
pub struct PgTlsStream(Box<tokio_rustls::client::TlsStream<tokio_postgres::Socket>>);

impl AsyncRead for PgTlsStream {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut *self.0).poll_read(cx, buf)
    }
}

impl AsyncWrite for PgTlsStream {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut *self.0).poll_write(cx, buf)
    }
    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut *self.0).poll_flush(cx)
    }
    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut *self.0).poll_shutdown(cx)
    }
}

impl TlsStream for PgTlsStream {
    /// `tls-server-end-point` (RFC 5929): the hash of the server's certificate, so that a
    /// SCRAM password exchange fails through a man in the middle even when the certificate
    /// itself is not checked (`require`).
    fn channel_binding(&self) -> ChannelBinding {
        let cert = self
            .0
            .get_ref()
            .1
            .peer_certificates()
            .and_then(|c| c.first());
        match cert.and_then(|c| end_point_hash(c)) {
            Some(h) => ChannelBinding::tls_server_end_point(h),
            None => ChannelBinding::none(),
        }
    }
}

/// The certificate hashed with its signature's hash (SHA-256 for MD5 and SHA-1), or `None`
/// for an algorithm that names no single hash (RSA-PSS, EdDSA): then no channel binding.
fn end_point_hash(cert: &CertificateDer<'_>) -> Option<Vec<u8>> {
    let (_, cert_body, _) = der(cert)?;
    let (_, _tbs, rest) = der(cert_body)?;
    let (_, alg, _) = der(rest)?;
    let (tag, oid, _) = der(alg)?;
    if tag != 0x06 {
        return None;
    }
    const RSA: &[u8] = &[0x2a, 0x86, 0x48, 0x86, 0xf7, 0x0d, 0x01, 0x01];
    const ECDSA: &[u8] = &[0x2a, 0x86, 0x48, 0xce, 0x3d, 0x04];
    let hash = match oid.split_last()? {
        (4 | 5 | 11, p) if p == RSA => 256,
        (1, p) if p == ECDSA => 256,
        (12, p) if p == RSA => 384,
        (13, p) if p == RSA => 512,
        (2, p) if p.strip_prefix(ECDSA) == Some(&[0x03]) => 256,
        (3, p) if p.strip_prefix(ECDSA) == Some(&[0x03]) => 384,
        (4, p) if p.strip_prefix(ECDSA) == Some(&[0x03]) => 512,
        _ => return None,
    };
    Some(match hash {
        256 => sha2::Sha256::digest(cert.as_ref()).to_vec(),
        384 => sha2::Sha384::digest(cert.as_ref()).to_vec(),
        _ => sha2::Sha512::digest(cert.as_ref()).to_vec(),
    })
}

/// One DER element: (tag, contents, what follows).
fn der(input: &[u8]) -> Option<(u8, &[u8], &[u8])> {
    let (&tag, rest) = input.split_first()?;
    let (&first, mut rest) = rest.split_first()?;
    let len = if first < 0x80 {
        usize::from(first)
    } else {
        let n = usize::from(first & 0x7f);
        if n == 0 || n > 4 || rest.len() < n {
            return None;
        }
        let (bytes, after) = rest.split_at(n);
        rest = after;
        bytes
            .iter()
            .fold(0usize, |acc, b| (acc << 8) | usize::from(*b))
    };
    (rest.len() >= len).then(|| (tag, &rest[..len], &rest[len..]))
}

/// The certificate checks short of `verify-full` (which is rustls's own `WebPkiServerVerifier`):
/// with `roots`, the chain to `sslrootcert` whatever host name the certificate carries
/// (`verify-ca`, and a given `sslrootcert` under `prefer`/`require`); without, any certificate
/// (`require` without `sslrootcert`). Either way the handshake's signatures are still checked
/// (the session is with whoever holds the certificate's key).
#[derive(Debug)]
struct NoHostName {
    roots: Option<Arc<RootCertStore>>,
    provider: Arc<CryptoProvider>,
}

impl ServerCertVerifier for NoHostName {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        _: &ServerName<'_>,
        _: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        if let Some(roots) = &self.roots {
            let cert = ParsedCertificate::try_from(end_entity)?;
            rustls::client::verify_server_cert_signed_by_trust_anchor(
                &cert,
                roots,
                intermediates,
                now,
                self.provider.signature_verification_algorithms.all,
            )?;
        }
        Ok(ServerCertVerified::assertion())
    }
    fn verify_tls12_signature(
        &self,
        msg: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        verify_tls12_signature(
            msg,
            cert,
            dss,
            &self.provider.signature_verification_algorithms,
        )
    }
    fn verify_tls13_signature(
        &self,
        msg: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        verify_tls13_signature(
            msg,
            cert,
            dss,
            &self.provider.signature_verification_algorithms,
        )
    }
    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.provider
            .signature_verification_algorithms
            .supported_schemes()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn keys(dsn: &str) -> (String, TlsKeys) {
        split_dsn(dsn).unwrap()
    }

    #[test]
    fn tls_keys_are_taken_out_of_a_key_value_dsn_and_the_rest_kept() {
        let (rest, k) = keys(
            "host=h sslmode = 'verify-full' sslrootcert='/etc/a b/ca.pem' password='x y\\'z' sslcert=/c sslkey=/k dbname=d",
        );
        assert_eq!(k.mode, SslMode::VerifyFull);
        assert_eq!(k.rootcert, Some(PathBuf::from("/etc/a b/ca.pem")));
        assert_eq!(k.cert, Some(PathBuf::from("/c")));
        assert_eq!(k.key, Some(PathBuf::from("/k")));
        let c: tokio_postgres::Config = rest.parse().unwrap();
        assert_eq!(c.get_password(), Some(&b"x y'z"[..]));
        assert_eq!(c.get_dbname(), Some("d"));
        // A value that only looks like a key is a value.
        let (rest, k) = keys("host=h password='a sslmode=require b'");
        assert_eq!(k.mode, SslMode::Disable);
        assert!(rest.contains("sslmode=require"));
    }

    #[test]
    fn tls_keys_are_taken_out_of_a_url_query() {
        let (rest, k) = keys(
            "postgresql://u:pw@h:5433/db?sslmode=verify-ca&application_name=x&sslrootcert=%2Fetc%2Fca.pem",
        );
        assert_eq!(rest, "postgresql://u:pw@h:5433/db?application_name=x");
        assert_eq!(k.mode, SslMode::VerifyCa);
        assert_eq!(k.rootcert, Some(PathBuf::from("/etc/ca.pem")));
        let (rest, _) = keys("postgres://h/db?sslmode=require");
        assert_eq!(rest, "postgres://h/db");
        let (rest, k) = keys("postgres://h/db");
        assert_eq!(
            (rest.as_str(), k.mode),
            ("postgres://h/db", SslMode::Disable)
        );
    }

    #[test]
    fn unknown_or_unsupported_modes_are_refused_without_quoting_the_dsn() {
        for (dsn, want) in [
            (
                "host=h password=hunter2 sslmode=allow",
                "sslmode=allow is not supported",
            ),
            ("host=h password=hunter2 sslmode=Require", "is not one of"),
            (
                "host=h password=hunter2 sslmode=verify-full",
                "needs sslrootcert",
            ),
            (
                "host=h password=hunter2 sslmode=verify-ca sslrootcert=system",
                "system is not supported",
            ),
            (
                "host=h password=hunter2 sslmode=require sslrootcert=/nonexistent/ca.pem",
                "sslrootcert /nonexistent/ca.pem",
            ),
            (
                "host=h password=hunter2 sslmode=require sslcert=/c",
                "give both or neither",
            ),
            (
                "host=/run/postgresql password=hunter2 sslmode=require",
                "Unix socket",
            ),
            (
                "hostaddr=127.0.0.1 password=hunter2 sslmode=require",
                "needs host=",
            ),
        ] {
            let Err(e) = parse_dsn(dsn) else {
                panic!("{dsn} was accepted")
            };
            let e = e.to_string();
            assert!(e.contains(want), "{dsn}: {e}");
            assert!(!e.contains("hunter2"), "{e}");
        }
    }

    #[test]
    fn the_default_is_plain_and_prefer_and_require_need_no_files() {
        for (dsn, want) in [
            ("host=h", PgSslMode::Disable),
            ("host=h sslmode=disable", PgSslMode::Disable),
            ("host=h sslmode=prefer", PgSslMode::Prefer),
            ("host=h sslmode=require", PgSslMode::Require),
            ("host=/run/postgresql sslmode=prefer", PgSslMode::Prefer),
        ] {
            let (c, tls) = parse_dsn(dsn).unwrap();
            assert_eq!(c.get_ssl_mode(), want, "{dsn}");
            assert_eq!(tls.client.is_some(), want != PgSslMode::Disable, "{dsn}");
        }
    }

    #[test]
    fn der_elements_with_long_lengths_are_read_and_truncated_ones_refused() {
        let mut long = vec![0x30, 0x82, 0x01, 0x00];
        long.extend(std::iter::repeat_n(7u8, 256));
        long.push(0x05);
        let (tag, body, rest) = der(&long).unwrap();
        assert_eq!((tag, body.len(), rest), (0x30, 256, &[0x05][..]));
        assert!(der(&long[..100]).is_none());
        assert!(der(&[0x30, 0x80]).is_none());
        assert!(end_point_hash(&CertificateDer::from(vec![0x30, 0x00])).is_none());
    }
}
