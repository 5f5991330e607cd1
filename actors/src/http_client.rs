//! The operator's outbound HTTP(S) client, shared by the notifier (webhooks) and the alert gates
//! (Prometheus): hyper's HTTP/1 client over rustls, and the Secret of a `secretRef`.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::Full;
use hyper_rustls::HttpsConnector;
use hyper_util::client::legacy::Client as HttpClient;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use k8s_openapi::api::core::v1::Secret;
use kube::api::Api;
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::crypto::CryptoProvider;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};

pub type Https = HttpClient<HttpsConnector<HttpConnector>, Full<Bytes>>;

/// Whom an https connection trusts.
#[derive(Debug, Clone, Default)]
pub struct Trust<'a> {
    /// PEM certificates trusted besides the public and platform roots (a Secret's `ca.crt`).
    pub extra_ca_pem: Option<&'a [u8]>,
    /// Accept any certificate (`insecureSkipTLSVerify`).
    pub skip_verify: bool,
}

/// The HTTP(S) client. Trusted roots: Mozilla's (webpki-roots, built in: the operator's image has
/// no CA bundle), plus the platform's when it has some (including `SSL_CERT_FILE`), plus
/// `trust.extra_ca_pem`. A CA that does not parse is an error naming the problem.
pub fn https_client(connect_timeout: Duration, trust: &Trust<'_>) -> Result<Https, String> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = rustls::ClientConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .map_err(|err| format!("cannot set up TLS: {err}"))?;
    let tls = if trust.skip_verify {
        builder
            .dangerous()
            .with_custom_certificate_verifier(Arc::new(AnyCertificate(provider)))
            .with_no_client_auth()
    } else {
        let mut roots = rustls::RootCertStore {
            roots: webpki_roots::TLS_SERVER_ROOTS.to_vec(),
        };
        let native = rustls_native_certs::load_native_certs();
        let (added, _ignored) = roots.add_parsable_certificates(native.certs);
        tracing::debug!(
            platform_roots = added,
            "trusting Mozilla's roots and the platform's"
        );
        if let Some(pem) = trust.extra_ca_pem {
            let mut count = 0;
            for cert in CertificateDer::pem_slice_iter(pem) {
                let cert = cert.map_err(|err| format!("ca.crt is not PEM certificates: {err}"))?;
                roots
                    .add(cert)
                    .map_err(|err| format!("ca.crt holds a certificate rustls refuses: {err}"))?;
                count += 1;
            }
            if count == 0 {
                return Err("ca.crt holds no PEM certificate (-----BEGIN CERTIFICATE-----)".into());
            }
        }
        builder.with_root_certificates(roots).with_no_client_auth()
    };
    let mut http = HttpConnector::new();
    http.enforce_http(false);
    http.set_connect_timeout(Some(connect_timeout));
    let connector = hyper_rustls::HttpsConnectorBuilder::new()
        .with_tls_config(tls)
        .https_or_http()
        .enable_http1()
        .wrap_connector(http);
    Ok(HttpClient::builder(TokioExecutor::new()).build(connector))
}

/// `insecureSkipTLSVerify`: any certificate, but signatures are still checked (the handshake is
/// still a real one, only whom it is with is not).
#[derive(Debug)]
struct AnyCertificate(Arc<CryptoProvider>);

impl ServerCertVerifier for AnyCertificate {
    fn verify_server_cert(
        &self,
        _end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp_response: &[u8],
        _now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<rustls::SignatureScheme> {
        self.0.signature_verification_algorithms.supported_schemes()
    }
}

/// The keys of a Secret in `namespace`, read now (so a rotation applies at once). The error says
/// what to do: create the Secret, or let the operator read it.
pub async fn read_secret(
    client: &kube::Client,
    namespace: &str,
    name: &str,
) -> Result<BTreeMap<String, Vec<u8>>, String> {
    let api: Api<Secret> = Api::namespaced(client.clone(), namespace);
    let secret = api
        .get_opt(name)
        .await
        .map_err(|err| {
            format!(
                "cannot read Secret {namespace}/{name}: {err}; the operator needs get on secrets in its namespace"
            )
        })?
        .ok_or_else(|| format!("Secret {namespace}/{name} not found: create it, or remove secretRef"))?;
    Ok(secret
        .data
        .unwrap_or_default()
        .into_iter()
        .map(|(key, value)| (key, value.0))
        .collect())
}

/// A key of a Secret as text (a token, a URL), trimmed of the newline `kubectl create secret
/// --from-file` leaves.
pub fn text_key(keys: &BTreeMap<String, Vec<u8>>, key: &str) -> Option<String> {
    keys.get(key)
        .and_then(|v| String::from_utf8(v.clone()).ok())
        .map(|v| v.trim().to_string())
        .filter(|v| !v.is_empty())
}

/// An error and its causes on one line (hyper's own message is only "client error").
pub fn error_chain(err: &(dyn std::error::Error + 'static)) -> String {
    let mut text = err.to_string();
    let mut source = err.source();
    while let Some(cause) = source {
        text.push_str(": ");
        text.push_str(&cause.to_string());
        source = cause.source();
    }
    text
}
