//! The rustls set-up of every TLS client replay-guard makes (the MQTT connections, the `http`
//! sink, the PostgreSQL connections): the crypto provider, trust anchors and a client identity
//! read from PEM files. One TLS stack: rustls on ring, named explicitly in every config (no
//! process-wide default provider is assumed or installed, so nothing can panic for lack of one).

use std::path::Path;
use std::sync::Arc;

use tokio_rustls::rustls::client::WantsClientCert;
use tokio_rustls::rustls::crypto::{CryptoProvider, ring};
use tokio_rustls::rustls::pki_types::pem::PemObject;
use tokio_rustls::rustls::pki_types::{CertificateDer, PrivateKeyDer};
use tokio_rustls::rustls::{self, ClientConfig, ConfigBuilder, InconsistentKeys, RootCertStore};

/// The crypto provider of every rustls client replay-guard makes: ring (the build links no
/// other; see README "TLS").
pub fn provider() -> Arc<CryptoProvider> {
    Arc::new(ring::default_provider())
}

/// A client that verifies the server's chain and name against exactly the certificates in the
/// CA file, authenticating with a certificate chain and key if `identity` names them. Each
/// file comes with the setting that names it, for the errors.
pub fn verifying_client(
    (ca_file, ca_key): (&Path, &str),
    identity: Option<[(&Path, &str); 2]>,
) -> Result<ClientConfig, String> {
    let builder = ClientConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .map_err(|e| format!("TLS set-up: {e}"))?
        .with_root_certificates(roots(ca_file, ca_key)?);
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
    (cert, cert_key): (&Path, &str),
    (key, key_key): (&Path, &str),
) -> Result<ClientConfig, String> {
    let (chain, private) = identity(cert, key, cert_key, key_key)?;
    builder
        .with_client_auth_cert(chain, private)
        .map_err(|e| match e {
            rustls::Error::InconsistentKeys(InconsistentKeys::KeyMismatch) => format!(
                "{cert_key} {} and {key_key} {} are not a pair: the key is not the one of the \
                 certificate",
                cert.display(),
                key.display()
            ),
            e => format!(
                "{cert_key} {} / {key_key} {}: {e}",
                cert.display(),
                key.display()
            ),
        })
}

/// Every certificate in the PEM file `path` as a trust anchor; `key` names the setting in
/// errors ("ca_file", "sslrootcert"). An empty file is an error.
pub fn roots(path: &Path, key: &str) -> Result<RootCertStore, String> {
    let mut roots = RootCertStore::empty();
    let certs = CertificateDer::pem_file_iter(path)
        .map_err(|e| format!("{key} {}: {e}", path.display()))?;
    for cert in certs {
        let cert = cert.map_err(|e| format!("{key} {}: {e}", path.display()))?;
        roots
            .add(cert)
            .map_err(|e| format!("{key} {}: {e}", path.display()))?;
    }
    if roots.is_empty() {
        return Err(format!(
            "{key} {}: no PEM certificate in it",
            path.display()
        ));
    }
    Ok(roots)
}

/// A client certificate chain and its private key, both PEM (`cert_key` and `key_key` name
/// the settings in errors).
pub fn identity(
    cert: &Path,
    key: &Path,
    cert_key: &str,
    key_key: &str,
) -> Result<(Vec<CertificateDer<'static>>, PrivateKeyDer<'static>), String> {
    let chain = CertificateDer::pem_file_iter(cert)
        .and_then(|certs| certs.collect::<Result<Vec<_>, _>>())
        .map_err(|e| format!("{cert_key} {}: {e}", cert.display()))?;
    if chain.is_empty() {
        return Err(format!(
            "{cert_key} {}: no PEM certificate in it",
            cert.display()
        ));
    }
    let private = PrivateKeyDer::from_pem_file(key)
        .map_err(|e| format!("{key_key} {}: {e}", key.display()))?;
    Ok((chain, private))
}

/// The error a failed handshake's `io::Error` carries, if rustls raised it.
pub fn rustls_error(e: &std::io::Error) -> Option<&rustls::Error> {
    e.get_ref()?.downcast_ref::<rustls::Error>()
}
