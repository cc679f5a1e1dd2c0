//! Each virtual cluster's PKI: a cluster CA (written into the kubeconfig) and an apiserver serving
//! certificate for 127.0.0.1/localhost that can be swapped at runtime for one close to expiry.

use std::sync::{Arc, RwLock};

use chrono::{Datelike, Duration, Utc};
use rcgen::{
    BasicConstraints, CertificateParams, DistinguishedName, DnType, IsCa, Issuer, KeyPair,
    KeyUsagePurpose, date_time_ymd,
};
use rustls::crypto::ring::sign::any_supported_type;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};
use rustls::server::{ClientHello, ResolvesServerCert};
use rustls::sign::CertifiedKey;

/// Errors making certificates.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// rcgen failed.
    #[error("certificate generation: {0}")]
    Rcgen(#[from] rcgen::Error),
    /// rustls refused the key.
    #[error("serving key: {0}")]
    Rustls(#[from] rustls::Error),
}

/// (year, month, day) `offset_days` from today.
fn day(offset_days: i64) -> (i32, u8, u8) {
    let d = Utc::now() + Duration::days(offset_days);
    (d.year(), d.month() as u8, d.day() as u8)
}

/// A cluster's CA and its switchable serving certificate.
pub struct Pki {
    ca_pem: String,
    issuer: Issuer<'static, KeyPair>,
    resolver: Arc<Resolver>,
    name: String,
    /// Extra names and addresses the serving certificate carries.
    hosts: Vec<String>,
}

impl std::fmt::Debug for Pki {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Pki").field("name", &self.name).finish()
    }
}

impl Pki {
    /// A new CA named after the cluster, and a serving certificate valid for a year.
    pub fn new(cluster: &str) -> Result<Self, Error> {
        Self::with_hosts(cluster, &[])
    }

    /// [`Pki::new`] whose serving certificate also names `hosts` (the address the apiserver listens on
    /// when it is not loopback).
    pub fn with_hosts(cluster: &str, hosts: &[String]) -> Result<Self, Error> {
        let ca_key = KeyPair::generate()?;
        let mut params = CertificateParams::new(Vec::<String>::new())?;
        let mut dn = DistinguishedName::new();
        dn.push(DnType::CommonName, format!("{cluster}-ca"));
        params.distinguished_name = dn;
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.key_usages = vec![
            KeyUsagePurpose::KeyCertSign,
            KeyUsagePurpose::DigitalSignature,
        ];
        let start = day(-30);
        let end = day(3650);
        params.not_before = date_time_ymd(start.0, start.1, start.2);
        params.not_after = date_time_ymd(end.0, end.1, end.2);
        let ca_cert = params.self_signed(&ca_key)?;
        let issuer = Issuer::new(params, ca_key);
        let mut pki = Pki {
            ca_pem: ca_cert.pem(),
            issuer,
            resolver: Arc::new(Resolver {
                current: RwLock::new(None),
            }),
            name: cluster.to_string(),
            hosts: hosts.to_vec(),
        };
        pki.set_serving_days(365)?;
        Ok(pki)
    }

    /// The CA certificate (PEM), as the kubeconfig's `certificate-authority-data` carries it.
    pub fn ca_pem(&self) -> &str {
        &self.ca_pem
    }

    /// Replaces the serving certificate with one that expires in `days` days (new connections see it).
    pub fn set_serving_days(&mut self, days: i64) -> Result<(), Error> {
        let key = KeyPair::generate()?;
        let mut names = vec![
            "localhost".to_string(),
            "kubernetes".to_string(),
            "kubernetes.default.svc".to_string(),
            "127.0.0.1".to_string(),
        ];
        names.extend(self.hosts.iter().cloned());
        let mut params = CertificateParams::new(names)?;
        let mut dn = DistinguishedName::new();
        dn.push(DnType::CommonName, "kube-apiserver");
        params.distinguished_name = dn;
        let start = day(-1);
        let end = day(days);
        params.not_before = date_time_ymd(start.0, start.1, start.2);
        params.not_after = date_time_ymd(end.0, end.1, end.2);
        let cert = params.signed_by(&key, &self.issuer)?;
        let der = PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(key.serialize_der()));
        let signer = any_supported_type(&der)?;
        let certified = CertifiedKey::new(vec![CertificateDer::from(cert.der().to_vec())], signer);
        *self
            .resolver
            .current
            .write()
            .unwrap_or_else(|e| e.into_inner()) = Some(Arc::new(certified));
        Ok(())
    }

    /// A rustls server config serving the current certificate (h2 and http/1.1).
    pub fn server_config(&self) -> Arc<rustls::ServerConfig> {
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let mut cfg = rustls::ServerConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .expect("ring supports the default protocol versions")
            .with_no_client_auth()
            .with_cert_resolver(self.resolver.clone());
        cfg.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
        Arc::new(cfg)
    }
}

#[derive(Debug)]
struct Resolver {
    current: RwLock<Option<Arc<CertifiedKey>>>,
}

impl ResolvesServerCert for Resolver {
    fn resolve(&self, _hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        self.current
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }
}
