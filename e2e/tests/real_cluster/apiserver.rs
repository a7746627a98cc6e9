//! The stand-in API server (`gpu_dra_sim::apiserver`, what the demo and the
//! fast tests run against) checked against the real kube-apiserver of the
//! test cluster: each test runs one scenario of requests, built with the
//! kube client's own request builders (the bytes the plugin, the controller
//! and the demo send), once against the real server and once against a
//! stand-in started in-process, and compares the answers step by step: the
//! HTTP status, and for errors the `metav1.Status` reason, details and
//! causes (field and reason; messages are shown, not compared), for
//! successes the object returned (without what each server makes up:
//! UIDs, resourceVersions, timestamps), for lists and watches the names
//! and event types, and the `Warning` headers.
//!
//! Covered: ResourceSlice create, update, patch, server-side apply (as the
//! plugin publishes), field and label selectors, delete with preconditions
//! (as the controller's GC); ResourceClaim create and status writes (the
//! demo's merge patch of the allocation, the plugin's server-side apply of
//! `status.devices` and its read-modify-write clear); watches resumed from
//! a resourceVersion, from `0`, and from one too old (410 Expired);
//! `coordination.k8s.io/v1` Leases as the controller's leader election
//! writes them; `events.k8s.io/v1` Events as the controller records them
//! and looks them up; and invalid objects (names, limits, missing fields,
//! undecodable values, unknown fields under each `fieldValidation`).
//!
//! Objects on the real server live in namespaces `e2e-apiserver-*` and,
//! for the cluster-scoped slices, under names `e2e-apiserver-*` of driver
//! [`DRIVER`] (not the GPU driver's, so neither the scheduler nor the
//! driver's controller acts on them); both are removed afterwards.

use std::collections::BTreeSet;
use std::fmt::Write as _;
use std::future::Future;
use std::pin::Pin;
use std::time::Duration;

use gpu_dra_sim::apiserver::{ServerOptions, TestApiServer};
use http_body_util::BodyExt as _;
use kube::api::{
    DeleteParams, GetParams, ListParams, Patch, PatchParams, PostParams, Preconditions, WatchParams,
};
use kube::core::Request;
use libtest_mimic::Failed;
use serde_json::{Value, json};

use crate::harness::Cluster;

pub const TESTS: [(&str, crate::Test); 5] = [
    (
        "apiserver::slice_writes_apply_and_selectors_match_the_real_server",
        slices_test,
    ),
    (
        "apiserver::claim_status_writes_match_the_real_server",
        claims_test,
    ),
    (
        "apiserver::watches_resume_and_expire_like_the_real_server",
        watches_test,
    ),
    (
        "apiserver::leases_and_events_match_the_real_server",
        leases_events_test,
    ),
    (
        "apiserver::invalid_objects_are_refused_like_the_real_server",
        invalid_test,
    ),
];

/// The driver of the test's slices and allocations: not the GPU driver, so
/// nothing of the installed driver acts on them.
const DRIVER: &str = "apiserver.e2e.example.com";
/// The label every cluster-scoped object of these tests carries (value: the
/// scenario), by which leftovers are removed.
const LABEL: &str = "e2e-apiserver";
/// The nodes the test's slices name (no such nodes exist).
const NODE_A: &str = "e2e-apiserver-node-a";
const NODE_B: &str = "e2e-apiserver-node-b";
/// How long one request may take before the step is recorded as a timeout.
const REQUEST_LIMIT: Duration = Duration::from_secs(30);

/// One server under test.
struct Side {
    client: kube::Client,
    /// The namespace of the namespaced objects.
    ns: String,
    /// The scenario's shared inputs (timestamps), the same on both sides.
    now: String,
}

/// An answer: HTTP status, body (JSON, or the text as a string) and the
/// `Warning` headers.
#[derive(Debug, Clone)]
struct Reply {
    code: u16,
    body: Value,
    warnings: Vec<String>,
}

impl Reply {
    fn rv(&self) -> String {
        self.body["metadata"]["resourceVersion"]
            .as_str()
            .unwrap_or_default()
            .to_owned()
    }
    fn uid(&self) -> String {
        self.body["metadata"]["uid"]
            .as_str()
            .unwrap_or_default()
            .to_owned()
    }
}

/// One step of a scenario as seen by one server: what is compared, and
/// what is only shown (the messages).
#[derive(Debug, Clone)]
struct Step {
    what: String,
    seen: Value,
    info: String,
}

/// The steps of one scenario on one side.
struct Run<'a> {
    side: &'a Side,
    steps: Vec<Step>,
}

type Built = Result<http::Request<Vec<u8>>, kube::core::request::Error>;

impl<'a> Run<'a> {
    fn new(side: &'a Side) -> Self {
        Run {
            side,
            steps: Vec::new(),
        }
    }

    /// Sends `request` and records the answer as step `what`.
    async fn send(&mut self, what: &str, request: Built) -> Reply {
        let reply = match request {
            Ok(r) => call(&self.side.client, r).await,
            Err(e) => Reply {
                code: 0,
                body: json!({"requestError": e.to_string()}),
                warnings: Vec::new(),
            },
        };
        self.record(what, &reply);
        reply
    }

    /// Sends `request` with `query` appended to its URL.
    async fn send_with(&mut self, what: &str, request: Built, query: &str) -> Reply {
        self.send(what, request.map(|r| with_query(r, query))).await
    }

    fn record(&mut self, what: &str, reply: &Reply) {
        let (seen, info) = observe(reply);
        self.steps.push(Step {
            what: what.to_owned(),
            seen,
            info,
        });
    }

    /// Records a value computed from earlier answers.
    fn note(&mut self, what: &str, seen: Value) {
        self.steps.push(Step {
            what: what.to_owned(),
            seen,
            info: String::new(),
        });
    }

    /// Opens a watch (it ends after its `timeoutSeconds`) and records the
    /// HTTP status and every event: type, object name, and for `ERROR`
    /// events the Status' code and reason.
    async fn watch(&mut self, what: &str, request: Built) {
        let reply = match request {
            Ok(r) => call(&self.side.client, r).await,
            Err(e) => Reply {
                code: 0,
                body: json!({"requestError": e.to_string()}),
                warnings: Vec::new(),
            },
        };
        if reply.code != 200 {
            self.record(what, &reply);
            return;
        }
        let text = reply.body.as_str().map_or_else(
            || serde_json::to_string(&reply.body).unwrap_or_default(),
            str::to_owned,
        );
        let mut events = Vec::new();
        let mut info = String::new();
        for line in text.lines().filter(|l| !l.trim().is_empty()) {
            let event: Value = serde_json::from_str(line).unwrap_or(Value::String(line.into()));
            let kind = event["type"].as_str().unwrap_or("?").to_owned();
            let object = &event["object"];
            if kind == "ERROR" {
                let _ = write!(info, "{} ", object["message"]);
                events.push(json!([kind, object["code"], object["reason"]]));
            } else {
                events.push(json!([kind, object["metadata"]["name"]]));
            }
        }
        self.steps.push(Step {
            what: what.to_owned(),
            seen: json!({"code": reply.code, "events": events}),
            info,
        });
    }
}

/// `request` with `query` appended to its URL.
fn with_query(request: http::Request<Vec<u8>>, query: &str) -> http::Request<Vec<u8>> {
    let (mut parts, body) = request.into_parts();
    let uri = parts.uri.to_string();
    let joined = if uri.contains('?') {
        format!("{uri}&{query}")
    } else {
        format!("{uri}?{query}")
    };
    parts.uri = joined.parse().expect("a URI with a query is a URI");
    http::Request::from_parts(parts, body)
}

/// Sends one request and reads the whole answer.
async fn call(client: &kube::Client, request: http::Request<Vec<u8>>) -> Reply {
    let send = async {
        let response = client.send(request.map(kube::client::Body::from)).await?;
        let code = response.status().as_u16();
        let warnings = response
            .headers()
            .get_all("warning")
            .iter()
            .map(|w| String::from_utf8_lossy(w.as_bytes()).into_owned())
            .collect();
        let bytes = response
            .into_body()
            .collect()
            .await
            .map_err(|e| kube::Error::Service(e.into()))?
            .to_bytes();
        let body = serde_json::from_slice(&bytes)
            .unwrap_or_else(|_| Value::String(String::from_utf8_lossy(&bytes).into_owned()));
        Ok::<_, kube::Error>(Reply {
            code,
            body,
            warnings,
        })
    };
    match tokio::time::timeout(REQUEST_LIMIT, send).await {
        Ok(Ok(reply)) => reply,
        Ok(Err(e)) => Reply {
            code: 0,
            body: json!({"transportError": e.to_string()}),
            warnings: Vec::new(),
        },
        Err(_) => Reply {
            code: 0,
            body: json!({"transportError": "no answer in time"}),
            warnings: Vec::new(),
        },
    }
}

/// What is compared of an answer, and what is only shown.
fn observe(reply: &Reply) -> (Value, String) {
    let body = &reply.body;
    let mut seen = serde_json::Map::new();
    seen.insert("code".into(), json!(reply.code));
    let mut info = String::new();
    if body["kind"] == "Status" {
        let details = &body["details"];
        let causes: BTreeSet<String> = details["causes"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|c| {
                format!(
                    "{}: {}",
                    c["field"].as_str().unwrap_or_default(),
                    c["reason"].as_str().unwrap_or_default()
                )
            })
            .collect();
        seen.insert("status".into(), body["status"].clone());
        seen.insert("reason".into(), body["reason"].clone());
        seen.insert(
            "details".into(),
            json!({
                "name": details["name"],
                "group": details["group"],
                "kind": details["kind"],
                "causes": causes,
            }),
        );
        body["message"]
            .as_str()
            .unwrap_or_default()
            .clone_into(&mut info);
    } else if let Some(items) = body["items"].as_array() {
        let mut names: Vec<&str> = items
            .iter()
            .map(|i| i["metadata"]["name"].as_str().unwrap_or_default())
            .collect();
        names.sort_unstable();
        seen.insert("kind".into(), body["kind"].clone());
        seen.insert("apiVersion".into(), body["apiVersion"].clone());
        seen.insert("items".into(), json!(names));
    } else {
        seen.insert("object".into(), normalized(body));
    }
    if !reply.warnings.is_empty() {
        seen.insert(
            "warnings".into(),
            json!(
                reply
                    .warnings
                    .iter()
                    .map(|w| warning_text(w))
                    .collect::<Vec<_>>()
            ),
        );
    }
    (Value::Object(seen), info)
}

/// A `Warning` header's text (`299 - "text"` → `text`).
fn warning_text(header: &str) -> String {
    let text = header.strip_prefix("299 - ").unwrap_or(header);
    let text = text.strip_prefix('"').unwrap_or(text);
    let text = text.strip_suffix('"').unwrap_or(text);
    text.replace("\\\"", "\"")
}

/// An object without what each server makes up on its own.
/// `managedFields` entries are ordered by operation (applies first), then by
/// time in seconds, then by manager: entries of one operation are compared
/// by manager and subresource only, as each server's steps take their own
/// time.
fn normalized(object: &Value) -> Value {
    let mut object = object.clone();
    if let Some(meta) = object.get_mut("metadata").and_then(Value::as_object_mut) {
        for field in ["uid", "resourceVersion", "creationTimestamp"] {
            meta.remove(field);
        }
        if let Some(entries) = meta.get_mut("managedFields").and_then(Value::as_array_mut) {
            for entry in entries.iter_mut() {
                if let Some(e) = entry.as_object_mut() {
                    e.remove("time");
                }
            }
            let key = |e: &Value| (e["manager"].to_string(), e["subresource"].to_string());
            for run in entries.chunk_by_mut(|a, b| a["operation"] == b["operation"]) {
                run.sort_by_key(key);
            }
        }
    }
    object
}

/// Paths where `a` and `b` differ (at most a few dozen), as text; a field that is absent is
/// told from one that is `null`.
fn differences(a: Option<&Value>, b: Option<&Value>, path: &str, out: &mut Vec<String>) {
    if out.len() > 40 {
        return;
    }
    let shown = |v: Option<&Value>| v.map_or_else(|| "(absent)".to_owned(), Value::to_string);
    match (a, b) {
        (Some(Value::Object(x)), Some(Value::Object(y))) => {
            let keys: BTreeSet<&String> = x.keys().chain(y.keys()).collect();
            for k in keys {
                differences(x.get(k), y.get(k), &format!("{path}.{k}"), out);
            }
        }
        (Some(Value::Array(x)), Some(Value::Array(y))) if x.len() == y.len() => {
            for (i, (p, q)) in x.iter().zip(y).enumerate() {
                differences(Some(p), Some(q), &format!("{path}[{i}]"), out);
            }
        }
        _ if a != b => out.push(format!("{path}: real {} / stand-in {}", shown(a), shown(b))),
        _ => {}
    }
}

/// Differences the stand-in keeps on purpose: (step, why). A difference
/// at such a step is reported but does not fail the test.
const KNOWN: &[(&str, &str)] = &[
    (
        "create a slice with a duplicate field, fieldValidation=Strict",
        "the stand-in parses bodies with serde_json, which keeps the last of duplicate keys; \
         nothing of the driver can send duplicates (its bodies are serialized from maps)",
    ),
    (
        "create a claim with a selector that does not compile",
        "the stand-in does not compile CEL (documented in sim/src/apiserver/mod.rs); the demo \
         and the tests send only compiling selectors, and the webhook is tested on the real \
         cluster",
    ),
];

/// The differences of two runs of one scenario, one line group each.
fn compare_runs(real: &[Step], stand_in: &[Step]) -> (Vec<String>, Vec<String>) {
    let mut failing = Vec::new();
    let mut known = Vec::new();
    for i in 0..real.len().max(stand_in.len()) {
        let (Some(r), Some(s)) = (real.get(i), stand_in.get(i)) else {
            failing.push(format!(
                "step {i}: only one server ran it ({:?} / {:?})",
                real.get(i).map(|s| &s.what),
                stand_in.get(i).map(|s| &s.what)
            ));
            continue;
        };
        if r.seen == s.seen {
            continue;
        }
        let mut paths = Vec::new();
        differences(Some(&r.seen), Some(&s.seen), "", &mut paths);
        let text = format!(
            "step {i} `{}`:\n    {}\n    real message: {}\n    stand-in message: {}",
            r.what,
            paths.join("\n    "),
            r.info,
            s.info
        );
        match KNOWN.iter().find(|(step, _)| *step == r.what) {
            Some((_, why)) => known.push(format!("{text}\n    kept: {why}")),
            None => failing.push(text),
        }
    }
    (failing, known)
}

type Scenario = for<'a> fn(&'a Side) -> Pin<Box<dyn Future<Output = Vec<Step>> + 'a>>;

/// Runs `scenario` on the real server (namespace `ns`) and on a fresh
/// stand-in, and fails with every difference.
fn compare(c: &Cluster, ns: &str, scenario: Scenario, opts: ServerOptions) -> Result<(), Failed> {
    let label = format!("{LABEL}={ns}");
    let cleanup = || {
        c.kubectl(&[
            "delete",
            "resourceslices,deviceclasses",
            "-l",
            &label,
            "--ignore-not-found",
            "--wait=true",
        ])
    };
    cleanup()?;
    c.fresh_namespace(ns)?;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .map_err(|e| format!("tokio runtime: {e}"))?;
    let now = jiff::Timestamp::now()
        .strftime("%Y-%m-%dT%H:%M:%S.000000Z")
        .to_string();
    let result = runtime.block_on(async {
        let real = Side {
            client: c.client().await?,
            ns: ns.to_owned(),
            now: now.clone(),
        };
        let server = TestApiServer::start(opts)
            .await
            .map_err(|e| format!("starting the stand-in: {e}"))?;
        let config = kube::Config::new(server.url().parse().map_err(|e| format!("url: {e}"))?);
        let stand_in = Side {
            client: kube::Client::try_from(config).map_err(|e| format!("client: {e}"))?,
            ns: ns.to_owned(),
            now,
        };
        let real_steps = scenario(&real).await;
        let stand_in_steps = scenario(&stand_in).await;
        server
            .shutdown()
            .await
            .map_err(|e| format!("stopping the stand-in: {e}"))?;
        Ok::<_, Failed>((real_steps, stand_in_steps))
    });
    let cleaned = cleanup();
    let _ = c.kubectl(&["delete", "namespace", ns, "--wait=false"]);
    let (real_steps, stand_in_steps) = result?;
    cleaned?;
    if real_steps.len() < 5 {
        return Err(format!("the scenario ran only {} steps", real_steps.len()).into());
    }
    let (failing, known) = compare_runs(&real_steps, &stand_in_steps);
    eprintln!(
        "{ns}: {} steps on each server, {} differences, {} kept",
        real_steps.len(),
        failing.len(),
        known.len()
    );
    for k in &known {
        eprintln!("kept difference: {k}");
    }
    if failing.is_empty() {
        Ok(())
    } else {
        Err(format!(
            "the stand-in differs from the real API server in {} of {} steps:\n{}",
            failing.len(),
            real_steps.len(),
            failing.join("\n")
        )
        .into())
    }
}

// ---------------------------------------------------------------- objects

const SLICES: &str = "/apis/resource.k8s.io/v1/resourceslices";

fn claims_path(ns: &str) -> String {
    format!("/apis/resource.k8s.io/v1/namespaces/{ns}/resourceclaims")
}

fn leases_path(ns: &str) -> String {
    format!("/apis/coordination.k8s.io/v1/namespaces/{ns}/leases")
}

fn events_path(ns: &str) -> String {
    format!("/apis/events.k8s.io/v1/namespaces/{ns}/events")
}

fn device(name: &str, version: &str) -> Value {
    json!({
        "name": name,
        "attributes": {
            "type": {"string": "gpu"},
            "index": {"int": 0},
            "driverVersion": {"version": version},
            "productName": {"string": "NVIDIA A100-SXM4-80GB"}
        },
        "capacity": {"memory": {"value": "80Gi"}}
    })
}

/// A slice named `e2e-apiserver-<name>` of node `node` with `devices`,
/// labelled for scenario `scenario`.
fn slice(scenario: &str, name: &str, node: &str, generation: i64, devices: &[Value]) -> Value {
    json!({
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceSlice",
        "metadata": {"name": format!("e2e-apiserver-{name}"), "labels": {LABEL: scenario}},
        "spec": {
            "driver": DRIVER,
            "pool": {"name": node, "generation": generation, "resourceSliceCount": 1},
            "nodeName": node,
            "devices": devices,
        }
    })
}

fn bytes(v: &Value) -> Vec<u8> {
    serde_json::to_vec(v).expect("JSON values serialize")
}

/// The kube client's request builder of `path`.
fn at(path: &str) -> Request {
    Request::new(path)
}

// ---------------------------------------------------------------- slices

fn slices_test(c: &Cluster) -> Result<(), Failed> {
    compare(
        c,
        "e2e-apiserver-slices",
        |s| Box::pin(slices(s)),
        ServerOptions::default(),
    )
}

async fn slices(s: &Side) -> Vec<Step> {
    let sc = &s.ns;
    let mut run = Run::new(s);
    let pp = PostParams::default();
    let s1 = slice(sc, "s1", NODE_A, 1, &[device("gpu-0", "580.95.5")]);
    let name1 = "e2e-apiserver-s1";
    let created = run
        .send("create s1", at(SLICES).create(&pp, bytes(&s1)))
        .await;
    run.send("create s1 again", at(SLICES).create(&pp, bytes(&s1)))
        .await;
    run.send("get s1", at(SLICES).get(name1, &GetParams::default()))
        .await;
    let mut s1b = slice(
        sc,
        "s1",
        NODE_A,
        2,
        &[device("gpu-0", "580.95.5"), device("gpu-1", "580.95.5")],
    );
    s1b["metadata"]["resourceVersion"] = json!(created.rv());
    run.send(
        "update s1 at its resourceVersion",
        at(SLICES).replace(name1, &pp, bytes(&s1b)),
    )
    .await;
    run.send(
        "update s1 at a stale resourceVersion",
        at(SLICES).replace(name1, &pp, bytes(&s1b)),
    )
    .await;
    let mut s1c = slice(sc, "s1", NODE_A, 3, &[device("gpu-0", "580.95.5")]);
    run.send(
        "update s1 without resourceVersion",
        at(SLICES).replace(name1, &pp, bytes(&s1c)),
    )
    .await;
    s1c["spec"]["driver"] = json!("other.e2e.example.com");
    run.send(
        "update s1's immutable driver",
        at(SLICES).replace(name1, &pp, bytes(&s1c)),
    )
    .await;
    run.send(
        "merge-patch s1's labels",
        at(SLICES).patch(
            name1,
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"labels": {"extra": "yes"}}})),
        ),
    )
    .await;

    // Server-side apply as the plugin publishes (its field manager, forced).
    let plugin = PatchParams::apply("gpu-kubelet-plugin").force();
    let name2 = "e2e-apiserver-s2";
    let s2 = slice(sc, "s2", NODE_B, 1, &[device("gpu-0", "580.95.5")]);
    run.send(
        "apply s2 (creates it)",
        at(SLICES).patch(name2, &plugin, &Patch::Apply(&s2)),
    )
    .await;
    run.send(
        "apply s2 unchanged",
        at(SLICES).patch(name2, &plugin, &Patch::Apply(&s2)),
    )
    .await;
    let s2b = slice(
        sc,
        "s2",
        NODE_B,
        2,
        &[device("gpu-0", "580.95.5"), device("gpu-1", "580.95.5")],
    );
    run.send(
        "apply s2 with a second device",
        at(SLICES).patch(name2, &plugin, &Patch::Apply(&s2b)),
    )
    .await;
    let s2c = slice(sc, "s2", NODE_B, 3, &[device("gpu-0", "590.1.2")]);
    run.send(
        "apply s2 by another manager without force",
        at(SLICES).patch(name2, &PatchParams::apply("other"), &Patch::Apply(&s2c)),
    )
    .await;
    run.send(
        "apply s2 by another manager with force",
        at(SLICES).patch(
            name2,
            &PatchParams::apply("other").force(),
            &Patch::Apply(&s2c),
        ),
    )
    .await;
    let mut s2d = s2b.clone();
    s2d["spec"]["pool"]["generation"] = json!(4);
    s2d["metadata"]["labels"]["owner"] = json!("plugin");
    run.send(
        "apply s2 again by the plugin",
        at(SLICES).patch(name2, &plugin, &Patch::Apply(&s2d)),
    )
    .await;
    run.send(
        "apply without a field manager",
        at(SLICES).patch(name2, &PatchParams::default(), &Patch::Apply(&s2d)),
    )
    .await;
    let s3 = slice(sc, "s3", NODE_B, 1, &[device("gpu-7", "580.95.5")]);
    run.send(
        "apply s3 under another name than the URL's",
        at(SLICES).patch("e2e-apiserver-s4", &plugin, &Patch::Apply(&s3)),
    )
    .await;

    // DeviceClasses as the demo creates them.
    let classes = "/apis/resource.k8s.io/v1/deviceclasses";
    let class = json!({
        "apiVersion": "resource.k8s.io/v1",
        "kind": "DeviceClass",
        "metadata": {"name": "e2e-apiserver-class", "labels": {LABEL: sc}},
        "spec": {"selectors": [{"cel": {"expression": format!("device.driver == '{DRIVER}'")}}]}
    });
    run.send("create a class", at(classes).create(&pp, bytes(&class)))
        .await;
    let mut class2 = class.clone();
    class2["spec"]["selectors"] = json!([]);
    class2["spec"]["extendedResourceName"] = json!("example.com/gpu");
    run.send(
        "update the class without resourceVersion",
        at(classes).replace("e2e-apiserver-class", &pp, bytes(&class2)),
    )
    .await;
    run.send(
        "delete the class",
        at(classes).delete("e2e-apiserver-class", &DeleteParams::default()),
    )
    .await;

    // Lists as the plugin and the controller make them.
    let label = format!("{LABEL}={sc}");
    for (what, fields) in [
        ("list by node", format!("spec.nodeName={NODE_A}")),
        (
            "list by driver and node",
            format!("spec.driver={DRIVER},spec.nodeName={NODE_B}"),
        ),
        ("list by pool", format!("spec.pool.name={NODE_B}")),
        ("list by a field not supported", "spec.foo=x".to_owned()),
        ("list by name", format!("metadata.name={name2}")),
    ] {
        run.send(
            what,
            at(SLICES).list(&ListParams::default().labels(&label).fields(&fields)),
        )
        .await;
    }
    run.send(
        "list by label",
        at(SLICES).list(&ListParams::default().labels(&format!("{label},extra=yes"))),
    )
    .await;
    run.send(
        "list by a bad label selector",
        at(SLICES).list(&ListParams::default().labels("a b c")),
    )
    .await;

    // Deletes as the controller's GC makes them (UID precondition).
    let with_uid = |uid: &str| DeleteParams {
        preconditions: Some(Preconditions {
            uid: Some(uid.to_owned()),
            resource_version: None,
        }),
        ..DeleteParams::default()
    };
    run.send(
        "delete s1 with a wrong UID",
        at(SLICES).delete(name1, &with_uid("7d6e1c1e-0000-4000-8000-000000000000")),
    )
    .await;
    let current = run
        .send(
            "get s1 before deleting",
            at(SLICES).get(name1, &GetParams::default()),
        )
        .await;
    run.send(
        "delete s1 with its UID",
        at(SLICES).delete(name1, &with_uid(&current.uid())),
    )
    .await;
    run.send(
        "get s1 deleted",
        at(SLICES).get(name1, &GetParams::default()),
    )
    .await;
    run.send(
        "delete s1 again",
        at(SLICES).delete(name1, &DeleteParams::default()),
    )
    .await;
    let stale = DeleteParams {
        preconditions: Some(Preconditions {
            uid: None,
            resource_version: Some("1".into()),
        }),
        ..DeleteParams::default()
    };
    run.send(
        "delete s2 at a stale resourceVersion",
        at(SLICES).delete(name2, &stale),
    )
    .await;
    run.send(
        "delete s2",
        at(SLICES).delete(name2, &DeleteParams::default()),
    )
    .await;
    run.steps
}

// ---------------------------------------------------------------- claims

fn claims_test(c: &Cluster) -> Result<(), Failed> {
    compare(
        c,
        "e2e-apiserver-claims",
        |s| Box::pin(claims(s)),
        ServerOptions::default(),
    )
}

fn claim(ns: &str, name: &str) -> Value {
    json!({
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": name, "namespace": ns},
        "spec": {"devices": {"requests": [
            {"name": "gpu", "exactly": {"deviceClassName": "gpu.nvidia.com", "count": 2}}
        ]}}
    })
}

/// The plugin's `status.devices` apply body (driver/src/prepare/status.rs).
fn status_body(ns: &str, name: &str, uid: &str, pool: &str, device: &str, now: &str) -> Value {
    json!({
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": name, "namespace": ns, "uid": uid},
        "status": {"devices": [{
            "driver": DRIVER,
            "pool": pool,
            "device": device,
            "conditions": [{
                "type": "Ready",
                "status": "True",
                "reason": "Prepared",
                "message": "prepared by the kubelet plugin",
                "lastTransitionTime": now,
            }],
            "data": {"uuid": "GPU-0fd630f1-f29d-4da9-953f-48f1a09f76b5", "cdiDeviceIDs": ["k8s.gpu.nvidia.com/claim=x-gpu-0"]},
        }]}
    })
}

async fn claims(s: &Side) -> Vec<Step> {
    let ns = &s.ns;
    let path = claims_path(ns);
    let mut run = Run::new(s);
    let pp = PostParams::default();
    let name = "e2e-claim";
    let created = run
        .send(
            "create claim",
            at(&path).create(&pp, bytes(&claim(ns, name))),
        )
        .await;
    let uid = created.uid();
    let now = s
        .now
        .trim_end_matches('Z')
        .split('.')
        .next()
        .unwrap_or_default()
        .to_owned()
        + "Z";
    run.send(
        "apply status.devices before any allocation",
        at(&path).patch_subresource(
            "status",
            name,
            &PatchParams::apply(&format!("{DRIVER}/{NODE_A}")).force(),
            &Patch::Apply(status_body(ns, name, &uid, NODE_A, "gpu-0", &now)),
        ),
    )
    .await;
    // The demo writes the allocation with a merge patch of the status.
    let allocation = json!({"status": {"allocation": {
        "devices": {"results": [
            {"request": "gpu", "driver": DRIVER, "pool": NODE_A, "device": "gpu-0", "shareID": null, "consumedCapacity": {}},
            {"request": "gpu", "driver": DRIVER, "pool": NODE_B, "device": "gpu-1", "shareID": null, "consumedCapacity": {}}
        ]},
        "nodeSelector": {"nodeSelectorTerms": [{"matchFields": [
            {"key": "metadata.name", "operator": "In", "values": [NODE_A]}
        ]}]}
    }}});
    run.send(
        "merge-patch the allocation into the status",
        at(&path).patch_subresource(
            "status",
            name,
            &PatchParams::default(),
            &Patch::Merge(&allocation),
        ),
    )
    .await;
    let mut other = allocation.clone();
    other["status"]["allocation"]["devices"]["results"][0]["device"] = json!("gpu-5");
    run.send(
        "merge-patch another allocation",
        at(&path).patch_subresource(
            "status",
            name,
            &PatchParams::default(),
            &Patch::Merge(&other),
        ),
    )
    .await;
    // The plugin of each node applies its entries under its own manager.
    let manager_a = PatchParams::apply(&format!("{DRIVER}/{NODE_A}")).force();
    let manager_b = PatchParams::apply(&format!("{DRIVER}/{NODE_B}")).force();
    run.send(
        "apply status.devices of node a",
        at(&path).patch_subresource(
            "status",
            name,
            &manager_a,
            &Patch::Apply(status_body(ns, name, &uid, NODE_A, "gpu-0", &now)),
        ),
    )
    .await;
    run.send(
        "apply status.devices of node b",
        at(&path).patch_subresource(
            "status",
            name,
            &manager_b,
            &Patch::Apply(status_body(ns, name, &uid, NODE_B, "gpu-1", &now)),
        ),
    )
    .await;
    run.send(
        "apply node a's entries again",
        at(&path).patch_subresource(
            "status",
            name,
            &manager_a,
            &Patch::Apply(status_body(ns, name, &uid, NODE_A, "gpu-0", &now)),
        ),
    )
    .await;
    run.send(
        "apply an entry of a device not allocated",
        at(&path).patch_subresource(
            "status",
            name,
            &manager_a,
            &Patch::Apply(status_body(ns, name, &uid, NODE_A, "gpu-3", &now)),
        ),
    )
    .await;
    run.send(
        "apply with another UID",
        at(&path).patch_subresource(
            "status",
            name,
            &manager_a,
            &Patch::Apply(status_body(
                ns,
                name,
                "0b7e5a52-1111-4222-8333-444455556666",
                NODE_A,
                "gpu-0",
                &now,
            )),
        ),
    )
    .await;
    let mut bad_condition = status_body(ns, name, &uid, NODE_A, "gpu-0", &now);
    bad_condition["status"]["devices"][0]["conditions"][0]["status"] = json!("Maybe");
    run.send(
        "apply a condition with a bad status",
        at(&path).patch_subresource("status", name, &manager_a, &Patch::Apply(&bad_condition)),
    )
    .await;
    // The plugin's clear: read, drop its entries, write back at the read version.
    let read = run
        .send("get the claim", at(&path).get(name, &GetParams::default()))
        .await;
    let mut cleared = read.body.clone();
    if let Some(devices) = cleared
        .pointer_mut("/status/devices")
        .and_then(Value::as_array_mut)
    {
        devices.retain(|d| d["pool"] != NODE_A);
    }
    run.send(
        "replace the status without node a's entries",
        at(&path).replace_subresource("status", name, &pp, bytes(&cleared)),
    )
    .await;
    run.send(
        "replace the status at the stale version",
        at(&path).replace_subresource("status", name, &pp, bytes(&cleared)),
    )
    .await;
    let mut other_uid = cleared.clone();
    other_uid["metadata"]["uid"] = json!("0b7e5a52-1111-4222-8333-444455556666");
    other_uid["metadata"]
        .as_object_mut()
        .map(|m| m.remove("resourceVersion"));
    run.send(
        "replace the status naming another UID",
        at(&path).replace_subresource("status", name, &pp, bytes(&other_uid)),
    )
    .await;
    // The main resource: status is ignored there, the spec is immutable.
    run.send(
        "merge-patch the status through the main resource",
        at(&path).patch(
            name,
            &PatchParams::default(),
            &Patch::Merge(json!({"status": {"devices": null}, "metadata": {"labels": {"a": "b"}}})),
        ),
    )
    .await;
    run.send(
        "merge-patch the spec",
        at(&path).patch(
            name,
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"devices": {"requests": [
                {"name": "gpu", "exactly": {"deviceClassName": "gpu.nvidia.com", "count": 3}}
            ]}}})),
        ),
    )
    .await;
    run.send(
        "apply the status of a claim that does not exist",
        at(&path).patch_subresource(
            "status",
            "e2e-no-such-claim",
            &manager_a,
            &Patch::Apply(status_body(
                ns,
                "e2e-no-such-claim",
                &uid,
                NODE_A,
                "gpu-0",
                &now,
            )),
        ),
    )
    .await;
    run.send(
        "get the claim's status",
        at(&path).get_subresource("status", name),
    )
    .await;
    run.send(
        "delete the claim",
        at(&path).delete(name, &DeleteParams::default()),
    )
    .await;
    run.send(
        "get the deleted claim",
        at(&path).get(name, &GetParams::default()),
    )
    .await;
    run.steps
}

// ---------------------------------------------------------------- watches

fn watches_test(c: &Cluster) -> Result<(), Failed> {
    lease_history_passed(c)?;
    compare(
        c,
        "e2e-apiserver-watch",
        |s| Box::pin(watches(s)),
        // A short history: the real watch cache keeps a window of a few
        // hundred events; 16 are passed by the scenario below.
        ServerOptions {
            history_limit: 16,
            ..ServerOptions::default()
        },
    )
}

/// Waits until the real server's Lease watch window has moved past
/// resourceVersion 1 (the control plane renews its Leases every few
/// seconds; on a cluster up for a minute or two this holds at once).
fn lease_history_passed(c: &Cluster) -> Result<(), Failed> {
    let path = "/apis/coordination.k8s.io/v1/leases?watch=1&resourceVersion=1&timeoutSeconds=1";
    let start = std::time::Instant::now();
    loop {
        let out = c.kubectl(&["get", "--raw", path])?;
        if out.contains("\"code\":410") {
            return Ok(());
        }
        if start.elapsed() > Duration::from_secs(300) {
            return Err(format!(
                "the real server still replays Leases from resourceVersion 1 after 5 min:\n{}",
                out.chars().take(500).collect::<String>()
            )
            .into());
        }
        std::thread::sleep(Duration::from_secs(5));
    }
}

async fn watches(s: &Side) -> Vec<Step> {
    let sc = &s.ns;
    let mut run = Run::new(s);
    let pp = PostParams::default();
    let label = format!("{LABEL}={sc}");
    // Writes before the scenario, so that resourceVersion 1 is history.
    let filler = slice(sc, "w-filler", NODE_A, 1, &[device("gpu-0", "580.95.5")]);
    let first = call(
        &s.client,
        at(SLICES).create(&pp, bytes(&filler)).expect("request"),
    )
    .await;
    run.note("create the filler slice", json!(first.code));
    for i in 0..20 {
        let patch = json!({"metadata": {"annotations": {"round": i.to_string()}}});
        let r = call(
            &s.client,
            at(SLICES)
                .patch(
                    "e2e-apiserver-w-filler",
                    &PatchParams::default(),
                    &Patch::Merge(&patch),
                )
                .expect("request"),
        )
        .await;
        if r.code != 200 {
            run.note(&format!("filler write {i}"), json!(r.code));
        }
    }
    let w1 = slice(sc, "w1", NODE_A, 1, &[device("gpu-0", "580.95.5")]);
    let created = run
        .send("create w1", at(SLICES).create(&pp, bytes(&w1)))
        .await;
    let rv_a = created.rv();
    let mut w1b = slice(sc, "w1", NODE_A, 2, &[device("gpu-1", "580.95.5")]);
    w1b["metadata"]["resourceVersion"] = json!(rv_a);
    run.send(
        "update w1",
        at(SLICES).replace("e2e-apiserver-w1", &pp, bytes(&w1b)),
    )
    .await;
    let w2 = slice(sc, "w2", NODE_B, 1, &[device("gpu-0", "580.95.5")]);
    let created2 = run
        .send("create w2", at(SLICES).create(&pp, bytes(&w2)))
        .await;
    let rv_c = created2.rv();
    run.send(
        "delete w1",
        at(SLICES).delete("e2e-apiserver-w1", &DeleteParams::default()),
    )
    .await;
    // Without bookmarks: when the real server sends one is a matter of timing.
    let wp = WatchParams::default()
        .labels(&label)
        .timeout(2)
        .disable_bookmarks();
    run.watch("watch from w1's creation", at(SLICES).watch(&wp, &rv_a))
        .await;
    run.watch("watch from w2's creation", at(SLICES).watch(&wp, &rv_c))
        .await;
    run.watch(
        "watch from w2's creation, by node",
        at(SLICES).watch(
            &WatchParams::default()
                .labels(&label)
                .fields(&format!("spec.nodeName={NODE_B}"))
                .timeout(2)
                .disable_bookmarks(),
            &rv_a,
        ),
    )
    .await;
    run.watch("watch from 0", at(SLICES).watch(&wp, "0")).await;
    // Resource version 1 is older than the real server's watch window for Leases (renewed
    // every few seconds by the control plane) and than the stand-in's (16 events here).
    run.watch(
        "watch leases from resourceVersion 1",
        at(&leases_path(sc)).watch(&WatchParams::default().timeout(2).disable_bookmarks(), "1"),
    )
    .await;
    run.watch(
        "watch from a resourceVersion that is not a number",
        at(SLICES).watch(&wp, "abc"),
    )
    .await;
    run.send(
        "metadata-only list",
        at(SLICES).list_metadata(&ListParams::default().labels(&label)),
    )
    .await;
    run.send(
        "delete w2",
        at(SLICES).delete("e2e-apiserver-w2", &DeleteParams::default()),
    )
    .await;
    run.send(
        "delete the filler",
        at(SLICES).delete("e2e-apiserver-w-filler", &DeleteParams::default()),
    )
    .await;
    run.steps
}

// ---------------------------------------------------------------- leases, events

fn leases_events_test(c: &Cluster) -> Result<(), Failed> {
    compare(
        c,
        "e2e-apiserver-leases",
        |s| Box::pin(leases_events(s)),
        ServerOptions::default(),
    )
}

fn lease(ns: &str, holder: Option<&str>, duration: i64, transitions: i64, now: &str) -> Value {
    json!({
        "apiVersion": "coordination.k8s.io/v1",
        "kind": "Lease",
        "metadata": {"name": "gpu-dra-controller", "namespace": ns},
        "spec": {
            "holderIdentity": holder,
            "leaseDurationSeconds": duration,
            "acquireTime": now,
            "renewTime": now,
            "leaseTransitions": transitions,
        }
    })
}

/// The Event the controller records on a claim (controller/src/lifecycle/events.rs).
fn event(ns: &str, name: &str, now: &str) -> Value {
    json!({
        "apiVersion": "events.k8s.io/v1",
        "kind": "Event",
        "metadata": {"name": name, "namespace": ns},
        "eventTime": now,
        "type": "Warning",
        "reason": "Unallocatable",
        "action": "SimulateAllocation",
        "note": "no node can allocate the claim",
        "regarding": {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceClaim",
            "name": "e2e-claim",
            "namespace": ns,
            "uid": "0b7e5a52-1111-4222-8333-444455556666",
        },
        "reportingController": "gpu.nvidia.com/controller",
        "reportingInstance": "gpu-dra-controller-0",
    })
}

async fn leases_events(s: &Side) -> Vec<Step> {
    let ns = &s.ns;
    let now = &s.now;
    let mut run = Run::new(s);
    let pp = PostParams::default();
    let path = leases_path(ns);
    let name = "gpu-dra-controller";
    let created = run
        .send(
            "create the lease",
            at(&path).create(&pp, bytes(&lease(ns, Some("replica-a"), 15, 0, now))),
        )
        .await;
    run.send(
        "create the lease again",
        at(&path).create(&pp, bytes(&lease(ns, Some("replica-b"), 15, 0, now))),
    )
    .await;
    let mut renewed = lease(ns, Some("replica-a"), 15, 0, now);
    renewed["metadata"]["resourceVersion"] = json!(created.rv());
    run.send(
        "renew at the read version",
        at(&path).replace(name, &pp, bytes(&renewed)),
    )
    .await;
    let mut taken = lease(ns, Some("replica-b"), 15, 1, now);
    taken["metadata"]["resourceVersion"] = json!(created.rv());
    run.send(
        "take over at a stale version",
        at(&path).replace(name, &pp, bytes(&taken)),
    )
    .await;
    let current = run
        .send("get the lease", at(&path).get(name, &GetParams::default()))
        .await;
    let mut released = lease(ns, None, 1, 0, now);
    released["metadata"]["resourceVersion"] = json!(current.rv());
    run.send(
        "release the lease",
        at(&path).replace(name, &pp, bytes(&released)),
    )
    .await;
    let mut zero = lease(ns, Some("replica-a"), 0, 0, now);
    zero["metadata"]["name"] = json!("zero");
    run.send("create a lease of 0 s", at(&path).create(&pp, bytes(&zero)))
        .await;
    let mut negative = lease(ns, Some("replica-a"), 15, -1, now);
    negative["metadata"]["name"] = json!("negative");
    run.send(
        "create a lease with negative transitions",
        at(&path).create(&pp, bytes(&negative)),
    )
    .await;
    run.send(
        "delete the lease",
        at(&path).delete(name, &DeleteParams::default()),
    )
    .await;
    run.send(
        "get the deleted lease",
        at(&path).get(name, &GetParams::default()),
    )
    .await;

    let path = events_path(ns);
    let e1 = event(ns, "e2e-claim.18a0000000000001", now);
    run.send("create an event", at(&path).create(&pp, bytes(&e1)))
        .await;
    run.send("create it again", at(&path).create(&pp, bytes(&e1)))
        .await;
    for (what, fields) in [
        (
            "list events by regarding.uid",
            "regarding.uid=0b7e5a52-1111-4222-8333-444455556666",
        ),
        (
            "list events by another regarding.uid",
            "regarding.uid=00000000-0000-4000-8000-000000000000",
        ),
        (
            "list events by reporting controller and reason",
            "reportingController=gpu.nvidia.com/controller,reason=Unallocatable",
        ),
        ("list events by an unknown field", "regarding.foo=x"),
    ] {
        run.send(what, at(&path).list(&ListParams::default().fields(fields)))
            .await;
    }
    let mut changed = e1.clone();
    changed["note"] = json!("another note");
    run.send(
        "replace the event with another note",
        at(&path).replace("e2e-claim.18a0000000000001", &pp, bytes(&changed)),
    )
    .await;
    let invalid: [(&str, Change); 7] = [
        ("without eventTime", |e| {
            e.as_object_mut().map(|o| o.remove("eventTime"));
        }),
        ("of type Bad", |e| e["type"] = json!("Bad")),
        ("without reportingController", |e| {
            e.as_object_mut().map(|o| o.remove("reportingController"));
        }),
        ("without reportingInstance", |e| {
            e.as_object_mut().map(|o| o.remove("reportingInstance"));
        }),
        ("without action", |e| {
            e.as_object_mut().map(|o| o.remove("action"));
        }),
        ("with a note over 1 kB", |e| {
            e["note"] = json!("x".repeat(1025));
        }),
        ("regarding another namespace", |e| {
            e["regarding"]["namespace"] = json!("elsewhere");
        }),
    ];
    for (i, (what, change)) in invalid.iter().enumerate() {
        let mut e = event(ns, &format!("e2e-claim.18a00000000001{i:02}"), now);
        change(&mut e);
        run.send(
            &format!("create an event {what}"),
            at(&path).create(&pp, bytes(&e)),
        )
        .await;
    }
    run.send(
        "delete the event",
        at(&path).delete("e2e-claim.18a0000000000001", &DeleteParams::default()),
    )
    .await;
    run.steps
}

// ---------------------------------------------------------------- invalid objects

fn invalid_test(c: &Cluster) -> Result<(), Failed> {
    compare(
        c,
        "e2e-apiserver-invalid",
        |s| Box::pin(invalid(s)),
        ServerOptions::default(),
    )
}

/// A slice change for the invalid-object cases.
type Change = fn(&mut Value);

async fn invalid(s: &Side) -> Vec<Step> {
    let sc = &s.ns;
    let mut run = Run::new(s);
    let pp = PostParams::default();
    let base = || slice(sc, "bad", NODE_A, 1, &[device("gpu-0", "580.95.5")]);
    let slice_cases: Vec<(&str, Change)> = vec![
        ("a name with capitals and _", |v| {
            v["metadata"]["name"] = json!("E2E_apiserver-bad");
        }),
        ("a device with 33 attributes", |v| {
            let attrs: serde_json::Map<String, Value> = (0..33)
                .map(|i| (format!("a{i}"), json!({"int": i})))
                .collect();
            v["spec"]["devices"][0]["attributes"] = Value::Object(attrs);
            v["spec"]["devices"][0]
                .as_object_mut()
                .map(|d| d.remove("capacity"));
        }),
        ("attributes and capacity over 32", |v| {
            let attrs: serde_json::Map<String, Value> = (0..31)
                .map(|i| (format!("a{i}"), json!({"int": i})))
                .collect();
            v["spec"]["devices"][0]["attributes"] = Value::Object(attrs);
            v["spec"]["devices"][0]["capacity"] =
                json!({"memory": {"value": "1Gi"}, "cores": {"value": "2"}});
        }),
        ("no driver", |v| {
            v["spec"].as_object_mut().map(|o| o.remove("driver"));
        }),
        ("no pool name", |v| {
            v["spec"]["pool"].as_object_mut().map(|o| o.remove("name"));
        }),
        ("a resourceSliceCount of 0", |v| {
            v["spec"]["pool"]["resourceSliceCount"] = json!(0);
        }),
        ("no node selection", |v| {
            v["spec"].as_object_mut().map(|o| o.remove("nodeName"));
        }),
        ("nodeName and allNodes", |v| {
            v["spec"]["allNodes"] = json!(true);
        }),
        ("an invalid device name", |v| {
            v["spec"]["devices"][0]["name"] = json!("GPU_0");
        }),
        ("duplicate device names", |v| {
            let d = v["spec"]["devices"][0].clone();
            v["spec"]["devices"] = json!([d.clone(), d]);
        }),
        ("129 devices", |v| {
            let devices: Vec<Value> = (0..129)
                .map(|i| json!({"name": format!("gpu-{i}")}))
                .collect();
            v["spec"]["devices"] = json!(devices);
        }),
        ("a string attribute of 65 characters", |v| {
            v["spec"]["devices"][0]["attributes"]["productName"] =
                json!({"string": "x".repeat(65)});
        }),
        ("an attribute with two values", |v| {
            v["spec"]["devices"][0]["attributes"]["type"] = json!({"string": "gpu", "int": 1});
        }),
        ("an attribute with no value", |v| {
            v["spec"]["devices"][0]["attributes"]["type"] = json!({});
        }),
        ("an invalid attribute name", |v| {
            v["spec"]["devices"][0]["attributes"]["bad name"] = json!({"int": 1});
        }),
        ("an invalid version", |v| {
            v["spec"]["devices"][0]["attributes"]["driverVersion"] =
                json!({"version": "580.95.05"});
        }),
        ("a capacity that is no quantity", |v| {
            v["spec"]["devices"][0]["capacity"]["memory"]["value"] = json!("lots");
        }),
        ("a generation that is a string", |v| {
            v["spec"]["pool"]["generation"] = json!("one");
        }),
        ("a negative generation", |v| {
            v["spec"]["pool"]["generation"] = json!(-1);
        }),
        ("an invalid driver name", |v| {
            v["spec"]["driver"] = json!("Not A Driver");
        }),
        ("a taint with a bad effect", |v| {
            v["spec"]["devices"][0]["taints"] =
                json!([{"key": "k", "value": "v", "effect": "Sometimes"}]);
        }),
        ("a counter set next to devices", |v| {
            v["spec"]["sharedCounters"] =
                json!([{"name": "gpu-0-counters", "counters": {"memory": {"value": "80Gi"}}}]);
        }),
        ("a consumption of an unknown counter set", |v| {
            v["spec"]["devices"][0]["consumesCounters"] =
                json!([{"counterSet": "nowhere", "counters": {"memory": {"value": "1Gi"}}}]);
        }),
    ];
    for (what, change) in slice_cases {
        let mut v = base();
        change(&mut v);
        let r = run
            .send(
                &format!("create a slice with {what}"),
                at(SLICES).create(&pp, bytes(&v)),
            )
            .await;
        if r.code < 300 {
            let name = v["metadata"]["name"]
                .as_str()
                .unwrap_or_default()
                .to_owned();
            let _ = call(
                &s.client,
                at(SLICES)
                    .delete(&name, &DeleteParams::default())
                    .expect("request"),
            )
            .await;
        }
    }

    // Unknown fields, under each field validation level.
    let mut unknown = base();
    unknown["spec"]["unknownField"] = json!("x");
    unknown["spec"]["devices"][0]["alsoUnknown"] = json!(1);
    for (i, level) in ["", "Ignore", "Warn", "Strict"].into_iter().enumerate() {
        let mut v = unknown.clone();
        let name = format!("e2e-apiserver-unknown-{i}");
        v["metadata"]["name"] = json!(name);
        let query = if level.is_empty() {
            String::new()
        } else {
            format!("fieldValidation={level}")
        };
        let what = format!("create a slice with unknown fields, fieldValidation={level:?}");
        let request = at(SLICES).create(&pp, bytes(&v));
        let r = if query.is_empty() {
            run.send(&what, request).await
        } else {
            run.send_with(&what, request, &query).await
        };
        if r.code < 300 {
            let _ = call(
                &s.client,
                at(SLICES)
                    .delete(&name, &DeleteParams::default())
                    .expect("request"),
            )
            .await;
        }
    }
    let mut dup = serde_json::to_string(&base()).expect("JSON");
    dup = dup.replacen("\"driver\":", "\"driver\":\"x.example.com\",\"driver\":", 1);
    run.send_with(
        "create a slice with a duplicate field, fieldValidation=Strict",
        at(SLICES).create(&pp, dup.into_bytes()),
        "fieldValidation=Strict",
    )
    .await;
    let applied = {
        let mut v = unknown.clone();
        v["metadata"]["name"] = json!("e2e-apiserver-unknown-apply");
        v
    };
    let plugin = PatchParams::apply("gpu-kubelet-plugin").force();
    let r = run
        .send(
            "apply a slice with unknown fields",
            at(SLICES).patch(
                "e2e-apiserver-unknown-apply",
                &plugin,
                &Patch::Apply(&applied),
            ),
        )
        .await;
    if r.code < 300 {
        let _ = call(
            &s.client,
            at(SLICES)
                .delete("e2e-apiserver-unknown-apply", &DeleteParams::default())
                .expect("request"),
        )
        .await;
    }
    run.send(
        "create a slice of kind Pod",
        at(SLICES).create(
            &pp,
            bytes(&{
                let mut v = base();
                v["kind"] = json!("Pod");
                v
            }),
        ),
    )
    .await;
    run.send(
        "create a slice that is not JSON",
        at(SLICES).create(&pp, b"{not json".to_vec()),
    )
    .await;

    // Claims as the demo creates them, broken in one place each.
    let path = claims_path(sc);
    let claim_cases: Vec<(&str, Change)> = vec![
        ("a request name with capitals", |v| {
            v["spec"]["devices"]["requests"][0]["name"] = json!("GPU");
        }),
        ("count 0", |v| {
            v["spec"]["devices"]["requests"][0]["exactly"]["count"] = json!(0);
        }),
        ("no device class", |v| {
            v["spec"]["devices"]["requests"][0]["exactly"]
                .as_object_mut()
                .map(|o| o.remove("deviceClassName"));
        }),
        ("exactly and firstAvailable", |v| {
            v["spec"]["devices"]["requests"][0]["firstAvailable"] =
                json!([{"name": "a", "deviceClassName": "gpu.nvidia.com"}]);
        }),
        ("neither exactly nor firstAvailable", |v| {
            v["spec"]["devices"]["requests"][0]
                .as_object_mut()
                .map(|o| o.remove("exactly"));
        }),
        ("allocationMode Some", |v| {
            v["spec"]["devices"]["requests"][0]["exactly"]["allocationMode"] = json!("Some");
        }),
        ("count with allocationMode All", |v| {
            v["spec"]["devices"]["requests"][0]["exactly"]["allocationMode"] = json!("All");
        }),
        ("a constraint naming an unknown request", |v| {
            v["spec"]["devices"]["constraints"] =
                json!([{"requests": ["nope"], "matchAttribute": "gpu.nvidia.com/nvlinkDomain"}]);
        }),
        ("a constraint attribute without domain", |v| {
            v["spec"]["devices"]["constraints"] = json!([{"matchAttribute": "nvlinkDomain"}]);
        }),
        ("a selector that does not compile", |v| {
            v["spec"]["devices"]["requests"][0]["exactly"]["selectors"] =
                json!([{"cel": {"expression": "device.driver =="}}]);
        }),
        ("an empty selector expression", |v| {
            v["spec"]["devices"]["requests"][0]["exactly"]["selectors"] =
                json!([{"cel": {"expression": ""}}]);
        }),
        ("opaque parameters that are no object", |v| {
            v["spec"]["devices"]["config"] =
                json!([{"opaque": {"driver": "gpu.nvidia.com", "parameters": [1, 2]}}]);
        }),
        ("a capacity request that is no quantity", |v| {
            v["spec"]["devices"]["requests"][0]["exactly"]["capacity"] =
                json!({"requests": {"memory": "lots"}});
        }),
    ];
    for (i, (what, change)) in claim_cases.into_iter().enumerate() {
        let mut v = claim(sc, &format!("bad-{i}"));
        change(&mut v);
        run.send(
            &format!("create a claim with {what}"),
            at(&path).create(&pp, bytes(&v)),
        )
        .await;
    }
    let mut v = claim(sc, "unknown-strict");
    v["spec"]["devices"]["requests"][0]["exactly"]["colour"] = json!("green");
    run.send_with(
        "create a claim with an unknown field, fieldValidation=Strict",
        at(&path).create(&pp, bytes(&v)),
        "fieldValidation=Strict",
    )
    .await;
    let mut v = claim(sc, "unknown-warn");
    v["spec"]["devices"]["requests"][0]["exactly"]["colour"] = json!("green");
    run.send(
        "create a claim with an unknown field",
        at(&path).create(&pp, bytes(&v)),
    )
    .await;
    let mut v = claim(sc, "Bad_Claim");
    v["metadata"]["name"] = json!("Bad_Claim");
    run.send(
        "create a claim with an invalid name",
        at(&path).create(&pp, bytes(&v)),
    )
    .await;
    let mut v = claim("elsewhere", "wrong-ns");
    v["metadata"]["namespace"] = json!("elsewhere");
    run.send(
        "create a claim naming another namespace",
        at(&path).create(&pp, bytes(&v)),
    )
    .await;
    run.steps
}
