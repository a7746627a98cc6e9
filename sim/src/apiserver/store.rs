//! The object store: every object as JSON, one global monotonically increasing
//! `resourceVersion`, the write pipeline of the API server (preconditions, status-subresource
//! rules, defaulting, validation, generation bumps, field ownership, no-op detection), an event
//! history for watch resumption, and the fan-out of events to watchers over a tokio broadcast
//! channel.
//!
//! Deleting an object also deletes its dependents (objects that list it in `ownerReferences` and
//! have no other live owner), like the garbage collector's background propagation, unless the
//! delete asks to orphan them. Owner references that dangle from the start are not collected.

use std::collections::{BTreeMap, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use serde_json::{Map, Value, json};
use tokio::sync::broadcast;

use super::fields::{self, Scope};
use super::meta;
use super::patch::{self, PatchBody};
use super::resources::Resource;
use super::schema;
use super::selectors::Selectors;
use super::status::{ApiError, StatusCause};
use super::validation::{self, ValidationRules};

/// Identity of a stored object.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ObjectKey {
    /// Its resource.
    pub resource: Resource,
    /// Its namespace (`""` for cluster-scoped objects).
    pub namespace: String,
    /// Its name.
    pub name: String,
}

/// What happened to an object.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EventType {
    /// Created.
    Added,
    /// Changed.
    Modified,
    /// Deleted.
    Deleted,
}

impl EventType {
    /// The watch event type string.
    pub fn as_str(self) -> &'static str {
        match self {
            EventType::Added => "ADDED",
            EventType::Modified => "MODIFIED",
            EventType::Deleted => "DELETED",
        }
    }
}

/// One change to the store.
#[derive(Debug, Clone)]
pub struct StoreEvent {
    /// The resourceVersion of the change.
    pub resource_version: u64,
    /// What happened.
    pub event_type: EventType,
    /// Which object.
    pub key: ObjectKey,
    /// The object after the change (for deletes: the last state, with the delete's
    /// resourceVersion).
    pub object: Value,
    /// The object before a modification.
    pub previous: Option<Value>,
}

impl StoreEvent {
    /// The event a watcher of `resource` in `namespace` (all namespaces when `None`) with
    /// `selectors` sees, if any: an object that starts or stops matching the selectors is
    /// reported as `ADDED` or `DELETED`, like the real API server does.
    pub fn for_watcher(
        &self,
        resource: Resource,
        namespace: Option<&str>,
        selectors: &Selectors,
    ) -> Option<(EventType, &Value)> {
        if self.key.resource != resource || namespace.is_some_and(|ns| ns != self.key.namespace) {
            return None;
        }
        let now = selectors.matches(&self.object);
        match self.event_type {
            EventType::Added | EventType::Deleted => now.then_some((self.event_type, &self.object)),
            EventType::Modified => {
                let before = self.previous.as_ref().is_some_and(|p| selectors.matches(p));
                match (before, now) {
                    (true, true) => Some((EventType::Modified, &self.object)),
                    (false, true) => Some((EventType::Added, &self.object)),
                    (true, false) => Some((EventType::Deleted, &self.object)),
                    (false, false) => None,
                }
            }
        }
    }
}

/// Options of a create, update or patch.
#[derive(Debug, Clone, Default)]
pub struct WriteOptions {
    /// The field manager recorded in `managedFields` (required for apply; `"unknown"` otherwise
    /// when not given).
    pub field_manager: Option<String>,
    /// `dryRun=All`: validate and answer, store nothing.
    pub dry_run: bool,
    /// `force=true` for server-side apply.
    pub force: bool,
}

/// Options of a delete.
#[derive(Debug, Clone, Default)]
pub struct DeleteOptions {
    /// `preconditions.uid`.
    pub uid: Option<String>,
    /// `preconditions.resourceVersion`.
    pub resource_version: Option<String>,
    /// `dryRun=All`.
    pub dry_run: bool,
    /// `propagationPolicy: Orphan`: keep dependents.
    pub orphan: bool,
}

/// One page of a list.
#[derive(Debug, Clone)]
pub struct ListPage {
    /// The objects on this page.
    pub items: Vec<Value>,
    /// The resourceVersion of the list.
    pub resource_version: u64,
    /// The key of the last item when more items follow.
    pub continue_after: Option<(String, String)>,
    /// How many matching items follow this page.
    pub remaining: usize,
}

/// Where a watch starts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WatchFrom {
    /// Synthetic `ADDED` events for every existing object, then changes (resourceVersion unset
    /// or `"0"`).
    Snapshot,
    /// Changes after this resourceVersion.
    After(u64),
}

/// The start of a watch: events to send first, then the live receiver.
#[derive(Debug)]
pub struct WatchStart {
    /// Events to replay before live ones.
    pub initial: Vec<(EventType, Value)>,
    /// Live events (created before the replay was computed, so nothing is lost).
    pub receiver: broadcast::Receiver<Arc<StoreEvent>>,
    /// The store's resourceVersion when the watch started.
    pub resource_version: u64,
}

/// How a write records field ownership.
#[derive(Debug, Clone, Copy)]
enum Tracking<'a> {
    /// A create/update/non-apply patch by this manager.
    Update(&'a str),
    /// Already computed (server-side apply).
    Done,
}

struct State {
    rv: u64,
    objects: BTreeMap<ObjectKey, Value>,
    history: VecDeque<Arc<StoreEvent>>,
    history_limit: usize,
    /// Events up to this resourceVersion are no longer in `history`.
    compacted: u64,
}

/// The object store shared by the HTTP routes and in-process users (tests, the demo).
pub struct Store {
    state: Mutex<State>,
    events: broadcast::Sender<Arc<StoreEvent>>,
    rules: ValidationRules,
}

impl std::fmt::Debug for Store {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Store")
            .field("rules", &self.rules)
            .field("resource_version", &self.resource_version())
            .finish_non_exhaustive()
    }
}

/// Metadata fields only the server sets.
const SERVER_MANAGED_ON_CREATE: [&str; 5] = [
    "uid",
    "creationTimestamp",
    "deletionTimestamp",
    "deletionGracePeriodSeconds",
    "selfLink",
];

impl State {
    /// A copy of the object stored under `key`, or a 404 Status error.
    fn existing(&self, key: &ObjectKey) -> Result<Value, ApiError> {
        self.objects
            .get(key)
            .cloned()
            .ok_or_else(|| ApiError::not_found(key.resource, &key.name))
    }
}

fn key_of(resource: Resource, namespace: &str, name: &str) -> ObjectKey {
    ObjectKey {
        resource,
        namespace: if resource.info().namespaced {
            namespace.to_owned()
        } else {
            String::new()
        },
        name: name.to_owned(),
    }
}

/// Checks (and fills in when missing) `apiVersion` and `kind` of a body.
fn check_type(resource: Resource, obj: &mut Value) -> Result<(), ApiError> {
    let Some(map) = obj.as_object_mut() else {
        return Err(ApiError::bad_request(format!(
            "{} in version \"{}\" cannot be handled as a {}: the body must be a JSON object",
            resource.info().kind,
            resource.info().version,
            resource.info().kind
        )));
    };
    let want_version = resource.api_version();
    match map.get("apiVersion").and_then(Value::as_str) {
        Some(v) if v != want_version => {
            return Err(ApiError::bad_request(format!(
                "the API version in the data ({v}) does not match the expected API version ({want_version})"
            )));
        }
        Some(_) => {}
        None => {
            map.insert("apiVersion".into(), json!(want_version));
        }
    }
    match map.get("kind").and_then(Value::as_str) {
        Some(k) if k != resource.info().kind => Err(ApiError::bad_request(format!(
            "the kind in the data ({k}) does not match the expected kind ({})",
            resource.info().kind
        ))),
        Some(_) => Ok(()),
        None => {
            map.insert("kind".into(), json!(resource.info().kind));
            Ok(())
        }
    }
}

fn set_or_remove(map: &mut Map<String, Value>, key: &str, value: Option<&Value>) {
    match value {
        Some(v) if !v.is_null() => {
            map.insert(key.to_owned(), v.clone());
        }
        _ => {
            map.remove(key);
        }
    }
}

/// A write may not change `metadata.uid`: a body naming another UID than the stored object's
/// is invalid (`422`, `field is immutable`), as on the real server.
fn check_uid(resource: Resource, name: &str, body_uid: &str, old: &Value) -> Result<(), ApiError> {
    if body_uid.is_empty() || body_uid == meta::uid(old) {
        return Ok(());
    }
    let message = format!("Invalid value: \"{body_uid}\": field is immutable");
    let summary = format!("metadata.uid: {message}");
    Err(ApiError::invalid(
        resource,
        name,
        vec![StatusCause {
            reason: "FieldValueInvalid".into(),
            message,
            field: "metadata.uid".into(),
        }],
        &summary,
    ))
}

fn owner_uids(obj: &Value) -> Vec<String> {
    obj.pointer("/metadata/ownerReferences")
        .and_then(Value::as_array)
        .map(|refs| {
            refs.iter()
                .filter_map(|r| r.get("uid").and_then(Value::as_str))
                .map(str::to_owned)
                .collect()
        })
        .unwrap_or_default()
}

impl Store {
    /// An empty store enforcing `rules`, keeping `history_limit` events for watch resumption and
    /// buffering `broadcast_capacity` events per watcher.
    pub fn new(rules: ValidationRules, history_limit: usize, broadcast_capacity: usize) -> Self {
        let (events, _) = broadcast::channel(broadcast_capacity.max(1));
        Self {
            state: Mutex::new(State {
                rv: 1,
                objects: BTreeMap::new(),
                history: VecDeque::new(),
                history_limit: history_limit.max(1),
                compacted: 1,
            }),
            events,
            rules,
        }
    }

    /// The validation rules this store enforces.
    pub fn rules(&self) -> ValidationRules {
        self.rules
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The current (latest) resourceVersion.
    pub fn resource_version(&self) -> u64 {
        self.lock().rv
    }

    /// A receiver of every future change.
    pub fn subscribe(&self) -> broadcast::Receiver<Arc<StoreEvent>> {
        self.events.subscribe()
    }

    fn commit(
        &self,
        st: &mut State,
        event_type: EventType,
        key: ObjectKey,
        mut object: Value,
        previous: Option<Value>,
    ) -> Value {
        st.rv += 1;
        meta::set_meta_str(&mut object, "resourceVersion", &st.rv.to_string());
        if event_type == EventType::Deleted {
            st.objects.remove(&key);
        } else {
            st.objects.insert(key.clone(), object.clone());
        }
        let event = Arc::new(StoreEvent {
            resource_version: st.rv,
            event_type,
            key,
            object: object.clone(),
            previous,
        });
        st.history.push_back(event.clone());
        while st.history.len() > st.history_limit {
            if let Some(dropped) = st.history.pop_front() {
                st.compacted = dropped.resource_version;
            }
        }
        tracing::debug!(
            rv = st.rv,
            kind = event.key.resource.info().kind,
            name = %event.key.name,
            event = event_type.as_str(),
            "stored"
        );
        // Sending while holding the lock keeps the channel in resourceVersion order.
        let _ = self.events.send(event);
        object
    }

    // ----------------------------------------------------------------------------------------
    // Reads

    /// The object, or a 404 Status error.
    pub fn get(
        &self,
        resource: Resource,
        namespace: Option<&str>,
        name: &str,
    ) -> Result<Value, ApiError> {
        self.lock()
            .existing(&key_of(resource, namespace.unwrap_or(""), name))
    }

    /// All objects of a resource (in one namespace, or all when `None`) that match the
    /// selectors, ordered by namespace and name, with the list's resourceVersion.
    pub fn list(
        &self,
        resource: Resource,
        namespace: Option<&str>,
        selectors: &Selectors,
    ) -> (Vec<Value>, u64) {
        let page = self.list_page(resource, namespace, selectors, None, None);
        (page.items, page.resource_version)
    }

    /// One page of a list: at most `limit` items after `after` (namespace, name).
    pub fn list_page(
        &self,
        resource: Resource,
        namespace: Option<&str>,
        selectors: &Selectors,
        limit: Option<usize>,
        after: Option<&(String, String)>,
    ) -> ListPage {
        let st = self.lock();
        let mut matching = st
            .objects
            .iter()
            .filter(|(k, _)| k.resource == resource)
            .filter(|(k, _)| namespace.is_none_or(|ns| ns == k.namespace))
            .filter(|(k, _)| after.is_none_or(|(ns, name)| (&k.namespace, &k.name) > (ns, name)))
            .filter(|(_, v)| selectors.matches(v));
        let limit = limit.filter(|l| *l > 0).unwrap_or(usize::MAX);
        let mut items = Vec::new();
        let mut last = None;
        for (key, obj) in matching.by_ref() {
            if items.len() == limit {
                let remaining = 1 + matching.count();
                return ListPage {
                    items,
                    resource_version: st.rv,
                    continue_after: last,
                    remaining,
                };
            }
            items.push(obj.clone());
            last = Some((key.namespace.clone(), key.name.clone()));
        }
        ListPage {
            items,
            resource_version: st.rv,
            continue_after: None,
            remaining: 0,
        }
    }

    /// Starts a watch: computes the events to replay and subscribes, atomically.
    pub fn watch(
        &self,
        resource: Resource,
        namespace: Option<&str>,
        from: WatchFrom,
        selectors: &Selectors,
    ) -> Result<WatchStart, ApiError> {
        let st = self.lock();
        let receiver = self.events.subscribe();
        let initial = match from {
            WatchFrom::Snapshot => st
                .objects
                .iter()
                .filter(|(k, _)| k.resource == resource)
                .filter(|(k, _)| namespace.is_none_or(|ns| ns == k.namespace))
                .filter(|(_, v)| selectors.matches(v))
                .map(|(_, v)| (EventType::Added, v.clone()))
                .collect(),
            WatchFrom::After(rv) => {
                if rv < st.compacted {
                    return Err(ApiError::expired(rv, st.compacted + 1));
                }
                st.history
                    .iter()
                    .filter(|e| e.resource_version > rv)
                    .filter_map(|e| {
                        e.for_watcher(resource, namespace, selectors)
                            .map(|(t, v)| (t, v.clone()))
                    })
                    .collect()
            }
        };
        Ok(WatchStart {
            initial,
            receiver,
            resource_version: st.rv,
        })
    }

    // ----------------------------------------------------------------------------------------
    // Writes

    /// Creates the (cluster-scoped) Node `name`, as kubelet registers its node; returns it.
    pub fn create_node(&self, name: &str) -> Result<Value, ApiError> {
        self.create(
            Resource::Nodes,
            None,
            json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": name}}),
            &WriteOptions::default(),
        )
    }

    /// Creates an object. `namespace` is the namespace of the request (for namespaced resources
    /// it must agree with `metadata.namespace` when both are set); `None` takes the object's.
    pub fn create(
        &self,
        resource: Resource,
        namespace: Option<&str>,
        obj: Value,
        opts: &WriteOptions,
    ) -> Result<Value, ApiError> {
        let mut st = self.lock();
        let manager = opts.field_manager.as_deref().unwrap_or("unknown");
        self.create_locked(
            &mut st,
            resource,
            namespace,
            obj,
            opts.dry_run,
            Tracking::Update(manager),
        )
    }

    fn create_locked(
        &self,
        st: &mut State,
        resource: Resource,
        namespace: Option<&str>,
        mut obj: Value,
        dry_run: bool,
        tracking: Tracking<'_>,
    ) -> Result<Value, ApiError> {
        check_type(resource, &mut obj)?;
        schema::prune(resource, &mut obj);
        if !meta::resource_version(&obj).is_empty() {
            return Err(ApiError::internal(
                "resourceVersion should not be set on objects to be created",
            ));
        }
        let info = resource.info();
        let body_ns = meta::namespace(&obj).to_owned();
        let ns = if info.namespaced {
            match namespace {
                Some(url_ns) if !body_ns.is_empty() && body_ns != url_ns => {
                    return Err(ApiError::bad_request(
                        "the namespace of the provided object does not match the namespace sent on the request",
                    ));
                }
                Some(url_ns) => url_ns.to_owned(),
                None => body_ns,
            }
        } else {
            String::new()
        };
        {
            let m = meta::metadata_mut(&mut obj);
            if info.namespaced {
                m.insert("namespace".into(), json!(ns));
            } else {
                m.remove("namespace");
            }
            for field in SERVER_MANAGED_ON_CREATE {
                m.remove(field);
            }
            if info.has_generation {
                m.insert("generation".into(), json!(1));
            } else {
                m.remove("generation");
            }
        }
        if meta::name(&obj).is_empty() {
            let prefix = meta::meta_str(&obj, "generateName").to_owned();
            if !prefix.is_empty() {
                let name = (0..16)
                    .map(|_| format!("{prefix}{}", meta::random_suffix()))
                    .find(|candidate| !st.objects.contains_key(&key_of(resource, &ns, candidate)))
                    .ok_or_else(|| ApiError::already_exists(resource, &prefix))?;
                meta::set_meta_str(&mut obj, "name", &name);
            }
        }
        if resource == Resource::ResourceClaims
            && let Some(map) = obj.as_object_mut()
        {
            map.remove("status");
        }
        validation::apply_defaults(resource, &mut obj);
        schema::normalize(resource, &mut obj);
        validation::validate_create(resource, &obj, self.rules)?;

        let name = meta::name(&obj).to_owned();
        let key = key_of(resource, &ns, &name);
        if st.objects.contains_key(&key) {
            return Err(ApiError::already_exists(resource, &name));
        }
        meta::set_meta_str(&mut obj, "uid", &meta::new_uid());
        meta::set_meta_str(&mut obj, "creationTimestamp", &meta::now_rfc3339());
        match tracking {
            Tracking::Update(manager) => {
                meta::metadata_mut(&mut obj).remove("managedFields");
                let scope = Scope::Main {
                    exclude_status: false,
                };
                fields::track_update(
                    resource,
                    None,
                    &mut obj,
                    Vec::new(),
                    manager,
                    scope,
                    &meta::now_rfc3339(),
                );
            }
            Tracking::Done => {}
        }
        if dry_run {
            return Ok(obj);
        }
        Ok(self.commit(st, EventType::Added, key, obj, None))
    }

    /// Replaces an object (`PUT`). `status` selects the status subresource. A non-empty
    /// `metadata.resourceVersion` in the body is a precondition (409 on mismatch).
    pub fn update(
        &self,
        resource: Resource,
        namespace: Option<&str>,
        name: &str,
        obj: Value,
        status: bool,
        opts: &WriteOptions,
    ) -> Result<Value, ApiError> {
        let mut st = self.lock();
        let body_name = meta::name(&obj);
        if !body_name.is_empty() && body_name != name {
            return Err(ApiError::bad_request(format!(
                "the name of the object ({body_name}) does not match the name on the URL ({name})"
            )));
        }
        // A PUT's body UID is a storage precondition (409), checked before anything else but
        // the object's existence; a patch that changes it fails validation instead (422).
        let key = key_of(resource, namespace.unwrap_or(""), name);
        if let Some(old) = st.objects.get(&key) {
            let body_uid = meta::uid(&obj);
            if !body_uid.is_empty() && body_uid != meta::uid(old) {
                return Err(ApiError::storage_precondition_failed(
                    resource,
                    &key.namespace,
                    name,
                    &format!(
                        "Precondition failed: UID in precondition: {body_uid}, UID in object meta: {}",
                        meta::uid(old)
                    ),
                ));
            }
        }
        let manager = opts.field_manager.as_deref().unwrap_or("unknown");
        self.update_locked(
            &mut st,
            resource,
            namespace,
            name,
            obj,
            status,
            opts.dry_run,
            Tracking::Update(manager),
        )
    }

    #[allow(clippy::too_many_arguments)]
    fn update_locked(
        &self,
        st: &mut State,
        resource: Resource,
        namespace: Option<&str>,
        name: &str,
        mut body: Value,
        status: bool,
        dry_run: bool,
        tracking: Tracking<'_>,
    ) -> Result<Value, ApiError> {
        let info = resource.info();
        if status && !info.status_subresource {
            return Err(ApiError::unknown_path());
        }
        let key = key_of(resource, namespace.unwrap_or(""), name);
        let old = st.existing(&key)?;
        check_type(resource, &mut body)?;
        schema::prune(resource, &mut body);
        let old_rv = meta::resource_version(&old);
        let body_rv = meta::resource_version(&body);
        if !body_rv.is_empty() && body_rv != old_rv {
            return Err(ApiError::conflict(resource, name));
        }
        check_uid(resource, name, meta::uid(&body), &old)?;
        let client_managed = if status {
            Vec::new()
        } else {
            fields::read_managed(&body)
        };
        // An apply has already computed the object's managed fields.
        let applied_managed = match tracking {
            Tracking::Done => Some(body.pointer("/metadata/managedFields").cloned()),
            Tracking::Update(_) => None,
        };

        let mut candidate = if status {
            let mut c = old.clone();
            if let Some(map) = c.as_object_mut() {
                set_or_remove(map, "status", body.get("status"));
            }
            c
        } else {
            let mut c = body;
            if info.status_subresource
                && let Some(map) = c.as_object_mut()
            {
                set_or_remove(map, "status", old.get("status"));
            }
            c
        };
        {
            let old_meta = meta::metadata(&old).cloned().unwrap_or_default();
            let m = meta::metadata_mut(&mut candidate);
            for field in [
                "name",
                "namespace",
                "uid",
                "creationTimestamp",
                "generation",
                "deletionTimestamp",
                "deletionGracePeriodSeconds",
                "resourceVersion",
                "generateName",
            ] {
                set_or_remove(m, field, old_meta.get(field));
            }
            m.remove("selfLink");
            if let Some(managed) = &applied_managed {
                set_or_remove(m, "managedFields", managed.as_ref());
            }
        }
        schema::normalize(resource, &mut candidate);
        if info.has_generation && candidate.get("spec") != old.get("spec") {
            let generation = old
                .pointer("/metadata/generation")
                .and_then(Value::as_i64)
                .unwrap_or(0);
            meta::metadata_mut(&mut candidate).insert("generation".into(), json!(generation + 1));
        }
        validation::validate_update(resource, &candidate, &old, status, self.rules)?;
        if let Tracking::Update(manager) = tracking {
            let entries = if client_managed.is_empty() {
                fields::read_managed(&old)
            } else {
                client_managed
            };
            let scope = Scope::of(resource, status);
            fields::track_update(
                resource,
                Some(&old),
                &mut candidate,
                entries,
                manager,
                scope,
                &meta::now_rfc3339(),
            );
        }
        if candidate == old || dry_run {
            return Ok(candidate);
        }
        Ok(self.commit(st, EventType::Modified, key, candidate, Some(old)))
    }

    /// Patches an object. Returns the object and whether it was created (server-side apply of
    /// a missing object creates it).
    pub fn patch(
        &self,
        resource: Resource,
        namespace: Option<&str>,
        name: &str,
        patch: &PatchBody,
        status: bool,
        opts: &WriteOptions,
    ) -> Result<(Value, bool), ApiError> {
        let mut st = self.lock();
        let info = resource.info();
        if status && !info.status_subresource {
            return Err(ApiError::unknown_path());
        }
        let key = key_of(resource, namespace.unwrap_or(""), name);
        let current = st.objects.get(&key).cloned();
        let manager = opts.field_manager.as_deref().unwrap_or("unknown");
        let doc = match patch {
            PatchBody::Apply(config) => {
                return self.apply_locked(
                    &mut st, resource, namespace, name, current, config, status, opts,
                );
            }
            PatchBody::Merge(p) => {
                let mut doc = current.ok_or_else(|| ApiError::not_found(resource, name))?;
                if !p.is_object() {
                    return Err(ApiError::bad_request("merge patch must be a JSON object"));
                }
                patch::merge_patch(&mut doc, p);
                doc
            }
        };
        if meta::name(&doc) != name {
            return Err(ApiError::bad_request(
                "the patch may not change metadata.name",
            ));
        }
        let updated = self.update_locked(
            &mut st,
            resource,
            namespace,
            name,
            doc,
            status,
            opts.dry_run,
            Tracking::Update(manager),
        )?;
        Ok((updated, false))
    }

    #[allow(clippy::too_many_arguments)]
    fn apply_locked(
        &self,
        st: &mut State,
        resource: Resource,
        namespace: Option<&str>,
        name: &str,
        current: Option<Value>,
        config: &Value,
        status: bool,
        opts: &WriteOptions,
    ) -> Result<(Value, bool), ApiError> {
        let Some(manager) = opts.field_manager.as_deref().filter(|m| !m.is_empty()) else {
            return Err(ApiError::invalid_options(
                "PatchOptions",
                StatusCause {
                    reason: "FieldValueRequired".into(),
                    message: "Required value: is required for apply patch".into(),
                    field: "fieldManager".into(),
                },
            ));
        };
        let info = resource.info();
        let mut config = config.clone();
        if !config.is_object() {
            return Err(ApiError::bad_request("apply patch must be an object"));
        }
        for (field, want) in [
            ("apiVersion", resource.api_version()),
            ("kind", info.kind.to_owned()),
        ] {
            match config.get(field).and_then(Value::as_str) {
                None | Some("") => {
                    return Err(ApiError::bad_request(format!(
                        "invalid object type: {field} must be set in an apply patch"
                    )));
                }
                Some(v) if v != want => {
                    return Err(ApiError::bad_request(format!(
                        "invalid object type: {field} \"{v}\" does not match the request's {want}"
                    )));
                }
                Some(_) => {}
            }
        }
        let cfg_name = meta::name(&config);
        if !cfg_name.is_empty() && cfg_name != name {
            return Err(ApiError::bad_request(format!(
                "the name of the object ({cfg_name}) does not match the name on the URL ({name})"
            )));
        }
        let cfg_ns = meta::namespace(&config);
        if info.namespaced && !cfg_ns.is_empty() && Some(cfg_ns) != namespace {
            return Err(ApiError::bad_request(
                "the namespace of the provided object does not match the namespace sent on the request",
            ));
        }
        if let Some(err) = schema::apply_error(resource, namespace, name, &config) {
            return Err(err);
        }
        if let Some(m) = config.get_mut("metadata").and_then(Value::as_object_mut) {
            m.remove("managedFields");
        }
        let scope = Scope::of(resource, status);
        let now = meta::now_rfc3339();
        match current {
            None => {
                if status {
                    return Err(ApiError::not_found(resource, name));
                }
                let mut base = json!({
                    "apiVersion": resource.api_version(),
                    "kind": info.kind,
                    "metadata": {"name": name},
                });
                if info.namespaced {
                    base["metadata"]["namespace"] = json!(namespace.unwrap_or(""));
                }
                let merged =
                    fields::apply(resource, &base, &config, manager, scope, opts.force, &now)?;
                let created = self.create_locked(
                    st,
                    resource,
                    namespace,
                    merged,
                    opts.dry_run,
                    Tracking::Done,
                )?;
                Ok((created, true))
            }
            Some(live) => {
                let cfg_rv = meta::resource_version(&config);
                if !cfg_rv.is_empty() && cfg_rv != meta::resource_version(&live) {
                    return Err(ApiError::conflict(resource, name));
                }
                check_uid(resource, name, meta::uid(&config), &live)?;
                let merged =
                    fields::apply(resource, &live, &config, manager, scope, opts.force, &now)?;
                let updated = self.update_locked(
                    st,
                    resource,
                    namespace,
                    name,
                    merged,
                    status,
                    opts.dry_run,
                    Tracking::Done,
                )?;
                Ok((updated, false))
            }
        }
    }

    /// Deletes an object (and, unless orphaning, its dependents). Returns the deleted object.
    pub fn delete(
        &self,
        resource: Resource,
        namespace: Option<&str>,
        name: &str,
        opts: &DeleteOptions,
    ) -> Result<Value, ApiError> {
        let mut st = self.lock();
        let key = key_of(resource, namespace.unwrap_or(""), name);
        let old = st.existing(&key)?;
        if let Some(uid) = opts.uid.as_deref().filter(|u| *u != meta::uid(&old)) {
            return Err(ApiError::precondition_failed(
                resource,
                name,
                &format!(
                    "the UID in the precondition ({uid}) does not match the UID in record ({}). \
                     The object might have been deleted and then recreated",
                    meta::uid(&old)
                ),
            ));
        }
        if let Some(rv) = opts
            .resource_version
            .as_deref()
            .filter(|rv| *rv != meta::resource_version(&old))
        {
            return Err(ApiError::precondition_failed(
                resource,
                name,
                &format!(
                    "the ResourceVersion in the precondition ({rv}) does not match the \
                     ResourceVersion in record ({}). The object might have been modified",
                    meta::resource_version(&old)
                ),
            ));
        }
        if opts.dry_run {
            return Ok(old);
        }
        let uid = meta::uid(&old).to_owned();
        let deleted = self.commit(&mut st, EventType::Deleted, key, old, None);
        if !opts.orphan {
            self.collect_garbage(&mut st, vec![uid]);
        }
        Ok(deleted)
    }

    /// Deletes the dependents of the objects with these uids: objects that name one of them in
    /// `ownerReferences` and whose other owners are gone too; then their dependents, and so on.
    /// Owner references that were already dangling before are left alone.
    fn collect_garbage(&self, st: &mut State, mut deleted_uids: Vec<String>) {
        while !deleted_uids.is_empty() {
            let live: std::collections::BTreeSet<String> = st
                .objects
                .values()
                .map(|o| meta::uid(o).to_owned())
                .collect();
            let dependents: Vec<ObjectKey> = st
                .objects
                .iter()
                .filter(|(_, o)| {
                    let owners = owner_uids(o);
                    owners.iter().any(|u| deleted_uids.contains(u))
                        && owners.iter().all(|u| !live.contains(u))
                })
                .map(|(k, _)| k.clone())
                .collect();
            deleted_uids.clear();
            for key in dependents {
                if let Some(obj) = st.objects.get(&key).cloned() {
                    tracing::debug!(name = %key.name, "garbage-collecting dependent");
                    deleted_uids.push(meta::uid(&obj).to_owned());
                    self.commit(st, EventType::Deleted, key, obj, None);
                }
            }
        }
    }

    /// Deletes every object of a resource (in a namespace, or all) matching the selectors.
    pub fn delete_collection(
        &self,
        resource: Resource,
        namespace: Option<&str>,
        selectors: &Selectors,
        opts: &DeleteOptions,
    ) -> Result<Vec<Value>, ApiError> {
        let mut st = self.lock();
        let keys: Vec<ObjectKey> = st
            .objects
            .iter()
            .filter(|(k, _)| k.resource == resource)
            .filter(|(k, _)| namespace.is_none_or(|ns| ns == k.namespace))
            .filter(|(_, v)| selectors.matches(v))
            .map(|(k, _)| k.clone())
            .collect();
        let mut deleted = Vec::new();
        let mut uids = Vec::new();
        for key in keys {
            let Some(obj) = st.objects.get(&key).cloned() else {
                continue;
            };
            if opts.dry_run {
                deleted.push(obj);
            } else {
                uids.push(meta::uid(&obj).to_owned());
                deleted.push(self.commit(&mut st, EventType::Deleted, key, obj, None));
            }
        }
        if !opts.dry_run && !opts.orphan {
            self.collect_garbage(&mut st, uids);
        }
        Ok(deleted)
    }

    // ----------------------------------------------------------------------------------------
    // Conveniences for in-process users

    /// Server-side applies `obj` (its own namespace and name) as `manager`.
    pub fn apply(
        &self,
        resource: Resource,
        obj: &Value,
        manager: &str,
        force: bool,
    ) -> Result<Value, ApiError> {
        let namespace = meta::namespace(obj).to_owned();
        let name = meta::name(obj).to_owned();
        let opts = WriteOptions {
            field_manager: Some(manager.to_owned()),
            dry_run: false,
            force,
        };
        let ns = (!namespace.is_empty()).then_some(namespace.as_str());
        self.patch(
            resource,
            ns,
            &name,
            &PatchBody::Apply(obj.clone()),
            false,
            &opts,
        )
        .map(|(v, _)| v)
    }

    /// Waits until `predicate` holds for the list of all objects of `resource`, and returns that
    /// list; gives up after `timeout` with the last list seen.
    pub async fn wait_for<F>(
        &self,
        resource: Resource,
        timeout: Duration,
        mut predicate: F,
    ) -> Result<Vec<Value>, Vec<Value>>
    where
        F: FnMut(&[Value]) -> bool,
    {
        let deadline = tokio::time::Instant::now() + timeout;
        let mut events = self.subscribe();
        loop {
            let (items, _) = self.list(resource, None, &Selectors::default());
            if predicate(&items) {
                return Ok(items);
            }
            loop {
                match tokio::time::timeout_at(deadline, events.recv()).await {
                    Ok(Ok(event)) if event.key.resource != resource => {}
                    Ok(Ok(_) | Err(broadcast::error::RecvError::Lagged(_))) => break,
                    Err(_) | Ok(Err(broadcast::error::RecvError::Closed)) => return Err(items),
                }
            }
        }
    }
}

#[cfg(test)]
mod tests;
