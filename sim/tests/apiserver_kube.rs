//! Fidelity tests: the real kube client (kube 5 with k8s-openapi v1_34 types) against the test
//! API server. If kube can tell the difference, one of these fails.

use std::collections::BTreeMap;
use std::time::Duration;

use futures::{StreamExt, TryStreamExt};
use gpu_dra_sim::apiserver::{
    Resource, ServerOptions, TestApiServer, ValidationRules, WriteOptions,
};
use k8s_openapi::api::core::v1::Node;
use k8s_openapi::api::resource::v1::{DeviceClass, ResourceClaim, ResourceSlice};
use kube::api::{
    Api, DeleteParams, ListParams, Patch, PatchParams, PostParams, WatchEvent, WatchParams,
};
use kube::runtime::{WatchStreamExt, reflector, watcher};
use kube::{Client, Config, Error};
use serde_json::{Value, json};

async fn start(rules: ValidationRules) -> (TestApiServer, Client) {
    let server = TestApiServer::start(ServerOptions {
        rules,
        bookmark_interval: Duration::from_millis(100),
        ..ServerOptions::default()
    })
    .await
    .expect("server starts");
    let config = Config::new(server.url().parse().expect("url parses"));
    let client = Client::try_from(config).expect("client builds");
    (server, client)
}

fn device(i: usize) -> Value {
    json!({
        "name": format!("gpu-{i}"),
        "attributes": {
            "type": {"string": "gpu"},
            "index": {"int": i},
            "driverVersion": {"version": "550.54.15"},
            "productName": {"string": "NVIDIA H100 80GB HBM3"}
        },
        "capacity": {"memory": {"value": "80Gi"}}
    })
}

fn slice_json(name: &str, node: &str, devices: usize) -> Value {
    json!({
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceSlice",
        "metadata": {"name": name, "labels": {"node": node}},
        "spec": {
            "driver": "gpu.nvidia.com",
            "pool": {"name": node, "generation": 1, "resourceSliceCount": 1},
            "nodeName": node,
            "devices": (0..devices).map(device).collect::<Vec<_>>()
        }
    })
}

fn slice(name: &str, node: &str, devices: usize) -> ResourceSlice {
    serde_json::from_value(slice_json(name, node, devices)).expect("valid ResourceSlice JSON")
}

fn api_error(result: Result<impl std::fmt::Debug, Error>) -> kube::core::Status {
    match result {
        Err(Error::Api(status)) => *status,
        other => panic!("expected an API error, got {other:?}"),
    }
}

fn names<K: kube::Resource>(items: &[K]) -> Vec<String> {
    items
        .iter()
        .map(|o| o.meta().name.clone().unwrap_or_default())
        .collect()
}

#[tokio::test]
async fn create_get_list_with_selectors_and_paging() {
    let (_server, client) = start(ValidationRules::V1_35).await;
    let slices: Api<ResourceSlice> = Api::all(client);
    let pp = PostParams::default();
    let created = slices
        .create(&pp, &slice("a-1", "node-a", 2))
        .await
        .unwrap();
    slices
        .create(&pp, &slice("a-2", "node-a", 1))
        .await
        .unwrap();
    slices
        .create(&pp, &slice("b-1", "node-b", 1))
        .await
        .unwrap();

    let meta = &created.metadata;
    assert!(meta.uid.as_deref().is_some_and(|u| u.len() == 36));
    assert!(meta.creation_timestamp.is_some());
    assert_eq!(meta.generation, Some(1));
    assert!(
        meta.resource_version
            .as_deref()
            .unwrap()
            .parse::<u64>()
            .is_ok()
    );

    let got = slices.get("a-1").await.unwrap();
    assert_eq!(got.spec.devices.as_ref().unwrap().len(), 2);
    assert_eq!(got, created);

    let on_a = slices
        .list(&ListParams::default().fields("spec.nodeName=node-a"))
        .await
        .unwrap();
    assert_eq!(names(&on_a.items), ["a-1", "a-2"]);
    let pool_b = slices
        .list(&ListParams::default().fields("spec.driver=gpu.nvidia.com,spec.pool.name=node-b"))
        .await
        .unwrap();
    assert_eq!(names(&pool_b.items), ["b-1"]);
    let not_a = slices
        .list(&ListParams::default().labels("node!=node-a"))
        .await
        .unwrap();
    assert_eq!(names(&not_a.items), ["b-1"]);

    // Paging with limit/continue, the way kube's watcher lists.
    let mut seen = Vec::new();
    let mut lp = ListParams::default().limit(1);
    loop {
        let page = slices.list(&lp).await.unwrap();
        seen.extend(names(&page.items));
        match page.metadata.continue_.filter(|c| !c.is_empty()) {
            Some(token) => lp = lp.continue_token(&token),
            None => break,
        }
    }
    assert_eq!(seen, ["a-1", "a-2", "b-1"]);

    let err = api_error(
        slices
            .list(&ListParams::default().fields("spec.bogus=x"))
            .await,
    );
    assert_eq!((err.code, err.reason.as_str()), (400, "BadRequest"));
    let err = api_error(slices.get("missing").await);
    assert_eq!((err.code, err.reason.as_str()), (404, "NotFound"));
    assert_eq!(
        err.message,
        "resourceslices.resource.k8s.io \"missing\" not found"
    );
    let err = api_error(slices.create(&pp, &slice("a-1", "node-a", 1)).await);
    assert_eq!((err.code, err.reason.as_str()), (409, "AlreadyExists"));
}

#[tokio::test]
async fn update_with_stale_resource_version_conflicts() {
    let (_server, client) = start(ValidationRules::V1_35).await;
    let slices: Api<ResourceSlice> = Api::all(client);
    let original = slices
        .create(&PostParams::default(), &slice("s", "node-a", 1))
        .await
        .unwrap();
    let mut first = original.clone();
    first.spec.pool.generation = 2;
    let updated = slices
        .replace("s", &PostParams::default(), &first)
        .await
        .unwrap();
    assert_eq!(updated.metadata.generation, Some(2));
    assert_ne!(
        updated.metadata.resource_version,
        original.metadata.resource_version
    );

    let mut stale = original.clone();
    stale.spec.pool.generation = 3;
    let err = api_error(slices.replace("s", &PostParams::default(), &stale).await);
    assert_eq!((err.code, err.reason.as_str()), (409, "Conflict"));
    assert!(
        err.message.contains("the object has been modified"),
        "{}",
        err.message
    );
    assert_eq!(slices.get("s").await.unwrap().spec.pool.generation, 2);
}

#[tokio::test]
async fn server_side_apply_creates_changes_and_detects_conflicts() {
    let (_server, client) = start(ValidationRules::V1_35).await;
    let slices: Api<ResourceSlice> = Api::all(client);
    let ssa = PatchParams::apply("gpu.nvidia.com").force();

    let created = slices
        .patch(
            "node-a-gpus",
            &ssa,
            &Patch::Apply(&slice("node-a-gpus", "node-a", 2)),
        )
        .await
        .unwrap();
    assert_eq!(created.metadata.generation, Some(1));
    let managed = created.metadata.managed_fields.as_ref().unwrap();
    assert_eq!(managed[0].manager.as_deref(), Some("gpu.nvidia.com"));
    assert_eq!(managed[0].operation.as_deref(), Some("Apply"));

    // Applying the same configuration again changes nothing.
    let again = slices
        .patch(
            "node-a-gpus",
            &ssa,
            &Patch::Apply(&slice("node-a-gpus", "node-a", 2)),
        )
        .await
        .unwrap();
    assert_eq!(
        again.metadata.resource_version,
        created.metadata.resource_version
    );

    // A changed configuration replaces the owned fields; the dropped label goes away.
    let mut changed = slice_json("node-a-gpus", "node-a", 3);
    changed["metadata"]["labels"] = json!({});
    changed["spec"]["pool"]["generation"] = json!(2);
    let updated = slices
        .patch("node-a-gpus", &ssa, &Patch::Apply(&changed))
        .await
        .unwrap();
    assert_eq!(updated.spec.devices.as_ref().unwrap().len(), 3);
    assert_eq!(updated.metadata.generation, Some(2));
    assert!(
        updated
            .metadata
            .labels
            .as_ref()
            .is_none_or(BTreeMap::is_empty)
    );

    // Another manager may not take a field over without force.
    let mut other = changed.clone();
    other["spec"]["pool"]["generation"] = json!(9);
    let err = api_error(
        slices
            .patch(
                "node-a-gpus",
                &PatchParams::apply("intruder"),
                &Patch::Apply(&other),
            )
            .await,
    );
    assert_eq!((err.code, err.reason.as_str()), (409, "Conflict"));
    let causes = err.details.unwrap().causes;
    assert!(
        causes
            .iter()
            .any(|c| c.field == ".spec.pool.generation" && c.reason == "FieldManagerConflict"),
        "{causes:?}"
    );
    let forced = slices
        .patch(
            "node-a-gpus",
            &PatchParams::apply("intruder").force(),
            &Patch::Apply(&other),
        )
        .await
        .unwrap();
    assert_eq!(forced.spec.pool.generation, 9);

    // Dry runs answer without storing.
    let mut dry = changed.clone();
    dry["spec"]["pool"]["generation"] = json!(11);
    let answer = slices
        .patch("node-a-gpus", &ssa.clone().dry_run(), &Patch::Apply(&dry))
        .await
        .unwrap();
    assert_eq!(answer.spec.pool.generation, 11);
    assert_eq!(
        slices
            .get("node-a-gpus")
            .await
            .unwrap()
            .spec
            .pool
            .generation,
        9
    );
}

#[tokio::test]
async fn merge_patches() {
    let (_server, client) = start(ValidationRules::V1_35).await;
    let slices: Api<ResourceSlice> = Api::all(client.clone());
    slices
        .create(&PostParams::default(), &slice("s", "node-a", 1))
        .await
        .unwrap();
    let pp = PatchParams::default();
    let merged = slices
        .patch(
            "s",
            &pp,
            &Patch::Merge(json!({"metadata": {"labels": {"tier": "gold"}}})),
        )
        .await
        .unwrap();
    assert_eq!(merged.metadata.labels.unwrap()["tier"], "gold");
    let err = api_error(
        slices
            .patch("missing", &pp, &Patch::Merge(json!({"metadata": {}})))
            .await,
    );
    assert_eq!(err.code, 404);
}

#[tokio::test]
async fn delete_and_delete_collection() {
    let (_server, client) = start(ValidationRules::V1_35).await;
    let slices: Api<ResourceSlice> = Api::all(client);
    for (name, node) in [("a-1", "node-a"), ("a-2", "node-a"), ("b-1", "node-b")] {
        slices
            .create(&PostParams::default(), &slice(name, node, 1))
            .await
            .unwrap();
    }
    let deleted = slices
        .delete("b-1", &DeleteParams::default())
        .await
        .unwrap();
    let deleted = deleted.left().expect("the deleted object is returned");
    assert_eq!(deleted.metadata.name.as_deref(), Some("b-1"));
    let err = api_error(slices.delete("b-1", &DeleteParams::default()).await);
    assert_eq!(err.code, 404);

    let precondition = DeleteParams {
        preconditions: Some(kube::api::Preconditions {
            uid: Some("00000000-0000-4000-8000-000000000000".into()),
            resource_version: None,
        }),
        ..DeleteParams::default()
    };
    let err = api_error(slices.delete("a-1", &precondition).await);
    assert_eq!((err.code, err.reason.as_str()), (409, "Conflict"));

    let gone = slices
        .delete_collection(
            &DeleteParams::default(),
            &ListParams::default().fields("spec.nodeName=node-a"),
        )
        .await
        .unwrap();
    let gone = gone.left().expect("the deleted objects are returned");
    assert_eq!(names(&gone.items), ["a-1", "a-2"]);
    assert!(
        slices
            .list(&ListParams::default())
            .await
            .unwrap()
            .items
            .is_empty()
    );
}

#[tokio::test]
async fn watcher_lists_watches_and_sees_every_change() {
    let (server, client) = start(ValidationRules::V1_35).await;
    let slices: Api<ResourceSlice> = Api::all(client);
    slices
        .create(&PostParams::default(), &slice("a-0", "node-a", 1))
        .await
        .unwrap();
    slices
        .create(&PostParams::default(), &slice("b-0", "node-b", 1))
        .await
        .unwrap();

    let config = watcher::Config::default().fields("spec.nodeName=node-a");
    let mut events = Box::pin(watcher(slices.clone(), config));
    let mut initial = Vec::new();
    loop {
        match next(&mut events).await {
            watcher::Event::Init => {}
            watcher::Event::InitApply(s) => initial.push(s.metadata.name.unwrap()),
            watcher::Event::InitDone => break,
            other => panic!("unexpected event before InitDone: {other:?}"),
        }
    }
    assert_eq!(initial, ["a-0"]);

    slices
        .create(&PostParams::default(), &slice("a-1", "node-a", 1))
        .await
        .unwrap();
    slices
        .create(&PostParams::default(), &slice("b-1", "node-b", 1))
        .await
        .unwrap();
    slices
        .patch(
            "a-1",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"pool": {"generation": 2}}})),
        )
        .await
        .unwrap();
    slices
        .delete("a-0", &DeleteParams::default())
        .await
        .unwrap();

    let mut seen = Vec::new();
    while seen.len() < 3 {
        match next(&mut events).await {
            watcher::Event::Apply(s) => seen.push(format!(
                "apply {} gen {}",
                s.metadata.name.unwrap(),
                s.spec.pool.generation
            )),
            watcher::Event::Delete(s) => seen.push(format!("delete {}", s.metadata.name.unwrap())),
            other => panic!("unexpected event: {other:?}"),
        }
    }
    assert_eq!(seen, ["apply a-1 gen 1", "apply a-1 gen 2", "delete a-0"]);
    drop(events);
    server.shutdown().await.unwrap();
}

async fn next<S, K>(events: &mut S) -> watcher::Event<K>
where
    S: futures::Stream<Item = Result<watcher::Event<K>, watcher::Error>> + Unpin,
{
    tokio::time::timeout(Duration::from_secs(10), events.next())
        .await
        .expect("an event within 10 s")
        .expect("the stream continues")
        .expect("no watcher error")
}

#[tokio::test]
async fn streaming_list_watcher() {
    let (_server, client) = start(ValidationRules::V1_35).await;
    let classes: Api<DeviceClass> = Api::all(client);
    let class: DeviceClass = serde_json::from_value(json!({
        "apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass",
        "metadata": {"name": "gpu.nvidia.com"},
        "spec": {"selectors": [{"cel": {"expression": "device.driver == 'gpu.nvidia.com'"}}]}
    }))
    .unwrap();
    classes
        .create(&PostParams::default(), &class)
        .await
        .unwrap();
    let mut events = Box::pin(watcher(
        classes.clone(),
        watcher::Config::default().streaming_lists(),
    ));
    let mut initial = Vec::new();
    loop {
        match next(&mut events).await {
            watcher::Event::Init => {}
            watcher::Event::InitApply(c) => initial.push(c.metadata.name.unwrap()),
            watcher::Event::InitDone => break,
            other => panic!("unexpected {other:?}"),
        }
    }
    assert_eq!(initial, ["gpu.nvidia.com"]);
    classes
        .delete("gpu.nvidia.com", &DeleteParams::default())
        .await
        .unwrap();
    assert!(matches!(next(&mut events).await, watcher::Event::Delete(_)));
}

async fn wait_for_reflector(reader: &reflector::Store<Node>, nodes: &Api<Node>) -> usize {
    let mut want = names(&nodes.list(&ListParams::default()).await.unwrap().items);
    want.sort();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        let mut have: Vec<String> = reader
            .state()
            .iter()
            .map(|n| n.metadata.name.clone().unwrap())
            .collect();
        have.sort();
        if have == want {
            return want.len();
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "reflector {have:?} != server {want:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

fn node(name: &str) -> Value {
    json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": name}})
}

/// Watches that time out every second resume from their last resourceVersion (which bookmarks
/// keep current); the reflector ends up with exactly the server's objects.
#[tokio::test]
async fn reflector_stays_consistent_across_watch_timeouts() {
    let server = TestApiServer::start(ServerOptions {
        bookmark_interval: Duration::from_millis(50),
        ..ServerOptions::default()
    })
    .await
    .unwrap();
    let client = Client::try_from(Config::new(server.url().parse().unwrap())).unwrap();
    let nodes: Api<Node> = Api::all(client);
    let (reader, writer) = reflector::store();
    let stream = reflector(
        writer,
        watcher(nodes.clone(), watcher::Config::default().timeout(1)),
    )
    .default_backoff()
    .applied_objects();
    let task = tokio::spawn(stream.try_for_each(|_| async { Ok(()) }));
    reader.wait_until_ready().await.unwrap();

    for round in 0..3 {
        for i in 0..5 {
            let node: Node = serde_json::from_value(node(&format!("n-{round}-{i}"))).unwrap();
            nodes.create(&PostParams::default(), &node).await.unwrap();
        }
        nodes
            .delete(&format!("n-{round}-0"), &DeleteParams::default())
            .await
            .unwrap();
        tokio::time::sleep(Duration::from_millis(700)).await;
    }
    assert_eq!(wait_for_reflector(&reader, &nodes).await, 12);
    assert!(!task.is_finished(), "the watcher never failed");
    task.abort();
}

/// A watcher that falls too far behind is cut off with `410 Expired`, and kube's watcher
/// relists: the reflector still converges. (The test runtime is single-threaded, so a burst of
/// in-process writes overflows the watcher's buffer before it can run.)
#[tokio::test]
async fn watcher_relists_after_falling_behind() {
    let server = TestApiServer::start(ServerOptions {
        watcher_buffer: 4,
        history_limit: 4,
        ..ServerOptions::default()
    })
    .await
    .unwrap();
    let client = Client::try_from(Config::new(server.url().parse().unwrap())).unwrap();
    let nodes: Api<Node> = Api::all(client);
    let (reader, writer) = reflector::store();
    let errors = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let seen_errors = errors.clone();
    let stream = reflector(writer, watcher(nodes.clone(), watcher::Config::default()))
        .default_backoff()
        .applied_objects();
    let task = tokio::spawn(stream.for_each(move |event| {
        if let Err(watcher::Error::WatchError(status)) = &event {
            assert_eq!(status.code, 410);
            seen_errors.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        }
        async {}
    }));
    reader.wait_until_ready().await.unwrap();
    tokio::time::sleep(Duration::from_millis(100)).await;
    let store = server.store();
    for i in 0..20 {
        store
            .create(
                Resource::Nodes,
                None,
                node(&format!("burst-{i}")),
                &WriteOptions::default(),
            )
            .unwrap();
    }
    assert_eq!(wait_for_reflector(&reader, &nodes).await, 20);
    assert!(
        errors.load(std::sync::atomic::Ordering::SeqCst) >= 1,
        "the watcher saw 410 Expired"
    );
    task.abort();
}

#[tokio::test]
async fn watching_from_expired_history_gets_410() {
    let server = TestApiServer::start(ServerOptions {
        history_limit: 2,
        ..ServerOptions::default()
    })
    .await
    .unwrap();
    let client = Client::try_from(Config::new(server.url().parse().unwrap())).unwrap();
    let nodes: Api<Node> = Api::all(client);
    let first: Node = serde_json::from_value(node("first")).unwrap();
    let first = nodes.create(&PostParams::default(), &first).await.unwrap();
    for i in 0..3 {
        let n: Node = serde_json::from_value(node(&format!("n{i}"))).unwrap();
        nodes.create(&PostParams::default(), &n).await.unwrap();
    }
    let rv = first.metadata.resource_version.unwrap();
    let mut stream = Box::pin(nodes.watch(&WatchParams::default(), &rv).await.unwrap());
    match stream.next().await.unwrap().unwrap() {
        WatchEvent::Error(status) => {
            assert_eq!((status.code, status.reason.as_str()), (410, "Expired"));
            assert!(
                status.message.starts_with("too old resource version"),
                "{}",
                status.message
            );
        }
        other => panic!("expected an ERROR event, got {other:?}"),
    }
    assert!(
        stream.next().await.is_none(),
        "the watch ends after the error"
    );
}

#[tokio::test]
async fn raw_watch_delivers_bookmarks_and_ends_at_timeout() {
    let (_server, client) = start(ValidationRules::V1_35).await;
    let slices: Api<ResourceSlice> = Api::all(client);
    let first = slices
        .create(&PostParams::default(), &slice("s", "node-a", 1))
        .await
        .unwrap();
    let rv = first.metadata.resource_version.clone().unwrap();
    let wp = WatchParams::default().timeout(2);
    let mut stream = Box::pin(slices.watch(&wp, &rv).await.unwrap());
    slices
        .patch(
            "s",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"pool": {"generation": 2}}})),
        )
        .await
        .unwrap();
    let mut saw_modified = false;
    let mut bookmark_rv = None;
    while let Some(event) = tokio::time::timeout(Duration::from_secs(5), stream.next())
        .await
        .expect("the watch ends by itself at timeoutSeconds")
    {
        match event.unwrap() {
            WatchEvent::Modified(s) => {
                assert_eq!(s.spec.pool.generation, 2);
                saw_modified = true;
            }
            WatchEvent::Bookmark(b) => bookmark_rv = Some(b.metadata.resource_version),
            other => panic!("unexpected {other:?}"),
        }
    }
    assert!(saw_modified);
    let bookmark: u64 = bookmark_rv.expect("a bookmark").parse().unwrap();
    assert!(bookmark > rv.parse::<u64>().unwrap());

    // Resuming from a resourceVersion replays what happened after it.
    let mut replay = Box::pin(
        slices
            .watch(&WatchParams::default().timeout(1), &rv)
            .await
            .unwrap(),
    );
    match replay.next().await.unwrap().unwrap() {
        WatchEvent::Modified(s) => assert_eq!(s.spec.pool.generation, 2),
        other => panic!("unexpected {other:?}"),
    }
}

#[tokio::test]
async fn claim_status_subresource() {
    let (_server, client) = start(ValidationRules::V1_35).await;
    let claims: Api<ResourceClaim> = Api::namespaced(client.clone(), "default");
    let claim: ResourceClaim = serde_json::from_value(json!({
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
        "metadata": {"name": "gpu-claim"},
        "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": "gpu.nvidia.com"}}]}}
    }))
    .unwrap();
    let created = claims.create(&PostParams::default(), &claim).await.unwrap();
    assert_eq!(created.metadata.namespace.as_deref(), Some("default"));
    let request = &created
        .spec
        .devices
        .as_ref()
        .unwrap()
        .requests
        .as_ref()
        .unwrap()[0];
    let exactly = request.exactly.as_ref().unwrap();
    assert_eq!(exactly.allocation_mode.as_deref(), Some("ExactCount"));
    assert_eq!(exactly.count, Some(1));

    // The scheduler's part: allocation and reservation through replace_status.
    let mut allocated = created.clone();
    allocated.status = Some(
        serde_json::from_value(json!({
            "allocation": {"devices": {"results": [
                {"request": "gpu", "driver": "gpu.nvidia.com", "pool": "node-a", "device": "gpu-0"}
            ]}},
            "reservedFor": [{"resource": "pods", "name": "pod-a", "uid": "11111111-2222-4333-8444-555555555555"}]
        }))
        .unwrap(),
    );
    let with_status = claims
        .replace_status("gpu-claim", &PostParams::default(), &allocated)
        .await
        .unwrap();
    assert_eq!(with_status.spec, created.spec);
    assert_eq!(
        with_status
            .status
            .as_ref()
            .unwrap()
            .reserved_for
            .as_ref()
            .unwrap()[0]
            .name,
        "pod-a"
    );

    // The driver's part: device status through a status patch (merge, then apply).
    let merged = claims
        .patch_status(
            "gpu-claim",
            &PatchParams::default(),
            &Patch::Merge(json!({"status": {"devices": [
                {"driver": "gpu.nvidia.com", "pool": "node-a", "device": "gpu-0", "data": {"uuid": "GPU-1"}}
            ]}})),
        )
        .await
        .unwrap();
    assert_eq!(
        merged
            .status
            .as_ref()
            .unwrap()
            .devices
            .as_ref()
            .unwrap()
            .len(),
        1
    );
    let applied = claims
        .patch_status(
            "gpu-claim",
            &PatchParams::apply("gpu.nvidia.com").force(),
            &Patch::Apply(json!({
                "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
                "metadata": {"name": "gpu-claim", "namespace": "default"},
                "status": {"devices": [{"driver": "gpu.nvidia.com", "pool": "node-a", "device": "gpu-0",
                    "conditions": [{"type": "Ready", "status": "True", "reason": "Prepared", "message": "",
                                    "lastTransitionTime": "2026-01-01T00:00:00Z"}]}]}
            })),
        )
        .await
        .unwrap();
    let device_status = &applied.status.as_ref().unwrap().devices.as_ref().unwrap()[0];
    assert_eq!(device_status.conditions.as_ref().unwrap()[0].type_, "Ready");
    assert_eq!(claims.get_status("gpu-claim").await.unwrap(), applied);

    // A device status for a device that is not allocated is rejected.
    let err = api_error(
        claims
            .patch_status(
                "gpu-claim",
                &PatchParams::default(),
                &Patch::Merge(json!({"status": {"devices": [
                    {"driver": "gpu.nvidia.com", "pool": "node-a", "device": "gpu-7"}
                ]}})),
            )
            .await,
    );
    assert_eq!((err.code, err.reason.as_str()), (422, "Invalid"));

    // The spec is immutable, and status sent to the main resource is ignored.
    let mut respec = applied.clone();
    respec
        .spec
        .devices
        .as_mut()
        .unwrap()
        .requests
        .as_mut()
        .unwrap()[0]
        .name = "other".into();
    let err = api_error(
        claims
            .replace("gpu-claim", &PostParams::default(), &respec)
            .await,
    );
    assert_eq!(err.code, 422);
    let mut main = applied.clone();
    main.status = None;
    main.metadata.labels = Some(BTreeMap::from([("a".to_owned(), "b".to_owned())]));
    let relabelled = claims
        .replace("gpu-claim", &PostParams::default(), &main)
        .await
        .unwrap();
    assert_eq!(relabelled.status, applied.status);

    // Claims across namespaces.
    let all: Api<ResourceClaim> = Api::all(client.clone());
    assert_eq!(
        all.list(&ListParams::default()).await.unwrap().items.len(),
        1
    );
    let other: Api<ResourceClaim> = Api::namespaced(client, "other");
    assert!(
        other
            .list(&ListParams::default())
            .await
            .unwrap()
            .items
            .is_empty()
    );
}

#[tokio::test]
async fn device_classes_and_nodes() {
    let (server, client) = start(ValidationRules::V1_35).await;
    let classes: Api<DeviceClass> = Api::all(client.clone());
    let class: DeviceClass = serde_json::from_value(json!({
        "apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass",
        "metadata": {"name": "mig.nvidia.com"},
        "spec": {"selectors": [{"cel": {"expression": "device.attributes['gpu.nvidia.com'].type == 'mig'"}}]}
    }))
    .unwrap();
    let created = classes
        .create(&PostParams::default(), &class)
        .await
        .unwrap();
    let mut changed = created.clone();
    changed.spec.selectors.as_mut().unwrap().clear();
    let replaced = classes
        .replace("mig.nvidia.com", &PostParams::default(), &changed)
        .await
        .unwrap();
    assert_eq!(replaced.metadata.generation, Some(2));
    assert_eq!(
        classes
            .list(&ListParams::default())
            .await
            .unwrap()
            .items
            .len(),
        1
    );
    classes
        .delete("mig.nvidia.com", &DeleteParams::default())
        .await
        .unwrap();

    let nodes: Api<Node> = Api::all(client);
    let node: Node =
        serde_json::from_value(json!({"metadata": {"name": "node-a", "labels": {"gpu": "true"}}}))
            .unwrap();
    let node = nodes.create(&PostParams::default(), &node).await.unwrap();
    assert_eq!(nodes.get("node-a").await.unwrap(), node);
    assert_eq!(
        nodes
            .list(&ListParams::default().labels("gpu=true"))
            .await
            .unwrap()
            .items
            .len(),
        1
    );
    // In-process and HTTP views agree.
    assert!(server.store().get(Resource::Nodes, None, "node-a").is_ok());
    nodes
        .delete("node-a", &DeleteParams::default())
        .await
        .unwrap();
    assert!(server.store().get(Resource::Nodes, None, "node-a").is_err());
}

#[tokio::test]
async fn slices_of_a_deleted_node_are_garbage_collected() {
    let (_server, client) = start(ValidationRules::V1_35).await;
    let nodes: Api<Node> = Api::all(client.clone());
    let slices: Api<ResourceSlice> = Api::all(client);
    let node: Node = serde_json::from_value(json!({"metadata": {"name": "node-a"}})).unwrap();
    let node = nodes.create(&PostParams::default(), &node).await.unwrap();
    let mut owned = slice_json("owned", "node-a", 1);
    owned["metadata"]["ownerReferences"] = json!([{
        "apiVersion": "v1", "kind": "Node", "name": "node-a",
        "uid": node.metadata.uid.clone().unwrap(), "controller": true
    }]);
    let owned: ResourceSlice = serde_json::from_value(owned).unwrap();
    slices.create(&PostParams::default(), &owned).await.unwrap();
    nodes
        .delete("node-a", &DeleteParams::default())
        .await
        .unwrap();
    assert_eq!(api_error(slices.get("owned").await).code, 404);
}

fn cause_fields(status: &kube::core::Status) -> Vec<String> {
    status
        .details
        .as_ref()
        .map(|d| d.causes.iter().map(|c| c.field.clone()).collect())
        .unwrap_or_default()
}

async fn create_invalid(client: &Client, slice: Value) -> kube::core::Status {
    let slices: Api<ResourceSlice> = Api::all(client.clone());
    let slice: ResourceSlice = serde_json::from_value(slice).unwrap();
    let status = api_error(slices.create(&PostParams::default(), &slice).await);
    assert_eq!(
        (status.code, status.reason.as_str()),
        (422, "Invalid"),
        "{status:?}"
    );
    let details = status.details.as_ref().unwrap();
    assert_eq!(details.kind, "ResourceSlice");
    assert_eq!(details.group, "resource.k8s.io");
    status
}

#[tokio::test]
async fn invalid_slices_are_rejected_with_causes() {
    let (_server, client) = start(ValidationRules::V1_35).await;

    let status = create_invalid(&client, slice_json("too-many", "node-a", 129)).await;
    assert_eq!(cause_fields(&status), ["spec.devices"]);
    assert_eq!(
        status.message,
        "ResourceSlice.resource.k8s.io \"too-many\" is invalid: spec.devices: Too many: 129: must have at most 128 items"
    );

    let mut long = slice_json("long", "node-a", 4);
    long["spec"]["devices"][3]["attributes"]["productName"] = json!({"string": "x".repeat(65)});
    let status = create_invalid(&client, long).await;
    assert_eq!(
        cause_fields(&status),
        ["spec.devices[3].attributes[productName].string"]
    );
    assert_eq!(
        status.details.unwrap().causes[0].reason,
        "FieldValueTooLong"
    );

    let mut bad_names = slice_json("bad-names", "node-a", 2);
    bad_names["spec"]["devices"][1]["name"] = json!("GPU_1");
    bad_names["spec"]["driver"] = json!("not a driver");
    let status = create_invalid(&client, bad_names).await;
    assert_eq!(
        cause_fields(&status),
        ["spec.driver", "spec.devices[1].name"]
    );

    let mut bad_meta = slice_json("Bad_Name", "node-a", 1);
    bad_meta["metadata"]["labels"] = json!({"node": "-x-"});
    let status = create_invalid(&client, bad_meta).await;
    assert_eq!(cause_fields(&status), ["metadata.name", "metadata.labels"]);

    let mut tainted = slice_json("tainted", "node-a", 65);
    tainted["spec"]["devices"][0]["taints"] =
        json!([{"key": "example.com/broken", "effect": "NoSchedule"}]);
    let status = create_invalid(&client, tainted.clone()).await;
    assert!(
        status
            .message
            .ends_with("spec.devices: Too many: 65: must have at most 64 items"),
        "{}",
        status.message
    );

    let mut mixed = slice_json("mixed", "node-a", 1);
    mixed["spec"]["sharedCounters"] =
        json!([{"name": "gpu-0", "counters": {"memory": {"value": "80Gi"}}}]);
    let status = create_invalid(&client, mixed.clone()).await;
    assert_eq!(cause_fields(&status), ["spec"]);
    assert!(
        status
            .message
            .contains("only one of `sharedCounters` or `devices` is allowed")
    );

    let mut sets = slice_json("sets", "node-a", 0);
    sets["spec"].as_object_mut().unwrap().remove("devices");
    sets["spec"]["sharedCounters"] =
        json!((0..9)
        .map(|i| json!({"name": format!("gpu-{i}"), "counters": {"memory": {"value": "80Gi"}}}))
        .collect::<Vec<_>>());
    let status = create_invalid(&client, sets).await;
    assert_eq!(cause_fields(&status), ["spec.sharedCounters"]);

    // Nothing invalid was stored.
    let slices: Api<ResourceSlice> = Api::all(client.clone());
    assert!(
        slices
            .list(&ListParams::default())
            .await
            .unwrap()
            .items
            .is_empty()
    );

    // Under the 1.34 rules the taint and mixed slices are fine, 129 devices are not.
    let (_old, old_client) = start(ValidationRules::V1_34).await;
    let old_slices: Api<ResourceSlice> = Api::all(old_client.clone());
    for obj in [tainted, mixed] {
        let slice: ResourceSlice = serde_json::from_value(obj).unwrap();
        old_slices
            .create(&PostParams::default(), &slice)
            .await
            .unwrap();
    }
    let status = create_invalid(&old_client, slice_json("too-many", "node-a", 129)).await;
    assert_eq!(cause_fields(&status), ["spec.devices"]);
    let mut consumes = slice_json("consumes", "node-a", 1);
    consumes["spec"]["devices"][0]["consumesCounters"] =
        json!([{"counterSet": "elsewhere", "counters": {"memory": {"value": "1Gi"}}}]);
    let status = create_invalid(&old_client, consumes).await;
    assert_eq!(
        cause_fields(&status),
        ["spec.devices[0].consumesCounters[0].counterSet"]
    );
}

#[tokio::test]
async fn kubeconfig_version_and_metadata_api() {
    let (server, _client) = start(ValidationRules::V1_34).await;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("kubeconfig");
    server.write_kubeconfig(&path).unwrap();
    let kubeconfig = kube::config::Kubeconfig::read_from(&path).unwrap();
    let config =
        Config::from_custom_kubeconfig(kubeconfig, &kube::config::KubeConfigOptions::default())
            .await
            .unwrap();
    assert_eq!(config.default_namespace, "default");
    let client = Client::try_from(config).unwrap();

    let version = client.apiserver_version().await.unwrap();
    assert_eq!(
        (version.major.as_str(), version.minor.as_str()),
        ("1", "34")
    );

    let slices: Api<ResourceSlice> = Api::all(client);
    slices
        .create(&PostParams::default(), &slice("s", "node-a", 1))
        .await
        .unwrap();
    let meta = slices.get_metadata("s").await.unwrap();
    assert_eq!(meta.metadata.name.as_deref(), Some("s"));
    let list = slices.list_metadata(&ListParams::default()).await.unwrap();
    assert_eq!(list.items.len(), 1);
    assert_eq!(
        list.items[0].metadata.labels.as_ref().unwrap()["node"],
        "node-a"
    );
}
