//! Shared pieces of the webhook integration tests: a test CA and server
//! certificates made with rcgen, the real webhook server on 127.0.0.1:0,
//! and a real HTTPS client (rustls + hyper) trusting only the test CA.

#![allow(dead_code)]

use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use gpu_dra_analysis::validate::{ClassLookup, StaticClasses, Validator};
use gpu_dra_controller::metrics::SharedRegistry;
use gpu_dra_controller::webhook::{Reviewer, TlsFiles, WebhookConfig, WebhookServer};
use http::{HeaderMap, Request, StatusCode};
use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt as _, Full, StreamBody};
use hyper::body::Bytes;
use hyper::body::Frame;
use hyper_util::rt::{TokioExecutor, TokioIo};
use rustls::pki_types::{CertificateDer, ServerName};
use serde_json::{Value, json};
use tokio::net::TcpStream;
use tokio_rustls::TlsConnector;

pub const DRIVER: &str = "gpu.nvidia.com";

/// A CA that signs server certificates.
pub struct TestCa {
    issuer: rcgen::Issuer<'static, rcgen::KeyPair>,
    pub der: CertificateDer<'static>,
}

/// A server certificate (leaf) and its key, as PEM.
pub struct Leaf {
    pub cert_pem: String,
    pub key_pem: String,
    pub der: Vec<u8>,
}

impl TestCa {
    pub fn new() -> TestCa {
        let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
        params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        params
            .distinguished_name
            .push(rcgen::DnType::CommonName, "webhook test CA");
        params.key_usages = vec![
            rcgen::KeyUsagePurpose::KeyCertSign,
            rcgen::KeyUsagePurpose::DigitalSignature,
        ];
        let key = rcgen::KeyPair::generate().unwrap();
        let cert = params.self_signed(&key).unwrap();
        TestCa {
            der: cert.der().clone(),
            issuer: rcgen::Issuer::new(params, key),
        }
    }

    /// A leaf for `localhost` and 127.0.0.1, signed by this CA; `serial`
    /// makes successive leaves distinct.
    pub fn leaf(&self, serial: u64) -> Leaf {
        let mut params =
            rcgen::CertificateParams::new(vec!["localhost".to_owned(), "127.0.0.1".to_owned()])
                .unwrap();
        params.serial_number = Some(rcgen::SerialNumber::from(serial));
        params
            .distinguished_name
            .push(rcgen::DnType::CommonName, format!("webhook {serial}"));
        params.use_authority_key_identifier_extension = true;
        params
            .extended_key_usages
            .push(rcgen::ExtendedKeyUsagePurpose::ServerAuth);
        let key = rcgen::KeyPair::generate().unwrap();
        let cert = params.signed_by(&key, &self.issuer).unwrap();
        Leaf {
            cert_pem: cert.pem(),
            key_pem: key.serialize_pem(),
            der: cert.der().to_vec(),
        }
    }
}

pub fn write_leaf(dir: &Path, leaf: &Leaf) -> TlsFiles {
    let files = TlsFiles {
        cert: dir.join("tls.crt"),
        key: dir.join("tls.key"),
    };
    // Write both through temporary names and rename, as a Secret volume
    // update swaps them.
    std::fs::write(dir.join(".tls.crt.tmp"), &leaf.cert_pem).unwrap();
    std::fs::write(dir.join(".tls.key.tmp"), &leaf.key_pem).unwrap();
    std::fs::rename(dir.join(".tls.crt.tmp"), &files.cert).unwrap();
    std::fs::rename(dir.join(".tls.key.tmp"), &files.key).unwrap();
    files
}

/// The GPU DeviceClasses NVIDIA ships (VFIO first: some tests pop the
/// last two, `gpu.nvidia.com` and `mig.nvidia.com`).
pub fn nvidia_classes() -> Vec<Value> {
    vec![
        json!({
            "apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass",
            "metadata": {"name": "vfio.gpu.nvidia.com"},
            "spec": {
                "selectors": [{"cel": {"expression":
                    "device.driver == 'gpu.nvidia.com' && device.attributes['gpu.nvidia.com'].type == 'vfio'"}}]
            }
        }),
        json!({
            "apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass",
            "metadata": {"name": "gpu.nvidia.com"},
            "spec": {
                "selectors": [{"cel": {"expression":
                    "device.driver == 'gpu.nvidia.com' && device.attributes['gpu.nvidia.com'].type == 'gpu'"}}],
                "extendedResourceName": "nvidia.com/gpu"
            }
        }),
        json!({
            "apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass",
            "metadata": {"name": "mig.nvidia.com"},
            "spec": {
                "selectors": [{"cel": {"expression":
                    "device.driver == 'gpu.nvidia.com' && device.attributes['gpu.nvidia.com'].type == 'mig'"}}]
            }
        }),
    ]
}

/// NVIDIA's example ResourceClaimTemplate (time-slicing and MPS).
pub fn nvidia_example_template() -> Value {
    json!({
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate",
        "metadata": {"name": "shared-gpus", "namespace": "default"},
        "spec": {"spec": {"devices": {
            "requests": [
                {"name": "ts-gpu", "exactly": {"deviceClassName": "gpu.nvidia.com"}},
                {"name": "mps-gpu", "exactly": {"deviceClassName": "gpu.nvidia.com"}}
            ],
            "config": [
                {"requests": ["ts-gpu"], "opaque": {"driver": "gpu.nvidia.com", "parameters": {
                    "apiVersion": "resource.nvidia.com/v1beta1", "kind": "GpuConfig",
                    "sharing": {"strategy": "TimeSlicing", "timeSlicingConfig": {"interval": "Long"}}}}},
                {"requests": ["mps-gpu"], "opaque": {"driver": "gpu.nvidia.com", "parameters": {
                    "apiVersion": "resource.nvidia.com/v1beta1", "kind": "GpuConfig",
                    "sharing": {"strategy": "MPS", "mpsConfig": {
                        "defaultActiveThreadPercentage": 50,
                        "defaultPinnedDeviceMemoryLimit": "10Gi"}}}}}
            ]
        }}}
    })
}

/// A running webhook with its certificate directory and client.
pub struct Harness {
    pub server: WebhookServer,
    pub registry: SharedRegistry,
    pub dir: tempfile::TempDir,
    pub ca: TestCa,
    pub client: Client,
}

impl Harness {
    /// A webhook for `gpu.nvidia.com` knowing NVIDIA's DeviceClasses.
    pub async fn start() -> Harness {
        Harness::start_with(
            Arc::new(StaticClasses::new(nvidia_classes())),
            WebhookConfig::default(),
        )
        .await
    }

    pub async fn start_with(
        classes: Arc<dyn ClassLookup + Send + Sync>,
        config: WebhookConfig,
    ) -> Harness {
        let dir = tempfile::tempdir().unwrap();
        let ca = TestCa::new();
        let tls = write_leaf(dir.path(), &ca.leaf(1));
        let config = WebhookConfig {
            addr: SocketAddr::from(([127, 0, 0, 1], 0)),
            tls,
            ..config
        };
        let registry = SharedRegistry::new();
        let reviewer = Reviewer::new(Validator::new(DRIVER), classes);
        let server = WebhookServer::start(config, reviewer, &registry)
            .await
            .unwrap();
        let client = Client::new(server.local_addr(), &ca.der);
        Harness {
            server,
            registry,
            dir,
            ca,
            client,
        }
    }
}

/// An answer: status, headers, body.
#[derive(Debug)]
pub struct Answer {
    pub status: StatusCode,
    pub headers: HeaderMap,
    pub body: Bytes,
}

impl Answer {
    pub fn json(&self) -> Value {
        serde_json::from_slice(&self.body).unwrap_or_else(|e| {
            panic!(
                "not JSON ({e}): {} {}",
                self.status,
                String::from_utf8_lossy(&self.body)
            )
        })
    }

    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }

    /// `response` of the AdmissionReview answer (asserting HTTP 200).
    pub fn response(&self) -> Value {
        assert_eq!(self.status, StatusCode::OK, "{}", self.text());
        let review = self.json();
        assert_eq!(review["apiVersion"], "admission.k8s.io/v1");
        assert_eq!(review["kind"], "AdmissionReview");
        review["response"].clone()
    }
}

/// An HTTPS client trusting only the test CA. Each call opens a new
/// connection (HTTP/1.1) unless a [`Connection`] is used.
#[derive(Clone)]
pub struct Client {
    addr: SocketAddr,
    connector: TlsConnector,
    h2_connector: TlsConnector,
}

impl Client {
    pub fn new(addr: SocketAddr, ca: &CertificateDer<'static>) -> Client {
        let config = |alpn: &[u8]| {
            let mut roots = rustls::RootCertStore::empty();
            roots.add(ca.clone()).unwrap();
            let mut c = rustls::ClientConfig::builder_with_provider(Arc::new(
                rustls::crypto::ring::default_provider(),
            ))
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_root_certificates(roots)
            .with_no_client_auth();
            c.alpn_protocols = vec![alpn.to_vec()];
            TlsConnector::from(Arc::new(c))
        };
        Client {
            addr,
            connector: config(b"http/1.1"),
            h2_connector: config(b"h2"),
        }
    }

    async fn tls(
        &self,
        connector: &TlsConnector,
    ) -> std::io::Result<tokio_rustls::client::TlsStream<TcpStream>> {
        let tcp = TcpStream::connect(self.addr).await?;
        connector
            .connect(ServerName::try_from("localhost").unwrap(), tcp)
            .await
    }

    /// The leaf certificate the server presents on a new connection.
    pub async fn peer_certificate(&self) -> std::io::Result<Vec<u8>> {
        let stream = self.tls(&self.connector).await?;
        let (_, conn) = stream.get_ref();
        Ok(conn
            .peer_certificates()
            .and_then(|c| c.first())
            .map(|c| c.to_vec())
            .unwrap_or_default())
    }

    /// A kept-alive HTTP/1.1 connection.
    pub async fn connect(&self) -> Connection {
        let stream = self.tls(&self.connector).await.unwrap();
        let (sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
            .await
            .unwrap();
        tokio::spawn(conn);
        Connection::H1(sender)
    }

    /// A kept-alive HTTP/2 connection (ALPN h2).
    pub async fn connect_h2(&self) -> Connection {
        let stream = self.tls(&self.h2_connector).await.unwrap();
        assert_eq!(stream.get_ref().1.alpn_protocol(), Some(&b"h2"[..]));
        let (sender, conn) =
            hyper::client::conn::http2::handshake(TokioExecutor::new(), TokioIo::new(stream))
                .await
                .unwrap();
        tokio::spawn(conn);
        Connection::H2(sender)
    }

    pub async fn get(&self, path: &str) -> Answer {
        self.connect().await.get(path).await
    }

    /// POSTs `body` to /validate as application/json.
    pub async fn validate_raw(&self, body: impl Into<Bytes>) -> Answer {
        self.connect().await.validate_raw(body).await
    }

    pub async fn validate(&self, review: &Value) -> Answer {
        self.validate_raw(serde_json::to_vec(review).unwrap()).await
    }
}

/// Request bodies: whole (with a length) or streamed in chunks.
pub type Body = BoxBody<Bytes, std::convert::Infallible>;

pub fn whole(body: impl Into<Bytes>) -> Body {
    Full::new(body.into()).boxed()
}

/// A body sent as `chunk`-byte DATA frames / HTTP/1.1 chunks, without a
/// declared length.
pub fn streamed(body: impl Into<Bytes>, chunk: usize) -> Body {
    let body: Bytes = body.into();
    let chunks: Vec<Result<Frame<Bytes>, std::convert::Infallible>> = body
        .chunks(chunk)
        .map(|c| Ok(Frame::data(Bytes::copy_from_slice(c))))
        .collect();
    StreamBody::new(futures::stream::iter(chunks)).boxed()
}

pub enum Connection {
    H1(hyper::client::conn::http1::SendRequest<Body>),
    H2(hyper::client::conn::http2::SendRequest<Body>),
}

impl Connection {
    pub async fn send(&mut self, request: Request<Body>) -> Answer {
        let response = match self {
            Connection::H1(s) => {
                s.ready().await.unwrap();
                s.send_request(request).await.unwrap()
            }
            Connection::H2(s) => {
                s.ready().await.unwrap();
                s.send_request(request).await.unwrap()
            }
        };
        let (parts, body) = response.into_parts();
        let body = body.collect().await.unwrap().to_bytes();
        Answer {
            status: parts.status,
            headers: parts.headers,
            body,
        }
    }

    pub async fn get(&mut self, path: &str) -> Answer {
        let request = Request::get(path)
            .header("host", "localhost")
            .body(whole(Bytes::new()))
            .unwrap();
        self.send(request).await
    }

    pub async fn validate_raw(&mut self, body: impl Into<Bytes>) -> Answer {
        self.validate_body(whole(body)).await
    }

    pub async fn validate_body(&mut self, body: Body) -> Answer {
        let request = Request::post("/validate?timeout=3s")
            .header("host", "localhost")
            .header("content-type", "application/json")
            .body(body)
            .unwrap();
        self.send(request).await
    }

    pub async fn validate(&mut self, review: &Value) -> Answer {
        self.validate_raw(serde_json::to_vec(review).unwrap()).await
    }
}

/// An AdmissionReview as the API server sends it for `object`
/// (`resource.k8s.io`, version and kind taken from the object).
pub fn review(operation: &str, object: &Value) -> Value {
    review_with_old(operation, Some(object), None)
}

pub fn review_with_old(operation: &str, object: Option<&Value>, old: Option<&Value>) -> Value {
    let source = object.or(old).unwrap();
    let api_version = source["apiVersion"].as_str().unwrap();
    let version = api_version.rsplit('/').next().unwrap();
    let kind = source["kind"].as_str().unwrap();
    let resource = match kind {
        "DeviceClass" => "deviceclasses",
        "ResourceClaim" => "resourceclaims",
        "ResourceClaimTemplate" => "resourceclaimtemplates",
        other => panic!("no resource for {other}"),
    };
    let namespace = source["metadata"]["namespace"].as_str();
    let name = source["metadata"]["name"].as_str().unwrap_or("");
    let options_kind = match operation {
        "CREATE" => "CreateOptions",
        "UPDATE" => "UpdateOptions",
        _ => "DeleteOptions",
    };
    json!({
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": format!("{:08x}-0000-4000-8000-000000000000", rand_u32()),
            "kind": {"group": "resource.k8s.io", "version": version, "kind": kind},
            "resource": {"group": "resource.k8s.io", "version": version, "resource": resource},
            "requestKind": {"group": "resource.k8s.io", "version": version, "kind": kind},
            "requestResource": {"group": "resource.k8s.io", "version": version, "resource": resource},
            "name": name,
            "namespace": namespace,
            "operation": operation,
            "userInfo": {
                "username": "kubernetes-admin",
                "groups": ["kubeadm:cluster-admins", "system:authenticated"]
            },
            "object": object,
            "oldObject": old,
            "dryRun": false,
            "options": {"kind": options_kind, "apiVersion": "meta.k8s.io/v1"}
        }
    })
}

fn rand_u32() -> u32 {
    use std::hash::{BuildHasher as _, Hasher as _};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u64(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_nanos() as u64,
    );
    h.finish() as u32
}

/// The value of `metric` (a full series name with labels) in `text`.
pub fn metric(text: &str, series: &str) -> Option<f64> {
    text.lines().find_map(|line| {
        let rest = line.strip_prefix(series)?;
        rest.strip_prefix(' ')?.trim().parse().ok()
    })
}

/// Polls `f` every 20 ms until it returns `Some`, for at most `limit`.
pub async fn eventually<T, F, Fut>(limit: Duration, mut f: F) -> Option<T>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let deadline = tokio::time::Instant::now() + limit;
    loop {
        if let Some(v) = f().await {
            return Some(v);
        }
        if tokio::time::Instant::now() >= deadline {
            return None;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}
