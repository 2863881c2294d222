//! A test CA and a server certificate it signed for `apiserver.test` and 127.0.0.1, made for
//! tests only (valid until 2126; the CA's key was not kept): the API server's HTTPS, and any
//! test server that wants a client to verify it.

use std::sync::Arc;

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};

/// The CA, PEM.
pub const CA: &[u8] = include_bytes!("tls/ca.pem");
/// The server certificate, PEM.
pub const CERT: &[u8] = include_bytes!("tls/cert.pem");
/// The server certificate's key, PEM.
pub const KEY: &[u8] = include_bytes!("tls/key.pem");

/// A server configuration presenting [`CERT`] and offering `alpn` (in order of preference).
pub fn server_config(alpn: &[&[u8]]) -> Arc<rustls::ServerConfig> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let certificate = CertificateDer::from_pem_slice(CERT).expect("the test certificate parses");
    let key = PrivateKeyDer::from_pem_slice(KEY).expect("the test key parses");
    let mut config = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .expect("ring supports the default versions")
        .with_no_client_auth()
        .with_single_cert(vec![certificate], key)
        .expect("the test certificate matches its key");
    config.alpn_protocols = alpn.iter().map(|p| p.to_vec()).collect();
    Arc::new(config)
}

/// A CA made for one test, signing server and client certificates.
pub struct Authority {
    ca: rcgen::Certificate,
    issuer: rcgen::Issuer<'static, rcgen::KeyPair>,
}

impl Default for Authority {
    fn default() -> Self {
        Self::new()
    }
}

impl Authority {
    pub fn new() -> Self {
        let mut params =
            rcgen::CertificateParams::new(Vec::<String>::new()).expect("no names to check");
        params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        params
            .distinguished_name
            .push(rcgen::DnType::CommonName, "test CA");
        let key = rcgen::KeyPair::generate().expect("ring makes keys");
        let ca = params.self_signed(&key).expect("a CA signs itself");
        Self {
            issuer: rcgen::Issuer::new(params, key),
            ca,
        }
    }

    pub fn ca_der(&self) -> CertificateDer<'static> {
        self.ca.der().clone()
    }

    pub fn ca_pem(&self) -> String {
        self.ca.pem()
    }

    /// A server certificate and key (PEM) for 127.0.0.1 named `name`.
    pub fn server(&self, name: &str) -> (String, String) {
        self.sign(vec!["127.0.0.1".to_string(), name.to_string()], name)
    }

    /// A client certificate and key (PEM) for `name`.
    pub fn client(&self, name: &str) -> (String, String) {
        self.sign(Vec::new(), name)
    }

    fn sign(&self, names: Vec<String>, common_name: &str) -> (String, String) {
        let mut params = rcgen::CertificateParams::new(names).expect("valid names");
        params
            .distinguished_name
            .push(rcgen::DnType::CommonName, common_name);
        let key = rcgen::KeyPair::generate().expect("ring makes keys");
        let cert = params.signed_by(&key, &self.issuer).expect("the CA signs");
        (cert.pem(), key.serialize_pem())
    }
}
