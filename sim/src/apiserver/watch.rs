//! Watch streams: newline-delimited JSON `{"type": ..., "object": ...}` events over a chunked
//! HTTP response, starting from a resourceVersion (or a snapshot), with periodic `BOOKMARK`s,
//! `sendInitialEvents` streaming lists, `timeoutSeconds`, and `410 Expired` `ERROR` events when
//! the requested history is gone or the watcher falls too far behind.

use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::response::{IntoResponse, Response};
use http::{StatusCode, header};
use serde_json::{Value, json};
use tokio::sync::{broadcast, mpsc};
use tokio::time::Instant;
use tokio_stream::wrappers::ReceiverStream;

use super::http::{AppState, Params, Representation};
use super::resources::Resource;
use super::selectors::Selectors;
use super::status::ApiError;
use super::store::{EventType, StoreEvent, WatchFrom};

/// Annotation on the bookmark that ends the initial events of a streaming list.
const INITIAL_EVENTS_END: &str = "k8s.io/initial-events-end";

/// Everything a watch task needs.
struct Watcher {
    resource: Resource,
    namespace: Option<String>,
    selectors: Selectors,
    repr: Representation,
    bookmarks: bool,
    tx: mpsc::Sender<Result<Bytes, Infallible>>,
    /// Highest resourceVersion sent to this client.
    sent_rv: u64,
}

impl Watcher {
    /// Sends one event line; false when the client is gone.
    async fn send(&mut self, event_type: &str, object: Value) -> bool {
        let mut line =
            serde_json::to_vec(&json!({"type": event_type, "object": object})).unwrap_or_default();
        line.push(b'\n');
        self.tx.send(Ok(Bytes::from(line))).await.is_ok()
    }

    async fn send_object(&mut self, event_type: EventType, object: &Value) -> bool {
        if let Some(rv) = object
            .pointer("/metadata/resourceVersion")
            .and_then(Value::as_str)
            .and_then(|rv| rv.parse::<u64>().ok())
        {
            self.sent_rv = self.sent_rv.max(rv);
        }
        let rendered = self.repr.object(object);
        self.send(event_type.as_str(), rendered).await
    }

    async fn send_store_event(&mut self, event: &StoreEvent) -> bool {
        let seen = event.for_watcher(self.resource, self.namespace.as_deref(), &self.selectors);
        self.sent_rv = self.sent_rv.max(event.resource_version);
        match seen {
            Some((event_type, object)) => {
                let object = object.clone();
                self.send_object(event_type, &object).await
            }
            None => true,
        }
    }

    async fn send_bookmark(&mut self, rv: u64, initial_events_end: bool) -> bool {
        let info = self.resource.info();
        let mut metadata = json!({"resourceVersion": rv.to_string()});
        if initial_events_end {
            metadata["annotations"] = json!({INITIAL_EVENTS_END: "true"});
        }
        let (kind, api_version) = match self.repr {
            Representation::Full => (info.kind.to_owned(), self.resource.api_version()),
            Representation::Metadata => (
                "PartialObjectMetadata".to_owned(),
                "meta.k8s.io/v1".to_owned(),
            ),
        };
        self.sent_rv = self.sent_rv.max(rv);
        self.send(
            "BOOKMARK",
            json!({"kind": kind, "apiVersion": api_version, "metadata": metadata}),
        )
        .await
    }

    async fn send_error(&mut self, err: &ApiError) -> bool {
        self.send("ERROR", err.to_status()).await
    }
}

/// Answers a `?watch=true` request.
pub(crate) fn serve(
    app: &Arc<AppState>,
    resource: Resource,
    namespace: Option<&str>,
    params: &Params,
    repr: Representation,
) -> Result<Response, ApiError> {
    let selectors = params.selectors(resource)?;
    let bookmarks = params.flag("allowWatchBookmarks")?;
    let send_initial = params.flag("sendInitialEvents")?;
    if send_initial {
        if params.get("resourceVersionMatch") != Some("NotOlderThan") {
            return Err(ApiError::unprocessable(
                "ListOptions.meta.k8s.io \"\" is invalid: resourceVersionMatch: Forbidden: \
                 sendInitialEvents requires setting resourceVersionMatch to NotOlderThan",
            ));
        }
        if !bookmarks {
            return Err(ApiError::unprocessable(
                "ListOptions.meta.k8s.io \"\" is invalid: allowWatchBookmarks: Forbidden: \
                 sendInitialEvents requires allowWatchBookmarks=true",
            ));
        }
    }
    let from = match params.get("resourceVersion").unwrap_or("") {
        _ if send_initial => WatchFrom::Snapshot,
        "" | "0" => WatchFrom::Snapshot,
        rv => WatchFrom::After(rv.parse::<u64>().map_err(|_| {
            // The real server fails such a watch in its storage layer: a 500 without reason.
            ApiError::internal_without_reason(format!(
                "resourceVersion: Invalid value: {rv:?}: strconv.ParseUint: parsing {rv:?}: invalid syntax"
            ))
        })?),
    };
    let max = app.opts.max_watch_timeout;
    let timeout = params
        .number("timeoutSeconds")?
        .map_or(max, |s| Duration::from_secs(s).min(max));

    let (tx, rx) = mpsc::channel(64);
    let mut watcher = Watcher {
        resource,
        namespace: namespace.map(str::to_owned),
        selectors: selectors.clone(),
        repr,
        bookmarks,
        tx,
        sent_rv: 0,
    };
    let start = app.store.watch(resource, namespace, from, &selectors);
    let app = app.clone();
    tokio::spawn(async move {
        match start {
            Ok(start) => {
                run(&app, &mut watcher, start, send_initial, timeout).await;
            }
            Err(err) => {
                let _ = watcher.send_error(&err).await;
            }
        }
    });
    Ok(Response::builder()
        .status(StatusCode::OK)
        .header(header::CONTENT_TYPE, "application/json")
        .body(Body::from_stream(ReceiverStream::new(rx)))
        .unwrap_or_else(|_| ApiError::internal("building the watch response").into_response()))
}

async fn run(
    app: &AppState,
    watcher: &mut Watcher,
    start: super::store::WatchStart,
    send_initial: bool,
    timeout: Duration,
) {
    let deadline = Instant::now()
        .checked_add(timeout)
        .unwrap_or_else(|| Instant::now() + Duration::from_secs(86_400 * 365));
    let mut receiver = start.receiver;
    watcher.sent_rv = start.resource_version;
    for (event_type, object) in start.initial {
        if !watcher.send_object(event_type, &object).await {
            return;
        }
    }
    if send_initial && !watcher.send_bookmark(start.resource_version, true).await {
        return;
    }
    let interval = app.opts.bookmark_interval.max(Duration::from_millis(10));
    let mut ticker = tokio::time::interval_at(Instant::now() + interval, interval);
    let mut shutdown = app.shutdown.clone();
    if *shutdown.borrow() {
        return;
    }
    loop {
        tokio::select! {
            changed = shutdown.changed() => {
                if changed.is_err() || *shutdown.borrow() {
                    return;
                }
            }
            () = watcher.tx.closed() => return,
            () = tokio::time::sleep_until(deadline) => return,
            _ = ticker.tick(), if watcher.bookmarks => {
                // Every event up to the current resourceVersion is already in the channel
                // (events are sent under the store lock): drain them, then bookmark.
                let current = app.store.resource_version();
                loop {
                    match receiver.try_recv() {
                        Ok(event) => {
                            if !watcher.send_store_event(&event).await {
                                return;
                            }
                        }
                        Err(broadcast::error::TryRecvError::Empty) => break,
                        Err(broadcast::error::TryRecvError::Lagged(_)) => {
                            let _ = watcher.send_error(&ApiError::expired(watcher.sent_rv, current)).await;
                            return;
                        }
                        Err(broadcast::error::TryRecvError::Closed) => return,
                    }
                }
                let rv = current.max(watcher.sent_rv);
                if !watcher.send_bookmark(rv, false).await {
                    return;
                }
            }
            event = receiver.recv() => match event {
                Ok(event) => {
                    if !watcher.send_store_event(&event).await {
                        return;
                    }
                }
                Err(broadcast::error::RecvError::Lagged(_)) => {
                    let current = app.store.resource_version();
                    let _ = watcher.send_error(&ApiError::expired(watcher.sent_rv, current)).await;
                    return;
                }
                Err(broadcast::error::RecvError::Closed) => return,
            },
        }
    }
}
