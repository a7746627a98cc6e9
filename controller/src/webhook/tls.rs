//! The webhook's TLS identity: a PEM certificate chain and private key read
//! from files, served through a rustls certificate resolver whose key can be
//! swapped while the server runs. [`CertReloader`] checks the files for
//! changes; a new pair that cannot be used (bad PEM, key not matching the
//! certificate, half-written rotation) keeps the previous identity in
//! service and is logged once per distinct content.

use std::path::{Path, PathBuf};
use std::sync::{Arc, PoisonError, RwLock};
use std::time::Duration;

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::server::{ClientHello, ResolvesServerCert};
use rustls::sign::CertifiedKey;

use super::metrics::{ReloadResult, WebhookMetrics};
use crate::Error;

/// Largest certificate or key file read (a chain of a few certificates is
/// a few KiB).
pub const MAX_PEM_FILE_BYTES: u64 = 1 << 20;

/// Where the certificate chain and private key live.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TlsFiles {
    /// PEM certificate chain, leaf first.
    pub cert: PathBuf,
    /// PEM private key (PKCS#8, PKCS#1 or SEC1).
    pub key: PathBuf,
}

/// The raw contents of both files, to notice changes.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Contents {
    cert: Vec<u8>,
    key: Vec<u8>,
}

fn read_capped(path: &Path, what: &'static str) -> Result<Vec<u8>, Error> {
    let io = |source| Error::ReadTlsFile {
        what,
        path: path.to_owned(),
        source,
    };
    let size = std::fs::metadata(path).map_err(io)?.len();
    if size > MAX_PEM_FILE_BYTES {
        return Err(Error::TlsFileTooLarge {
            what,
            path: path.to_owned(),
            size,
            limit: MAX_PEM_FILE_BYTES,
        });
    }
    std::fs::read(path).map_err(io)
}

impl TlsFiles {
    fn read(&self) -> Result<Contents, Error> {
        Ok(Contents {
            cert: read_capped(&self.cert, "certificate")?,
            key: read_capped(&self.key, "private key")?,
        })
    }

    fn parse(&self, contents: &Contents) -> Result<CertifiedKey, Error> {
        let bad = |what, reason: String| Error::BadTlsFile {
            what,
            path: if what == "certificate" {
                self.cert.clone()
            } else {
                self.key.clone()
            },
            reason,
        };
        let chain = CertificateDer::pem_slice_iter(&contents.cert)
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| bad("certificate", e.to_string()))?;
        if chain.is_empty() {
            return Err(bad("certificate", "no CERTIFICATE block found".to_owned()));
        }
        let key = PrivateKeyDer::from_pem_slice(&contents.key).map_err(|e| {
            bad(
                "private key",
                match e {
                    rustls::pki_types::pem::Error::NoItemsFound => {
                        "no PRIVATE KEY block found".to_owned()
                    }
                    other => other.to_string(),
                },
            )
        })?;
        CertifiedKey::from_der(chain, key, &rustls::crypto::ring::default_provider()).map_err(
            |source| Error::TlsIdentity {
                cert: self.cert.clone(),
                key: self.key.clone(),
                source,
            },
        )
    }

    /// Reads and checks both files: the chain parses, the key parses and
    /// matches the leaf certificate.
    pub fn load(&self) -> Result<CertifiedKey, Error> {
        self.parse(&self.read()?)
    }
}

/// The certificate resolver of the server: always answers with the current
/// identity.
#[derive(Debug)]
pub struct CertResolver {
    current: RwLock<Arc<CertifiedKey>>,
}

impl CertResolver {
    /// A resolver serving `key`.
    pub fn new(key: CertifiedKey) -> Self {
        CertResolver {
            current: RwLock::new(Arc::new(key)),
        }
    }

    /// The identity served now.
    pub fn current(&self) -> Arc<CertifiedKey> {
        self.current
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    fn replace(&self, key: CertifiedKey) {
        *self.current.write().unwrap_or_else(PoisonError::into_inner) = Arc::new(key);
    }
}

impl ResolvesServerCert for CertResolver {
    fn resolve(&self, _hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        Some(self.current())
    }
}

/// What one check of the files found.
#[derive(Debug)]
pub enum ReloadOutcome {
    /// The files hold what was last seen.
    Unchanged,
    /// New files, now served.
    Reloaded,
    /// New files that cannot be used (or cannot be read); the previous
    /// identity stays.
    Failed(Error),
}

/// Watches the TLS files and swaps new identities into a [`CertResolver`].
#[derive(Debug)]
pub struct CertReloader {
    files: TlsFiles,
    resolver: Arc<CertResolver>,
    /// Contents last looked at (served or rejected), so a bad pair is
    /// reported once, not at every tick.
    seen: Option<Contents>,
    /// The last read error, reported once until it changes.
    last_read_error: Option<String>,
    metrics: Option<WebhookMetrics>,
}

impl CertReloader {
    /// Loads the files once (an error if they are unusable) and returns the
    /// resolver serving them, plus the reloader that keeps it current.
    pub fn start(
        files: TlsFiles,
        metrics: Option<WebhookMetrics>,
    ) -> Result<(Arc<CertResolver>, CertReloader), Error> {
        let contents = files.read()?;
        let key = files.parse(&contents)?;
        let resolver = Arc::new(CertResolver::new(key));
        let reloader = CertReloader {
            files,
            resolver: resolver.clone(),
            seen: Some(contents),
            last_read_error: None,
            metrics,
        };
        Ok((resolver, reloader))
    }

    /// Looks at the files once; swaps in a new identity if they changed and
    /// are usable.
    pub fn check(&mut self) -> ReloadOutcome {
        let contents = match self.files.read() {
            Ok(c) => c,
            Err(e) => {
                // A rotation in progress (file briefly missing) or a real
                // problem: keep serving; report a given failure once.
                let text = e.to_string();
                if self.last_read_error.as_ref() == Some(&text) {
                    return ReloadOutcome::Unchanged;
                }
                self.last_read_error = Some(text);
                self.count(ReloadResult::error);
                return ReloadOutcome::Failed(e);
            }
        };
        self.last_read_error = None;
        if self.seen.as_ref() == Some(&contents) {
            return ReloadOutcome::Unchanged;
        }
        let parsed = self.files.parse(&contents);
        self.seen = Some(contents);
        match parsed {
            Ok(key) => {
                self.resolver.replace(key);
                self.count(ReloadResult::success);
                ReloadOutcome::Reloaded
            }
            Err(e) => {
                self.count(ReloadResult::error);
                ReloadOutcome::Failed(e)
            }
        }
    }

    fn count(&self, result: ReloadResult) {
        if let Some(m) = &self.metrics {
            m.tls_reload(result);
        }
    }

    /// Checks the files every `interval` until `stop` turns true (or its
    /// sender is dropped), logging every reload and failure.
    pub async fn run(mut self, interval: Duration, mut stop: tokio::sync::watch::Receiver<bool>) {
        let mut ticker = tokio::time::interval(interval);
        ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        ticker.tick().await;
        loop {
            tokio::select! {
                _ = ticker.tick() => {}
                _ = stop.wait_for(|s| *s) => return,
            }
            // Small files, read on a blocking thread all the same.
            let outcome;
            (self, outcome) = match tokio::task::spawn_blocking(move || {
                let outcome = self.check();
                (self, outcome)
            })
            .await
            {
                Ok(pair) => pair,
                Err(e) => {
                    tracing::error!(error = %e, "TLS reload check failed; reloading stops");
                    return;
                }
            };
            match outcome {
                ReloadOutcome::Unchanged => {}
                ReloadOutcome::Reloaded => tracing::info!(
                    cert = %self.files.cert.display(),
                    "webhook certificate reloaded"
                ),
                ReloadOutcome::Failed(e) => tracing::error!(
                    error = %e,
                    "new webhook certificate is unusable; still serving the previous one"
                ),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn identity(name: &str) -> (String, String) {
        let key = rcgen::KeyPair::generate().unwrap();
        let cert = rcgen::CertificateParams::new(vec![name.to_owned()])
            .unwrap()
            .self_signed(&key)
            .unwrap();
        (cert.pem(), key.serialize_pem())
    }

    fn write(dir: &Path, cert: &str, key: &str) -> TlsFiles {
        let files = TlsFiles {
            cert: dir.join("tls.crt"),
            key: dir.join("tls.key"),
        };
        std::fs::write(&files.cert, cert).unwrap();
        std::fs::write(&files.key, key).unwrap();
        files
    }

    fn leaf(resolver: &CertResolver) -> Vec<u8> {
        resolver.current().cert[0].to_vec()
    }

    #[test]
    fn a_good_pair_loads() {
        let dir = tempfile::tempdir().unwrap();
        let (cert, key) = identity("a");
        let files = write(dir.path(), &cert, &key);
        let loaded = files.load().unwrap();
        assert_eq!(loaded.cert.len(), 1);
        assert_eq!(
            loaded.cert[0].as_ref(),
            CertificateDer::from_pem_slice(cert.as_bytes())
                .unwrap()
                .as_ref()
        );
    }

    #[test]
    fn unusable_files_are_precise_errors() {
        let dir = tempfile::tempdir().unwrap();
        let (cert_a, key_a) = identity("a");
        let (_, key_b) = identity("b");
        let cases: Vec<(&str, &str, &str)> = vec![
            ("", &key_a, "no CERTIFICATE block"),
            ("garbage", &key_a, "no CERTIFICATE block"),
            (&cert_a, "", "no PRIVATE KEY block"),
            (&cert_a, &cert_a, "no PRIVATE KEY block"),
            (&cert_a, &key_b, "cannot be used together"),
            (
                "-----BEGIN CERTIFICATE-----\n!!!!\n-----END CERTIFICATE-----\n",
                &key_a,
                "invalid certificate file",
            ),
        ];
        for (cert, key, needle) in cases {
            let files = write(dir.path(), cert, key);
            let err = files.load().unwrap_err().to_string();
            assert!(err.contains(needle), "{cert:?}/{key:?}: {err}");
        }
        let missing = TlsFiles {
            cert: dir.path().join("missing.crt"),
            key: dir.path().join("tls.key"),
        };
        let err = missing.load().unwrap_err().to_string();
        assert!(err.contains("missing.crt"), "{err}");
    }

    #[test]
    fn oversized_files_are_refused_without_reading_them() {
        let dir = tempfile::tempdir().unwrap();
        let (cert, key) = identity("a");
        let files = write(dir.path(), &cert, &key);
        let big = std::fs::File::create(&files.cert).unwrap();
        big.set_len(MAX_PEM_FILE_BYTES + 1).unwrap();
        let err = files.load().unwrap_err();
        assert!(matches!(err, Error::TlsFileTooLarge { .. }), "{err}");
    }

    #[test]
    fn reload_swaps_good_pairs_and_keeps_the_old_one_on_bad_pairs() {
        let dir = tempfile::tempdir().unwrap();
        let (cert_a, key_a) = identity("a");
        let files = write(dir.path(), &cert_a, &key_a);
        let registry = crate::metrics::SharedRegistry::new();
        let metrics = WebhookMetrics::register(&registry);
        let (resolver, mut reloader) = CertReloader::start(files, Some(metrics)).unwrap();
        let first = leaf(&resolver);
        assert!(matches!(reloader.check(), ReloadOutcome::Unchanged));

        // Half a rotation: new certificate, old key. Refused, reported once.
        let (cert_b, key_b) = identity("b");
        write(dir.path(), &cert_b, &key_a);
        assert!(matches!(reloader.check(), ReloadOutcome::Failed(_)));
        assert!(matches!(reloader.check(), ReloadOutcome::Unchanged));
        assert_eq!(leaf(&resolver), first);

        // The rotation completes.
        write(dir.path(), &cert_b, &key_b);
        assert!(matches!(reloader.check(), ReloadOutcome::Reloaded));
        let second = leaf(&resolver);
        assert_ne!(second, first);

        // Files vanish: keep serving, report once.
        std::fs::remove_file(dir.path().join("tls.key")).unwrap();
        assert!(matches!(reloader.check(), ReloadOutcome::Failed(_)));
        assert!(matches!(reloader.check(), ReloadOutcome::Unchanged));
        assert_eq!(leaf(&resolver), second);

        let text = registry.encode();
        assert!(
            text.contains(r#"webhook_tls_reloads_total{result="success"} 1"#),
            "{text}"
        );
        assert!(
            text.contains(r#"webhook_tls_reloads_total{result="error"} 2"#),
            "{text}"
        );
    }
}
