//! The rustls set-up shared by the TLS clients rumqttc does not make (the `http` sink, the
//! PostgreSQL connections): the crypto provider, trust anchors and a client identity read
//! from PEM files. One TLS stack: the rustls rumqttc already links, on aws-lc-rs, named
//! explicitly (no process-wide default provider is assumed or installed).

use std::path::Path;
use std::sync::Arc;

use tokio_rustls::rustls::crypto::{CryptoProvider, aws_lc_rs};
use tokio_rustls::rustls::pki_types::pem::PemObject;
use tokio_rustls::rustls::pki_types::{CertificateDer, PrivateKeyDer};
use tokio_rustls::rustls::{self, RootCertStore};

/// The crypto provider of every rustls client replay-guard makes itself.
pub fn provider() -> Arc<CryptoProvider> {
    Arc::new(aws_lc_rs::default_provider())
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
