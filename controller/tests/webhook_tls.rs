//! Certificate rotation as a client sees it: replacing the files makes new
//! connections get the new certificate; a bad new pair keeps the old one;
//! startup with unusable files fails cleanly.

mod common;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use common::{Client, Harness, TestCa, eventually, metric, write_leaf};
use gpu_dra_analysis::validate::{StaticClasses, Validator};
use gpu_dra_controller::metrics::SharedRegistry;
use gpu_dra_controller::webhook::{Reviewer, TlsFiles, WebhookConfig, WebhookServer};

fn fast_reload() -> WebhookConfig {
    WebhookConfig {
        reload_interval: Duration::from_millis(100),
        ..WebhookConfig::default()
    }
}

#[tokio::test]
async fn replaced_files_are_served_to_new_connections_and_bad_ones_are_not() {
    let h = Harness::start_with(Arc::new(StaticClasses::default()), fast_reload()).await;
    let first = h.client.peer_certificate().await.unwrap();
    assert_eq!(first, h.server.current_certificate());

    // Keep a connection open across the rotation: it keeps working.
    let mut open = h.client.connect().await;

    let second = h.ca.leaf(2);
    write_leaf(h.dir.path(), &second);
    let served = eventually(Duration::from_secs(20), || async {
        let seen = h.client.peer_certificate().await.ok()?;
        (seen == second.der).then_some(seen)
    })
    .await;
    assert!(served.is_some(), "the new certificate was never served");
    assert_eq!(open.get("/healthz").await.text(), "ok\n");

    // A certificate without its key (the key of another pair): refused, the
    // second certificate stays.
    let errors = |text: &str| {
        metric(
            text,
            r#"gpu_dra_controller_webhook_tls_reloads_total{result="error"}"#,
        )
        .unwrap_or(0.0)
    };
    let errors_before = errors(&h.client.get("/metrics").await.text());
    let third = h.ca.leaf(3);
    std::fs::write(h.dir.path().join("tls.crt"), &third.cert_pem).unwrap();
    let metrics = eventually(Duration::from_secs(20), || async {
        let text = h.client.get("/metrics").await.text();
        (errors(&text) > errors_before).then_some(text)
    })
    .await
    .expect("the bad pair was never noticed");
    assert_eq!(
        metric(
            &metrics,
            r#"gpu_dra_controller_webhook_tls_reloads_total{result="success"}"#
        ),
        Some(1.0),
        "{metrics}"
    );
    assert_eq!(h.client.peer_certificate().await.unwrap(), second.der);

    // Garbage in both files: still the second certificate.
    std::fs::write(h.dir.path().join("tls.crt"), "garbage").unwrap();
    std::fs::write(h.dir.path().join("tls.key"), "garbage").unwrap();
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(h.client.peer_certificate().await.unwrap(), second.der);

    // Completing the rotation to the third pair is picked up.
    write_leaf(h.dir.path(), &third);
    let served = eventually(Duration::from_secs(20), || async {
        let seen = h.client.peer_certificate().await.ok()?;
        (seen == third.der).then_some(())
    })
    .await;
    assert!(served.is_some(), "the third certificate was never served");
}

#[tokio::test]
async fn a_client_not_trusting_the_ca_is_refused_by_its_own_verification() {
    let h = Harness::start().await;
    let stranger = Client::new(h.server.local_addr(), &TestCa::new().der);
    assert!(stranger.peer_certificate().await.is_err());
}

#[tokio::test]
async fn startup_with_unusable_files_fails_with_a_precise_error() {
    let dir = tempfile::tempdir().unwrap();
    let ca = TestCa::new();
    let good = write_leaf(dir.path(), &ca.leaf(1));
    let other = ca.leaf(2);
    std::fs::write(dir.path().join("other.key"), &other.key_pem).unwrap();
    std::fs::write(dir.path().join("empty.crt"), "").unwrap();
    let cases = [
        (
            TlsFiles {
                cert: good.cert.clone(),
                key: dir.path().join("other.key"),
            },
            "cannot be used together",
        ),
        (
            TlsFiles {
                cert: dir.path().join("empty.crt"),
                key: good.key.clone(),
            },
            "empty.crt",
        ),
        (
            TlsFiles {
                cert: dir.path().join("absent.crt"),
                key: good.key.clone(),
            },
            "absent.crt",
        ),
    ];
    for (tls, needle) in cases {
        let config = WebhookConfig {
            addr: SocketAddr::from(([127, 0, 0, 1], 0)),
            tls,
            ..WebhookConfig::default()
        };
        let reviewer = Reviewer::new(
            Validator::new(common::DRIVER),
            Arc::new(StaticClasses::default()),
        );
        let err = WebhookServer::start(config, reviewer, &SharedRegistry::new())
            .await
            .unwrap_err()
            .to_string();
        assert!(err.contains(needle), "{needle}: {err}");
    }
}

#[tokio::test]
async fn a_taken_address_is_a_bind_error() {
    let h = Harness::start().await;
    let config = WebhookConfig {
        addr: h.server.local_addr(),
        tls: TlsFiles {
            cert: h.dir.path().join("tls.crt"),
            key: h.dir.path().join("tls.key"),
        },
        ..WebhookConfig::default()
    };
    let reviewer = Reviewer::new(
        Validator::new(common::DRIVER),
        Arc::new(StaticClasses::default()),
    );
    let err = WebhookServer::start(config, reviewer, &SharedRegistry::new())
        .await
        .unwrap_err()
        .to_string();
    assert!(err.contains("cannot listen"), "{err}");
}
