//! The controller's command line. Every flag can also be set from an
//! environment variable. The webhook's flags are [`WebhookFlags`]; the claim
//! lifecycle owns its group ([`crate::lifecycle::Flags`]), flattened here.
//!
//! The webhook needs `--tls-cert-file` and `--tls-key-file` (always both).
//! Leaving them out is an error unless `--no-webhook` says the webhook is
//! meant to be off (a deployment running only the claim lifecycle): a
//! forgotten certificate must not silently turn admission checks off.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

pub use gpu_dra_cmdline::LogFormat;

use gpu_dra_api::schema::is_dns_subdomain;

use crate::webhook::{DEFAULT_MAX_BODY_BYTES, TlsFiles, WebhookConfig};
use gpu_dra_cmdline::parse_interval;

/// All flags of `gpu-dra-controller`.
#[derive(Debug, Clone, clap::Parser)]
#[command(
    name = "gpu-dra-controller",
    version,
    about = "GPU DRA controller: admission webhook, claim lifecycle, slice GC"
)]
#[group(id = "controller_flags")]
pub struct Flags {
    /// DRA driver name: objects for other drivers are left alone.
    #[arg(long, env = "DRIVER_NAME", default_value = "gpu.nvidia.com", value_parser = parse_driver_name)]
    pub driver_name: String,

    /// Path of a kubeconfig; the in-cluster configuration when unset. Outside
    /// a cluster and without a kubeconfig the webhook runs without the
    /// DeviceClass cache.
    #[arg(long, env = "KUBECONFIG")]
    pub kubeconfig: Option<PathBuf>,

    /// Log format on stderr. The level comes from RUST_LOG (default info).
    #[arg(long, env = "LOG_FORMAT", value_enum, default_value_t = LogFormat::Text)]
    pub log_format: LogFormat,

    /// The admission webhook's flags.
    #[command(flatten)]
    pub webhook: WebhookFlags,

    /// The claim lifecycle's and slice GC's flags.
    #[command(flatten)]
    pub lifecycle: crate::lifecycle::Flags,
}

/// Flags of the admission webhook.
#[derive(Debug, Clone, clap::Args)]
#[group(id = "webhook_flags")]
pub struct WebhookFlags {
    /// Do not run the admission webhook (then no TLS files are needed).
    #[arg(long, env = "NO_WEBHOOK", value_parser = clap::builder::BoolishValueParser::new(), action = clap::ArgAction::SetTrue)]
    pub no_webhook: bool,

    /// Address (host:port) of the HTTPS webhook server (`/validate`,
    /// `/healthz`, `/metrics`). Port 0 picks a free port (logged).
    #[arg(long, env = "WEBHOOK_ADDR", default_value = "0.0.0.0:8443")]
    pub webhook_addr: SocketAddr,

    /// PEM certificate chain of the webhook (leaf first). Re-read when it
    /// changes on disk.
    #[arg(
        long,
        env = "TLS_CERT_FILE",
        requires = "tls_key_file",
        required_unless_present = "no_webhook"
    )]
    pub tls_cert_file: Option<PathBuf>,

    /// PEM private key (PKCS#8, PKCS#1 or SEC1) of the webhook certificate.
    #[arg(
        long,
        env = "TLS_KEY_FILE",
        requires = "tls_cert_file",
        required_unless_present = "no_webhook"
    )]
    pub tls_key_file: Option<PathBuf>,

    /// How often the certificate and key files are checked for changes
    /// (e.g. `10s`, `500ms`, `1m`; between 100ms and 1h).
    #[arg(long, env = "TLS_RELOAD_INTERVAL", default_value = "10s", value_parser = parse_interval)]
    pub tls_reload_interval: Duration,

    /// Largest accepted AdmissionReview body in bytes; larger ones get 413.
    #[arg(long, env = "WEBHOOK_MAX_BODY_BYTES", default_value_t = DEFAULT_MAX_BODY_BYTES,
          value_parser = clap::value_parser!(u64).range(4096..=(64 << 20)))]
    pub webhook_max_body_bytes: u64,
}

impl WebhookFlags {
    /// The webhook server's settings, or `None` when the webhook is off.
    pub fn config(&self) -> Option<WebhookConfig> {
        if self.no_webhook {
            return None;
        }
        let (Some(cert), Some(key)) = (&self.tls_cert_file, &self.tls_key_file) else {
            // clap enforces both unless --no-webhook.
            return None;
        };
        Some(WebhookConfig {
            addr: self.webhook_addr,
            tls: TlsFiles {
                cert: cert.clone(),
                key: key.clone(),
            },
            reload_interval: self.tls_reload_interval,
            max_body_bytes: self.webhook_max_body_bytes as usize,
            ..WebhookConfig::default()
        })
    }
}

/// A DNS subdomain (RFC 1123) of at most 63 characters, the rule for DRA
/// driver names.
fn parse_driver_name(s: &str) -> Result<String, String> {
    if s.len() > 63 || !is_dns_subdomain(s) {
        return Err(format!(
            "invalid driver name {s:?}: must be a lowercase DNS subdomain of at most 63 characters"
        ));
    }
    Ok(s.to_owned())
}

#[cfg(test)]
mod tests {
    use clap::{CommandFactory, Parser};

    use super::*;

    fn parse(args: &[&str]) -> Result<Flags, clap::Error> {
        Flags::try_parse_from(std::iter::once("gpu-dra-controller").chain(args.iter().copied()))
    }

    #[test]
    fn the_command_definition_is_consistent() {
        Flags::command().debug_assert();
    }

    #[test]
    fn defaults() {
        let f = parse(&["--tls-cert-file", "c.pem", "--tls-key-file", "k.pem"]).unwrap();
        assert_eq!(f.driver_name, "gpu.nvidia.com");
        assert_eq!(f.log_format, LogFormat::Text);
        assert!(!f.webhook.no_webhook);
        let c = f.webhook.config().unwrap();
        assert_eq!(c.addr, "0.0.0.0:8443".parse().unwrap());
        assert_eq!(c.tls.cert, PathBuf::from("c.pem"));
        assert_eq!(c.tls.key, PathBuf::from("k.pem"));
        assert_eq!(c.reload_interval, Duration::from_secs(10));
        assert_eq!(c.max_body_bytes as u64, DEFAULT_MAX_BODY_BYTES);
    }

    #[test]
    fn no_webhook_needs_no_tls_files_and_gives_no_config() {
        let f = parse(&["--no-webhook"]).unwrap();
        assert!(f.webhook.no_webhook);
        assert!(f.webhook.config().is_none());
    }

    #[test]
    fn driver_names_follow_dns_subdomain_rules() {
        assert!(parse_driver_name("gpu.nvidia.com").is_ok());
        assert!(parse_driver_name("gpu-2.example").is_ok());
        for bad in [
            "",
            "GPU.nvidia.com",
            "gpu..com",
            "-gpu.com",
            "gpu_x.com",
            "../etc",
            &"a".repeat(64),
        ] {
            assert!(parse_driver_name(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn bad_flags_give_one_line_errors_naming_the_problem() {
        let tls = ["--tls-cert-file", "c", "--tls-key-file", "k"];
        let with_tls = |extra: &[&'static str]| -> Vec<&'static str> {
            tls.iter().copied().chain(extra.iter().copied()).collect()
        };
        let cases: Vec<(Vec<&str>, &str)> = vec![
            (vec![], "--tls-cert-file"),
            (vec!["--tls-cert-file", "c"], "--tls-key-file"),
            (vec!["--tls-key-file", "k"], "--tls-cert-file"),
            (with_tls(&["--bogus"]), "--bogus"),
            (
                with_tls(&["--driver-name", "../etc"]),
                "invalid driver name",
            ),
            (with_tls(&["--log-format", "xml"]), "xml"),
            (with_tls(&["--webhook-addr", "nowhere"]), "--webhook-addr"),
            (with_tls(&["--tls-reload-interval", "5"]), "unit"),
            (with_tls(&["--tls-reload-interval", "1ms"]), "out of range"),
            (
                with_tls(&["--tls-reload-interval", "xs"]),
                "invalid duration",
            ),
            (
                with_tls(&["--webhook-max-body-bytes", "10"]),
                "--webhook-max-body-bytes",
            ),
        ];
        for (args, needle) in cases {
            let e = parse(&args).unwrap_err();
            let line = gpu_dra_cmdline::one_line_error(&e);
            assert!(line.starts_with("error: "), "{line}");
            assert!(!line.contains('\n'), "{line}");
            assert!(line.contains(needle), "{args:?}: {line}");
        }
    }
}
