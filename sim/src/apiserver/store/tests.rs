use std::time::Duration;

use serde_json::{Value, json};

use super::*;
use crate::apiserver::selectors::{FieldSelector, Selectors};

fn store() -> Store {
    Store::new(ValidationRules::V1_35, 100, 64)
}

fn opts(manager: &str) -> WriteOptions {
    WriteOptions {
        field_manager: Some(manager.to_owned()),
        ..WriteOptions::default()
    }
}

fn slice(name: &str, node: &str) -> Value {
    json!({
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceSlice",
        "metadata": {"name": name},
        "spec": {
            "driver": "gpu.nvidia.com",
            "pool": {"name": node, "generation": 0, "resourceSliceCount": 1},
            "nodeName": node,
            "devices": [{"name": "gpu-0", "attributes": {"type": {"string": "gpu"}}}]
        }
    })
}

fn claim(name: &str) -> Value {
    json!({
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": "gpu.nvidia.com"}}]}},
        "status": {"reservedFor": [{"resource": "pods", "name": "p", "uid": "u"}]}
    })
}

fn node(name: &str) -> Value {
    json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": name}})
}

fn rv(obj: &Value) -> u64 {
    meta::resource_version(obj).parse().unwrap()
}

#[test]
fn create_sets_server_metadata() {
    let s = store();
    let before = s.resource_version();
    let created = s
        .create(
            Resource::ResourceSlices,
            None,
            slice("a", "node-a"),
            &opts("plugin"),
        )
        .unwrap();
    assert_eq!(rv(&created), before + 1);
    assert_eq!(meta::uid(&created).len(), 36);
    assert!(meta::meta_str(&created, "creationTimestamp").ends_with('Z'));
    assert_eq!(created["metadata"]["generation"], 1);
    assert_eq!(created["metadata"]["managedFields"][0]["manager"], "plugin");
    assert_eq!(
        created["metadata"]["managedFields"][0]["operation"],
        "Update"
    );
    assert_eq!(s.get(Resource::ResourceSlices, None, "a").unwrap(), created);
}

#[test]
fn create_errors() {
    let s = store();
    s.create(Resource::Nodes, None, node("n"), &opts("t"))
        .unwrap();
    let err = s
        .create(Resource::Nodes, None, node("n"), &opts("t"))
        .unwrap_err();
    assert_eq!((err.code, err.reason), (409, "AlreadyExists"));
    let mut with_rv = node("m");
    with_rv["metadata"]["resourceVersion"] = json!("5");
    assert_eq!(
        s.create(Resource::Nodes, None, with_rv, &opts("t"))
            .unwrap_err()
            .code,
        500
    );
    let wrong_kind = json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "x"}});
    assert_eq!(
        s.create(Resource::Nodes, None, wrong_kind, &opts("t"))
            .unwrap_err()
            .code,
        400
    );
    let mut other_ns = claim("c");
    other_ns["metadata"]["namespace"] = json!("other");
    let err = s
        .create(
            Resource::ResourceClaims,
            Some("default"),
            other_ns,
            &opts("t"),
        )
        .unwrap_err();
    assert_eq!(err.code, 400);
    // Nothing was stored by the failed creates.
    assert_eq!(
        s.list(Resource::Nodes, None, &Selectors::default()).0.len(),
        1
    );
    assert!(s.get(Resource::ResourceClaims, Some("other"), "c").is_err());
}

#[test]
fn generate_name() {
    let s = store();
    let obj = json!({"apiVersion": "v1", "kind": "Node", "metadata": {"generateName": "node-"}});
    let a = s
        .create(Resource::Nodes, None, obj.clone(), &opts("t"))
        .unwrap();
    let b = s.create(Resource::Nodes, None, obj, &opts("t")).unwrap();
    assert!(meta::name(&a).starts_with("node-"));
    assert_eq!(
        meta::name(&a).len(),
        "node-".len() + meta::GENERATED_SUFFIX_LEN
    );
    assert_ne!(meta::name(&a), meta::name(&b));
}

#[test]
fn update_preconditions_generation_and_no_ops() {
    let s = store();
    let created = s
        .create(
            Resource::ResourceSlices,
            None,
            slice("a", "node-a"),
            &opts("t"),
        )
        .unwrap();
    let mut events = s.subscribe();

    // Metadata-only change: new resourceVersion, same generation.
    let mut labelled = created.clone();
    labelled["metadata"]["labels"] = json!({"x": "y"});
    let labelled = s
        .update(
            Resource::ResourceSlices,
            None,
            "a",
            labelled,
            false,
            &opts("t"),
        )
        .unwrap();
    assert!(rv(&labelled) > rv(&created));
    assert_eq!(labelled["metadata"]["generation"], 1);

    // Spec change bumps the generation.
    let mut changed = labelled.clone();
    changed["spec"]["pool"]["generation"] = json!(1);
    let changed = s
        .update(
            Resource::ResourceSlices,
            None,
            "a",
            changed,
            false,
            &opts("t"),
        )
        .unwrap();
    assert_eq!(changed["metadata"]["generation"], 2);

    // A stale resourceVersion conflicts.
    let err = s
        .update(
            Resource::ResourceSlices,
            None,
            "a",
            labelled,
            false,
            &opts("t"),
        )
        .unwrap_err();
    assert_eq!((err.code, err.reason), (409, "Conflict"));
    assert!(err.message.contains("the object has been modified"));

    // Re-sending the stored object changes nothing and emits no event.
    let same = s
        .update(
            Resource::ResourceSlices,
            None,
            "a",
            changed.clone(),
            false,
            &opts("t"),
        )
        .unwrap();
    assert_eq!(same, changed);
    let mut seen = Vec::new();
    while let Ok(e) = events.try_recv() {
        seen.push(e.event_type);
    }
    assert_eq!(seen, [EventType::Modified, EventType::Modified]);

    // Wrong uid (a precondition of an update: 409; a patch may not change it: 422, as the real
    // server answers), wrong name, missing object.
    let mut wrong_uid = changed.clone();
    wrong_uid["metadata"]["uid"] = json!("00000000-0000-4000-8000-000000000000");
    let err = s
        .update(
            Resource::ResourceSlices,
            None,
            "a",
            wrong_uid,
            false,
            &opts("t"),
        )
        .unwrap_err();
    assert_eq!(err.code, 409);
    assert!(
        err.message.contains(
            "Key: /registry/resourceslices/a, ResourceVersion: 0, AdditionalErrorMsg: Precondition \
             failed: UID in precondition: 00000000-0000-4000-8000-000000000000, UID in object meta: "
        ),
        "{}",
        err.message
    );
    let err = s
        .patch(
            Resource::ResourceSlices,
            None,
            "a",
            &PatchBody::Merge(json!({"metadata": {"uid": "00000000-0000-4000-8000-000000000000"}})),
            false,
            &opts("t"),
        )
        .unwrap_err();
    assert_eq!(err.code, 422);
    assert_eq!(err.details.causes[0].field, "metadata.uid");
    assert_eq!(
        s.update(
            Resource::ResourceSlices,
            None,
            "b",
            changed.clone(),
            false,
            &opts("t")
        )
        .unwrap_err()
        .code,
        400
    );
    let mut missing = changed;
    missing["metadata"]["name"] = json!("zzz");
    assert_eq!(
        s.update(
            Resource::ResourceSlices,
            None,
            "zzz",
            missing,
            false,
            &opts("t")
        )
        .unwrap_err()
        .code,
        404
    );
}

#[test]
fn invalid_updates_change_nothing() {
    let s = store();
    let created = s
        .create(
            Resource::ResourceSlices,
            None,
            slice("a", "node-a"),
            &opts("t"),
        )
        .unwrap();
    let mut bad = created.clone();
    bad["spec"]["devices"][0]["name"] = json!("Not A Label");
    let err = s
        .update(Resource::ResourceSlices, None, "a", bad, false, &opts("t"))
        .unwrap_err();
    assert_eq!(err.code, 422);
    assert_eq!(err.details.causes[0].field, "spec.devices[0].name");
    assert_eq!(s.get(Resource::ResourceSlices, None, "a").unwrap(), created);
}

#[test]
fn claim_status_subresource_rules() {
    let s = store();
    let created = s
        .create(
            Resource::ResourceClaims,
            Some("default"),
            claim("c"),
            &opts("t"),
        )
        .unwrap();
    assert_eq!(
        created["status"],
        json!({}),
        "status is dropped on create (an empty struct, as the real server returns it)"
    );
    assert_eq!(
        created["spec"]["devices"]["requests"][0]["exactly"]["count"], 1,
        "defaults applied"
    );

    // Status written through the main resource is ignored.
    let mut main = created.clone();
    main["status"] = json!({"reservedFor": [{"resource": "pods", "name": "p", "uid": "u"}]});
    main["metadata"]["labels"] = json!({"a": "b"});
    let updated = s
        .update(
            Resource::ResourceClaims,
            Some("default"),
            "c",
            main,
            false,
            &opts("t"),
        )
        .unwrap();
    assert_eq!(updated["status"], json!({}));
    assert_eq!(updated["metadata"]["labels"]["a"], "b");

    // Spec is immutable.
    let mut respec = updated.clone();
    respec["spec"]["devices"]["requests"][0]["name"] = json!("other");
    let err = s
        .update(
            Resource::ResourceClaims,
            Some("default"),
            "c",
            respec,
            false,
            &opts("t"),
        )
        .unwrap_err();
    assert_eq!(err.code, 422);

    // Status writes change only status.
    let mut status = updated.clone();
    status["spec"] = json!({"ignored": true});
    status["status"] = json!({"allocation": {"devices": {"results": [
        {"request": "gpu", "driver": "gpu.nvidia.com", "pool": "node-a", "device": "gpu-0"}
    ]}}});
    let with_status = s
        .update(
            Resource::ResourceClaims,
            Some("default"),
            "c",
            status,
            true,
            &opts("scheduler"),
        )
        .unwrap();
    assert_eq!(with_status["spec"], updated["spec"]);
    assert_eq!(
        with_status["status"]["allocation"]["devices"]["results"][0]["device"],
        "gpu-0"
    );
    let managers: Vec<&str> = with_status["metadata"]["managedFields"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["subresource"] == "status")
        .map(|e| e["manager"].as_str().unwrap())
        .collect();
    assert_eq!(managers, ["scheduler"]);

    // Status subresource of a resource without one does not exist.
    assert_eq!(
        s.update(Resource::Nodes, None, "n", node("n"), true, &opts("t"))
            .unwrap_err()
            .code,
        404
    );
}

#[test]
fn patches() {
    let s = store();
    s.create(
        Resource::ResourceSlices,
        None,
        slice("a", "node-a"),
        &opts("t"),
    )
    .unwrap();
    let (merged, created) = s
        .patch(
            Resource::ResourceSlices,
            None,
            "a",
            &PatchBody::Merge(json!({"metadata": {"labels": {"k": "v"}}})),
            false,
            &opts("t"),
        )
        .unwrap();
    assert!(!created);
    assert_eq!(merged["metadata"]["labels"]["k"], "v");
    let err = s
        .patch(
            Resource::ResourceSlices,
            None,
            "missing",
            &PatchBody::Merge(json!({})),
            false,
            &opts("t"),
        )
        .unwrap_err();
    assert_eq!(err.code, 404);
    // A patch carrying a stale resourceVersion conflicts.
    let err = s
        .patch(
            Resource::ResourceSlices,
            None,
            "a",
            &PatchBody::Merge(json!({"metadata": {"resourceVersion": "1"}})),
            false,
            &opts("t"),
        )
        .unwrap_err();
    assert_eq!(err.code, 409);
    // A patch producing an invalid object is rejected.
    let err = s
        .patch(
            Resource::ResourceSlices,
            None,
            "a",
            &PatchBody::Merge(json!({"spec": {"pool": {"resourceSliceCount": 0}}})),
            false,
            &opts("t"),
        )
        .unwrap_err();
    assert_eq!(err.code, 422);
}

#[test]
fn server_side_apply() {
    let s = store();
    let (created, was_created) = s
        .patch(
            Resource::ResourceSlices,
            None,
            "a",
            &PatchBody::Apply(slice("a", "node-a")),
            false,
            &opts("gpu.nvidia.com"),
        )
        .unwrap();
    assert!(was_created);
    assert_eq!(
        created["metadata"]["managedFields"][0]["operation"],
        "Apply"
    );
    // Re-applying the same configuration is a no-op.
    let again = s
        .apply(
            Resource::ResourceSlices,
            &slice("a", "node-a"),
            "gpu.nvidia.com",
            false,
        )
        .unwrap();
    assert_eq!(again, created);
    // Another manager changing an owned field conflicts, unless forced.
    let mut other = slice("a", "node-a");
    other["spec"]["pool"]["generation"] = json!(7);
    let err = s
        .apply(Resource::ResourceSlices, &other, "someone-else", false)
        .unwrap_err();
    assert_eq!(err.code, 409);
    assert_eq!(err.details.causes[0].reason, "FieldManagerConflict");
    let forced = s
        .apply(Resource::ResourceSlices, &other, "someone-else", true)
        .unwrap();
    assert_eq!(forced["spec"]["pool"]["generation"], 7);
    assert_eq!(forced["metadata"]["generation"], 2);
    // Apply needs a field manager, a type and a matching name.
    let no_manager = WriteOptions::default();
    let err = s
        .patch(
            Resource::ResourceSlices,
            None,
            "a",
            &PatchBody::Apply(slice("a", "node-a")),
            false,
            &no_manager,
        )
        .unwrap_err();
    assert_eq!(err.code, 422);
    let mut untyped = slice("a", "node-a");
    untyped.as_object_mut().unwrap().remove("kind");
    assert_eq!(
        s.apply(Resource::ResourceSlices, &untyped, "m", false)
            .unwrap_err()
            .code,
        400
    );
    let err = s
        .patch(
            Resource::ResourceSlices,
            None,
            "b",
            &PatchBody::Apply(slice("a", "node-a")),
            false,
            &opts("m"),
        )
        .unwrap_err();
    assert_eq!(err.code, 400);
    // Invalid applied configurations create nothing.
    let mut invalid = slice("c", "node-c");
    invalid["spec"]["driver"] = json!("");
    assert_eq!(
        s.apply(Resource::ResourceSlices, &invalid, "m", false)
            .unwrap_err()
            .code,
        422
    );
    assert!(s.get(Resource::ResourceSlices, None, "c").is_err());
}

#[test]
fn delete_preconditions_and_garbage_collection() {
    let s = store();
    let n = s
        .create(Resource::Nodes, None, node("node-a"), &opts("t"))
        .unwrap();
    let mut owned = slice("owned", "node-a");
    owned["metadata"]["ownerReferences"] = json!([{
        "apiVersion": "v1", "kind": "Node", "name": "node-a", "uid": meta::uid(&n), "controller": true
    }]);
    s.create(Resource::ResourceSlices, None, owned, &opts("t"))
        .unwrap();
    s.create(
        Resource::ResourceSlices,
        None,
        slice("free", "node-b"),
        &opts("t"),
    )
    .unwrap();

    let wrong = DeleteOptions {
        uid: Some("nope".into()),
        ..DeleteOptions::default()
    };
    let err = s
        .delete(Resource::Nodes, None, "node-a", &wrong)
        .unwrap_err();
    assert_eq!(err.code, 409);
    assert!(
        err.message
            .contains("the UID in the precondition (nope) does not match the UID in record"),
        "{}",
        err.message
    );
    assert_eq!(err.details.kind, "Node");
    let stale = DeleteOptions {
        resource_version: Some("1".into()),
        ..DeleteOptions::default()
    };
    assert_eq!(
        s.delete(Resource::Nodes, None, "node-a", &stale)
            .unwrap_err()
            .code,
        409
    );
    let dry = DeleteOptions {
        dry_run: true,
        ..DeleteOptions::default()
    };
    s.delete(Resource::Nodes, None, "node-a", &dry).unwrap();
    assert!(s.get(Resource::Nodes, None, "node-a").is_ok());

    let deleted = s
        .delete(Resource::Nodes, None, "node-a", &DeleteOptions::default())
        .unwrap();
    assert!(rv(&deleted) > rv(&n));
    assert!(
        s.get(Resource::ResourceSlices, None, "owned").is_err(),
        "dependent collected"
    );
    assert!(s.get(Resource::ResourceSlices, None, "free").is_ok());
    assert_eq!(
        s.delete(Resource::Nodes, None, "node-a", &DeleteOptions::default())
            .unwrap_err()
            .code,
        404
    );
}

#[test]
fn orphaning_keeps_dependents() {
    let s = store();
    let n = s
        .create(Resource::Nodes, None, node("node-a"), &opts("t"))
        .unwrap();
    let mut owned = slice("owned", "node-a");
    owned["metadata"]["ownerReferences"] =
        json!([{"apiVersion": "v1", "kind": "Node", "name": "node-a", "uid": meta::uid(&n)}]);
    s.create(Resource::ResourceSlices, None, owned, &opts("t"))
        .unwrap();
    let orphan = DeleteOptions {
        orphan: true,
        ..DeleteOptions::default()
    };
    s.delete(Resource::Nodes, None, "node-a", &orphan).unwrap();
    assert!(s.get(Resource::ResourceSlices, None, "owned").is_ok());
}

#[test]
fn delete_collection_with_selectors() {
    let s = store();
    for (name, node) in [("a", "node-a"), ("b", "node-a"), ("c", "node-b")] {
        s.create(
            Resource::ResourceSlices,
            None,
            slice(name, node),
            &opts("t"),
        )
        .unwrap();
    }
    let selectors = Selectors {
        fields: FieldSelector::parse(Resource::ResourceSlices, "spec.nodeName=node-a").unwrap(),
        ..Selectors::default()
    };
    let deleted = s
        .delete_collection(
            Resource::ResourceSlices,
            None,
            &selectors,
            &DeleteOptions::default(),
        )
        .unwrap();
    assert_eq!(deleted.len(), 2);
    let (left, _) = s.list(Resource::ResourceSlices, None, &Selectors::default());
    assert_eq!(left.len(), 1);
    assert_eq!(meta::name(&left[0]), "c");
}

#[test]
fn list_pages() {
    let s = store();
    for i in 0..5 {
        s.create(Resource::Nodes, None, node(&format!("n{i}")), &opts("t"))
            .unwrap();
    }
    let all = Selectors::default();
    let first = s.list_page(Resource::Nodes, None, &all, Some(2), None);
    assert_eq!(first.items.len(), 2);
    assert_eq!(first.remaining, 3);
    let after = first.continue_after.clone().unwrap();
    let second = s.list_page(Resource::Nodes, None, &all, Some(2), Some(&after));
    assert_eq!(meta::name(&second.items[0]), "n2");
    let after = second.continue_after.clone().unwrap();
    let last = s.list_page(Resource::Nodes, None, &all, Some(2), Some(&after));
    assert_eq!(last.items.len(), 1);
    assert!(last.continue_after.is_none());
}

#[test]
fn watch_replay_and_expiry() {
    let s = Store::new(ValidationRules::V1_35, 3, 64);
    let a = s
        .create(Resource::Nodes, None, node("a"), &opts("t"))
        .unwrap();
    s.create(Resource::ResourceSlices, None, slice("s", "a"), &opts("t"))
        .unwrap();
    s.create(Resource::Nodes, None, node("b"), &opts("t"))
        .unwrap();
    let all = Selectors::default();

    let snapshot = s
        .watch(Resource::Nodes, None, WatchFrom::Snapshot, &all)
        .unwrap();
    let names: Vec<&str> = snapshot
        .initial
        .iter()
        .map(|(_, o)| meta::name(o))
        .collect();
    assert_eq!(names, ["a", "b"]);

    let replay = s
        .watch(Resource::Nodes, None, WatchFrom::After(rv(&a)), &all)
        .unwrap();
    assert_eq!(replay.initial.len(), 1);
    assert_eq!(meta::name(&replay.initial[0].1), "b");

    s.create(Resource::Nodes, None, node("c"), &opts("t"))
        .unwrap();
    s.create(Resource::Nodes, None, node("d"), &opts("t"))
        .unwrap();
    let err = s
        .watch(Resource::Nodes, None, WatchFrom::After(rv(&a)), &all)
        .unwrap_err();
    assert_eq!((err.code, err.reason), (410, "Expired"));
}

#[test]
fn watchers_see_selector_transitions() {
    let s = store();
    let created = s
        .create(
            Resource::ResourceSlices,
            None,
            slice("a", "node-a"),
            &opts("t"),
        )
        .unwrap();
    let selectors = Selectors {
        labels: crate::apiserver::selectors::LabelSelector::parse("team=gpu").unwrap(),
        ..Selectors::default()
    };
    let mut rx = s.subscribe();
    let mut labelled = created.clone();
    labelled["metadata"]["labels"] = json!({"team": "gpu"});
    let labelled = s
        .update(
            Resource::ResourceSlices,
            None,
            "a",
            labelled,
            false,
            &opts("t"),
        )
        .unwrap();
    let mut unlabelled = labelled.clone();
    unlabelled["metadata"]["labels"] = json!({});
    s.update(
        Resource::ResourceSlices,
        None,
        "a",
        unlabelled,
        false,
        &opts("t"),
    )
    .unwrap();
    let first = rx.try_recv().unwrap();
    let second = rx.try_recv().unwrap();
    assert_eq!(
        first
            .for_watcher(Resource::ResourceSlices, None, &selectors)
            .unwrap()
            .0,
        EventType::Added
    );
    assert_eq!(
        second
            .for_watcher(Resource::ResourceSlices, None, &selectors)
            .unwrap()
            .0,
        EventType::Deleted
    );
    assert!(
        first
            .for_watcher(Resource::Nodes, None, &selectors)
            .is_none()
    );
}

#[tokio::test]
async fn wait_for_sees_later_writes() {
    let s = std::sync::Arc::new(store());
    let writer = s.clone();
    let task = tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(20)).await;
        writer
            .create(Resource::Nodes, None, node("late"), &opts("t"))
            .unwrap();
    });
    let found = s
        .wait_for(Resource::Nodes, Duration::from_secs(10), |nodes| {
            !nodes.is_empty()
        })
        .await
        .unwrap();
    assert_eq!(meta::name(&found[0]), "late");
    task.await.unwrap();
    let timed_out = s
        .wait_for(Resource::Nodes, Duration::from_millis(20), |nodes| {
            nodes.len() > 5
        })
        .await
        .unwrap_err();
    assert_eq!(timed_out.len(), 1);
}

#[test]
fn garbage_collection_needs_every_owner_gone() {
    let s = store();
    let a = s
        .create(Resource::Nodes, None, node("a"), &opts("t"))
        .unwrap();
    let b = s
        .create(Resource::Nodes, None, node("b"), &opts("t"))
        .unwrap();
    let owner = |n: &Value| json!({"apiVersion": "v1", "kind": "Node", "name": meta::name(n), "uid": meta::uid(n)});
    let mut shared = slice("shared", "a");
    shared["metadata"]["ownerReferences"] = json!([owner(&a), owner(&b)]);
    s.create(Resource::ResourceSlices, None, shared, &opts("t"))
        .unwrap();
    let mut dangling = slice("dangling", "c");
    dangling["metadata"]["ownerReferences"] =
        json!([{"apiVersion": "v1", "kind": "Node", "name": "c", "uid": "no-such-uid"}]);
    s.create(Resource::ResourceSlices, None, dangling, &opts("t"))
        .unwrap();

    s.delete(Resource::Nodes, None, "a", &DeleteOptions::default())
        .unwrap();
    assert!(
        s.get(Resource::ResourceSlices, None, "shared").is_ok(),
        "b still owns it"
    );
    s.delete(Resource::Nodes, None, "b", &DeleteOptions::default())
        .unwrap();
    assert!(s.get(Resource::ResourceSlices, None, "shared").is_err());
    assert!(
        s.get(Resource::ResourceSlices, None, "dangling").is_ok(),
        "dangling references are not collected"
    );
}

#[test]
fn status_apply_records_its_manager() {
    let s = store();
    let live_spec = s
        .create(
            Resource::ResourceClaims,
            Some("default"),
            claim("c"),
            &opts("t"),
        )
        .unwrap()["spec"]
        .clone();
    let config = json!({
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
        "metadata": {"name": "c", "namespace": "default"},
        "spec": {"devices": {"requests": []}},
        "status": {"allocation": {"devices": {"results": [
            {"request": "gpu", "driver": "gpu.nvidia.com", "pool": "node-a", "device": "gpu-0"}
        ]}}}
    });
    let (applied, created) = s
        .patch(
            Resource::ResourceClaims,
            Some("default"),
            "c",
            &PatchBody::Apply(config),
            true,
            &opts("scheduler"),
        )
        .unwrap();
    assert!(!created);
    assert_eq!(
        applied["spec"], live_spec,
        "a status apply leaves the spec alone"
    );
    let entry = applied["metadata"]["managedFields"]
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["manager"] == "scheduler")
        .expect("the status apply is recorded")
        .clone();
    assert_eq!(entry["operation"], "Apply");
    assert_eq!(entry["subresource"], "status");
    assert!(entry["fieldsV1"]["f:status"]["f:allocation"].is_object());
    assert!(entry["fieldsV1"].get("f:spec").is_none());
}
