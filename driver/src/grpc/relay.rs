//! Accepting DRA connections, and passing them through to the instance that
//! serves while this one waits to take over.
//!
//! In a rolling update with per-instance sockets ([`super::instance`]) the
//! new instance registers with kubelet before the old one has let the node
//! go, and kubelet calls the newest plugin. Until the new instance holds
//! the node's state, it copies each connection kubelet makes, byte for
//! byte in both directions, to the serving instance's DRA socket: the old
//! instance answers, as the only owner of the checkpoint, the MIG devices
//! and the MPS daemons. Once this instance has taken over, new connections
//! go to its own gRPC server. A connection that finds no instance serving
//! (the old one is draining or gone) waits here until this instance serves
//! and is then served by it.
//!
//! Written by hand: this is a splice of two Unix streams, which
//! `tokio::io::copy_bidirectional` does; a gRPC proxy would decode and
//! re-encode every call for nothing.

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use tokio::net::{UnixListener, UnixStream};
use tokio::sync::{mpsc, watch};
use tokio::task::JoinHandle;

/// The pause after a failed `accept` (out of file descriptors, most often)
/// before the next one.
const ACCEPT_RETRY: Duration = Duration::from_millis(100);

/// Where accepted connections go.
#[derive(Debug)]
pub(super) struct Router {
    /// `true` once this instance serves: connections go to `local`.
    pub(super) serving: watch::Sender<bool>,
    /// Connections relayed to another instance so far.
    pub(super) relayed: Arc<AtomicU64>,
}

/// Spawns the accept loop on `listener`. Connections go to `local` once
/// `serving` is true; before, each is relayed to the first of `targets`
/// that accepts it.
pub(super) fn spawn(
    listener: UnixListener,
    targets: Vec<PathBuf>,
    serving: bool,
    local: mpsc::UnboundedSender<UnixStream>,
) -> (Router, JoinHandle<()>) {
    let (serving_tx, serving_rx) = watch::channel(serving);
    let relayed = Arc::new(AtomicU64::new(0));
    let task = tokio::spawn(accept_loop(
        listener,
        Arc::from(targets),
        serving_rx,
        local,
        Arc::clone(&relayed),
    ));
    (
        Router {
            serving: serving_tx,
            relayed,
        },
        task,
    )
}

async fn accept_loop(
    listener: UnixListener,
    targets: Arc<[PathBuf]>,
    serving: watch::Receiver<bool>,
    local: mpsc::UnboundedSender<UnixStream>,
    relayed: Arc<AtomicU64>,
) {
    loop {
        let conn = match listener.accept().await {
            Ok((conn, _)) => conn,
            Err(e) => {
                tracing::warn!(error = %e, "cannot accept a connection on the DRA socket");
                tokio::time::sleep(ACCEPT_RETRY).await;
                continue;
            }
        };
        if *serving.borrow() {
            if local.send(conn).is_err() {
                return;
            }
        } else {
            tokio::spawn(relay(
                conn,
                Arc::clone(&targets),
                serving.clone(),
                local.clone(),
                Arc::clone(&relayed),
            ));
        }
    }
}

/// Relays `conn` to the first target that takes it, until either side
/// closes; with no target taking it, waits for this instance to serve.
async fn relay(
    mut conn: UnixStream,
    targets: Arc<[PathBuf]>,
    mut serving: watch::Receiver<bool>,
    local: mpsc::UnboundedSender<UnixStream>,
    relayed: Arc<AtomicU64>,
) {
    for target in targets.iter() {
        // Taken over meanwhile: the link may name this very instance now.
        if *serving.borrow() {
            break;
        }
        let mut upstream = match UnixStream::connect(target).await {
            Ok(s) => s,
            Err(e) => {
                tracing::debug!(target = %target.display(), error = %e, "no plugin instance there");
                continue;
            }
        };
        relayed.fetch_add(1, Ordering::Relaxed);
        tracing::debug!(target = %target.display(), "relaying a kubelet connection to the serving instance");
        match tokio::io::copy_bidirectional(&mut conn, &mut upstream).await {
            Ok((up, down)) => {
                tracing::debug!(target = %target.display(), bytes_up = up, bytes_down = down, "relayed connection closed");
            }
            Err(e) => {
                tracing::debug!(target = %target.display(), error = %e, "relayed connection broken");
            }
        }
        return;
    }
    if !*serving.borrow() {
        tracing::info!(
            "no plugin instance serves; a kubelet connection waits for this one to take over"
        );
    }
    if serving.wait_for(|s| *s).await.is_ok() {
        let _ = local.send(conn);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    /// An echo server on `path` that prefixes every answer with `tag`.
    fn echo(path: &std::path::Path, tag: &'static [u8]) -> JoinHandle<()> {
        let listener = UnixListener::bind(path).unwrap();
        tokio::spawn(async move {
            loop {
                let (mut s, _) = listener.accept().await.unwrap();
                tokio::spawn(async move {
                    let mut buf = [0u8; 64];
                    loop {
                        let n = s.read(&mut buf).await.unwrap_or(0);
                        if n == 0 {
                            return;
                        }
                        let mut out = tag.to_vec();
                        out.extend_from_slice(&buf[..n]);
                        if s.write_all(&out).await.is_err() {
                            return;
                        }
                    }
                });
            }
        })
    }

    async fn ask(path: &std::path::Path, what: &[u8]) -> Vec<u8> {
        let mut s = UnixStream::connect(path).await.unwrap();
        s.write_all(what).await.unwrap();
        let mut buf = vec![0u8; 64];
        let n = tokio::time::timeout(Duration::from_secs(5), s.read(&mut buf))
            .await
            .expect("an answer in time")
            .unwrap();
        buf.truncate(n);
        buf
    }

    #[tokio::test]
    async fn connections_go_to_the_first_live_target_then_here_once_serving() {
        let dir = tempfile::tempdir().unwrap();
        let old = dir.path().join("old.sock");
        let _old = echo(&old, b"old:");
        let own = dir.path().join("own.sock");
        let listener = UnixListener::bind(&own).unwrap();
        let (tx, mut rx) = mpsc::unbounded_channel();
        let missing = dir.path().join("missing.sock");
        let (router, task) = spawn(listener, vec![missing, old.clone()], false, tx);

        // Waiting: the old instance answers, through the relay.
        assert_eq!(ask(&own, b"a").await, b"old:a");
        assert_eq!(router.relayed.load(Ordering::Relaxed), 1);
        assert!(rx.try_recv().is_err(), "nothing was served here");

        // Serving: connections reach this instance's server.
        router.serving.send_replace(true);
        let _client = UnixStream::connect(&own).await.unwrap();
        let here = tokio::time::timeout(Duration::from_secs(5), rx.recv())
            .await
            .expect("a local connection in time");
        assert!(here.is_some());
        assert_eq!(router.relayed.load(Ordering::Relaxed), 1);
        task.abort();
    }

    #[tokio::test]
    async fn with_nobody_serving_a_connection_waits_and_is_served_here() {
        let dir = tempfile::tempdir().unwrap();
        let own = dir.path().join("own.sock");
        let listener = UnixListener::bind(&own).unwrap();
        let (tx, mut rx) = mpsc::unbounded_channel();
        let gone = dir.path().join("gone.sock");
        // A socket file nobody listens on: connect is refused.
        drop(std::os::unix::net::UnixListener::bind(&gone).unwrap());
        let (router, task) = spawn(listener, vec![gone], false, tx);

        let mut client = UnixStream::connect(&own).await.unwrap();
        client.write_all(b"early").await.unwrap();
        // Not served while this instance does not serve.
        assert!(
            tokio::time::timeout(Duration::from_millis(200), rx.recv())
                .await
                .is_err()
        );
        router.serving.send_replace(true);
        let mut here = tokio::time::timeout(Duration::from_secs(5), rx.recv())
            .await
            .expect("the waiting connection in time")
            .unwrap();
        // The very bytes the client sent are there to read: nothing lost.
        let mut buf = [0u8; 5];
        here.read_exact(&mut buf).await.unwrap();
        assert_eq!(&buf, b"early");
        assert_eq!(router.relayed.load(Ordering::Relaxed), 0);
        task.abort();
    }

    #[tokio::test]
    async fn a_relayed_connection_ends_when_the_old_instance_closes_it() {
        let dir = tempfile::tempdir().unwrap();
        let old = dir.path().join("old.sock");
        let old_listener = UnixListener::bind(&old).unwrap();
        let own = dir.path().join("own.sock");
        let (tx, _rx) = mpsc::unbounded_channel();
        let (_router, task) = spawn(UnixListener::bind(&own).unwrap(), vec![old], false, tx);
        let mut client = UnixStream::connect(&own).await.unwrap();
        let (upstream, _) = old_listener.accept().await.unwrap();
        drop(upstream);
        let mut buf = [0u8; 1];
        let n = tokio::time::timeout(Duration::from_secs(5), client.read(&mut buf))
            .await
            .expect("end of stream in time")
            .unwrap();
        assert_eq!(n, 0, "the client sees the old instance's close");
        task.abort();
    }
}
