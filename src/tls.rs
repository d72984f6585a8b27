//! The rustls set-up of every TLS client replay-guard makes (the MQTT connections, the `http`
//! sink, the PostgreSQL connections): the crypto provider, trust anchors (read from PEM files,
//! or for an https `http` sink without `ca_file` from the operating system's store) and a
//! client identity read from PEM files. One TLS stack: rustls on ring, named explicitly in every
//! config (no process-wide default provider is assumed or installed, so nothing can panic for
//! lack of one). rustls-native-certs is named only here.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use tokio_rustls::rustls::client::WantsClientCert;
use tokio_rustls::rustls::crypto::{CryptoProvider, ring};
use tokio_rustls::rustls::pki_types::pem::{self, PemObject};
use tokio_rustls::rustls::pki_types::{CertificateDer, PrivateKeyDer};
use tokio_rustls::rustls::{self, ClientConfig, ConfigBuilder, InconsistentKeys, RootCertStore};

/// Why a TLS client could not be set up. Each file comes with the setting that names it
/// (`setting`: "ca_file", "sslrootcert", ...), so the message says which line to fix.
/// No variant is a `source` of another error: each message already quotes its cause, and
/// `main` prints an error's chain.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    /// The provider offers none of the protocol versions asked for.
    #[error("TLS set-up: {0}")]
    Setup(rustls::Error),
    /// A PEM file could not be read or parsed.
    #[error("{setting} {}: {error}", path.display())]
    Pem {
        setting: &'static str,
        path: PathBuf,
        error: pem::Error,
    },
    /// A certificate of a CA file cannot be a trust anchor.
    #[error("{setting} {}: {error}", path.display())]
    Anchor {
        setting: &'static str,
        path: PathBuf,
        error: Box<rustls::Error>,
    },
    /// A certificate file holds no certificate.
    #[error("{setting} {}: no PEM certificate in it", path.display())]
    NoCertificate {
        setting: &'static str,
        path: PathBuf,
    },
    /// The operating system's trust store holds no usable CA certificate; `errors` are the
    /// files it could not read.
    #[error(
        "the system trust store holds no usable CA certificate{}: install the \
         distribution's CA bundle (ca-certificates), or give ca_file",
        if errors.is_empty() { String::new() } else { format!(" ({})", errors.join("; ")) }
    )]
    EmptySystemStore { errors: Vec<String> },
    /// The private key is not the client certificate's.
    #[error(
        "{key_setting} {} is not the private key of {cert_setting} {} (the two are not a \
         pair): give the key the certificate was issued for",
        key.display(),
        cert.display()
    )]
    KeyMismatch {
        cert_setting: &'static str,
        cert: PathBuf,
        key_setting: &'static str,
        key: PathBuf,
    },
    /// rustls refused the client certificate and key for another reason.
    #[error("{cert_setting} {} / {key_setting} {}: {error}", cert.display(), key.display())]
    Identity {
        cert_setting: &'static str,
        cert: PathBuf,
        key_setting: &'static str,
        key: PathBuf,
        error: Box<rustls::Error>,
    },
}

/// The crypto provider of every rustls client replay-guard makes: ring (the build links no
/// other; see README "TLS").
pub fn provider() -> Arc<CryptoProvider> {
    Arc::new(ring::default_provider())
}

/// A client that verifies the server's chain and name against exactly the certificates in the
/// CA file, authenticating with a certificate chain and key if `identity` names them. Each
/// file comes with the setting that names it, for the errors.
pub fn verifying_client(
    (ca_file, ca_key): (&Path, &'static str),
    identity: Option<[(&Path, &'static str); 2]>,
) -> Result<ClientConfig, TlsError> {
    client_trusting(roots(ca_file, ca_key)?, identity)
}

/// A client that verifies the server's chain and name against `roots`, authenticating with a
/// certificate chain and key if `identity` names them (as `verifying_client`).
pub fn client_trusting(
    roots: RootCertStore,
    identity: Option<[(&Path, &'static str); 2]>,
) -> Result<ClientConfig, TlsError> {
    let builder = ClientConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .map_err(TlsError::Setup)?
        .with_root_certificates(roots);
    match identity {
        None => Ok(builder.with_no_client_auth()),
        Some([cert, key]) => with_identity(builder, cert, key),
    }
}

/// Finishes `builder` with the client certificate chain in `cert` and its private key in
/// `key` (each with the setting that names it, for the errors). A key that is not the
/// certificate's is refused here, naming both settings, so that a config naming a mismatched
/// pair is refused when it loads rather than at the first handshake.
pub fn with_identity(
    builder: ConfigBuilder<ClientConfig, WantsClientCert>,
    (cert, cert_key): (&Path, &'static str),
    (key, key_key): (&Path, &'static str),
) -> Result<ClientConfig, TlsError> {
    let (chain, private) = identity(cert, key, cert_key, key_key)?;
    builder
        .with_client_auth_cert(chain, private)
        .map_err(|error| match error {
            rustls::Error::InconsistentKeys(InconsistentKeys::KeyMismatch) => {
                TlsError::KeyMismatch {
                    cert_setting: cert_key,
                    cert: cert.to_path_buf(),
                    key_setting: key_key,
                    key: key.to_path_buf(),
                }
            }
            error => TlsError::Identity {
                cert_setting: cert_key,
                cert: cert.to_path_buf(),
                key_setting: key_key,
                key: key.to_path_buf(),
                error: Box::new(error),
            },
        })
}

/// Every certificate in the PEM file `path` as a trust anchor; `key` names the setting in
/// errors ("ca_file", "sslrootcert"). An empty file is an error.
pub fn roots(path: &Path, key: &'static str) -> Result<RootCertStore, TlsError> {
    let pem = |error| TlsError::Pem {
        setting: key,
        path: path.to_path_buf(),
        error,
    };
    let mut roots = RootCertStore::empty();
    for cert in CertificateDer::pem_file_iter(path).map_err(pem)? {
        roots
            .add(cert.map_err(pem)?)
            .map_err(|error| TlsError::Anchor {
                setting: key,
                path: path.to_path_buf(),
                error: Box::new(error),
            })?;
    }
    if roots.is_empty() {
        return Err(TlsError::NoCertificate {
            setting: key,
            path: path.to_path_buf(),
        });
    }
    Ok(roots)
}

/// The operating system's trust store as trust anchors, read by rustls-native-certs: on Linux
/// the CA bundle and directory openssl-probe finds (Debian's `/etc/ssl/certs`), or only
/// `SSL_CERT_FILE` / `SSL_CERT_DIR` when either is set. Used only by an https `http` sink
/// without `ca_file`. Certificates that cannot be used are skipped (files it could not read
/// are logged); a store with none usable is an error.
pub fn system_roots() -> Result<RootCertStore, TlsError> {
    let found = rustls_native_certs::load_native_certs();
    let mut roots = RootCertStore::empty();
    let (_, unusable) = roots.add_parsable_certificates(found.certs);
    let errors: Vec<String> = found.errors.iter().map(ToString::to_string).collect();
    if roots.is_empty() {
        return Err(TlsError::EmptySystemStore { errors });
    }
    for e in &errors {
        tracing::warn!(error = %e, "reading the system trust store: skipped ({e})");
    }
    tracing::debug!(anchors = roots.len(), unusable, "system trust store read");
    Ok(roots)
}

/// A client certificate chain and its private key, both PEM (`cert_key` and `key_key` name
/// the settings in errors).
pub fn identity(
    cert: &Path,
    key: &Path,
    cert_key: &'static str,
    key_key: &'static str,
) -> Result<(Vec<CertificateDer<'static>>, PrivateKeyDer<'static>), TlsError> {
    let chain = CertificateDer::pem_file_iter(cert)
        .and_then(|certs| certs.collect::<Result<Vec<_>, _>>())
        .map_err(|error| TlsError::Pem {
            setting: cert_key,
            path: cert.to_path_buf(),
            error,
        })?;
    if chain.is_empty() {
        return Err(TlsError::NoCertificate {
            setting: cert_key,
            path: cert.to_path_buf(),
        });
    }
    let private = PrivateKeyDer::from_pem_file(key).map_err(|error| TlsError::Pem {
        setting: key_key,
        path: key.to_path_buf(),
        error,
    })?;
    Ok((chain, private))
}

/// Checks that the client certificate in `cert` and the private key in `key` are a pair (the
/// key's public half is the certificate's), so that a mismatch is a configuration error
/// rather than a handshake the server refuses. `cert_key` and `key_key` name the settings.
pub fn check_identity(
    cert: &Path,
    key: &Path,
    cert_key: &'static str,
    key_key: &'static str,
) -> Result<(), TlsError> {
    let builder = ClientConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .map_err(TlsError::Setup)?
        .with_root_certificates(RootCertStore::empty());
    with_identity(builder, (cert, cert_key), (key, key_key)).map(drop)
}

/// The error a failed handshake's `io::Error` carries, if rustls raised it.
pub fn rustls_error(e: &std::io::Error) -> Option<&rustls::Error> {
    e.get_ref()?.downcast_ref::<rustls::Error>()
}
