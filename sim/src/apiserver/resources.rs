//! The resources the test API server serves (group, version, plural, kind, scope, subresources,
//! field selectors) and the list-type schema that server-side apply needs. No discovery
//! documents: nothing the driver runs asks for them.

/// A resource type served by the test API server.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Resource {
    /// `resource.k8s.io/v1` ResourceSlice (cluster-scoped).
    ResourceSlices,
    /// `resource.k8s.io/v1` ResourceClaim (namespaced, with a `status` subresource).
    ResourceClaims,
    /// `resource.k8s.io/v1` DeviceClass (cluster-scoped).
    DeviceClasses,
    /// core `v1` Node (cluster-scoped).
    Nodes,
    /// `events.k8s.io/v1` Event (namespaced), what kube-runtime's event recorder writes.
    Events,
    /// `coordination.k8s.io/v1` Lease (namespaced), for leader election.
    Leases,
}

/// Static facts about one resource.
#[derive(Debug)]
pub struct ResourceInfo {
    /// API group (`""` for core).
    pub group: &'static str,
    /// API version.
    pub version: &'static str,
    /// Plural resource name used in URLs.
    pub plural: &'static str,
    /// Kind.
    pub kind: &'static str,
    /// Whether objects live in namespaces.
    pub namespaced: bool,
    /// Whether the resource has a `status` subresource (the main resource then ignores status).
    pub status_subresource: bool,
    /// Whether `metadata.generation` is maintained (bumped on spec changes).
    pub has_generation: bool,
    /// Whether a delete answers with the deleted object (the resource.k8s.io types, checked
    /// against a real server; Nodes, not checked) rather than a `Success` Status (Leases and
    /// Events, checked).
    pub delete_returns_object: bool,
    /// Field selectors beyond `metadata.name` / `metadata.namespace`.
    pub field_selectors: &'static [&'static str],
}

const RESOURCE_SLICES: ResourceInfo = ResourceInfo {
    group: "resource.k8s.io",
    version: "v1",
    plural: "resourceslices",
    kind: "ResourceSlice",
    namespaced: false,
    status_subresource: false,
    has_generation: true,
    delete_returns_object: true,
    field_selectors: &["spec.nodeName", "spec.driver", "spec.pool.name"],
};

const RESOURCE_CLAIMS: ResourceInfo = ResourceInfo {
    group: "resource.k8s.io",
    version: "v1",
    plural: "resourceclaims",
    kind: "ResourceClaim",
    namespaced: true,
    status_subresource: true,
    has_generation: false,
    delete_returns_object: true,
    field_selectors: &[],
};

const DEVICE_CLASSES: ResourceInfo = ResourceInfo {
    group: "resource.k8s.io",
    version: "v1",
    plural: "deviceclasses",
    kind: "DeviceClass",
    namespaced: false,
    status_subresource: false,
    has_generation: true,
    delete_returns_object: true,
    field_selectors: &[],
};

const NODES: ResourceInfo = ResourceInfo {
    group: "",
    version: "v1",
    plural: "nodes",
    kind: "Node",
    namespaced: false,
    status_subresource: false,
    has_generation: false,
    delete_returns_object: true,
    field_selectors: &["spec.unschedulable"],
};

const EVENTS: ResourceInfo = ResourceInfo {
    group: "events.k8s.io",
    version: "v1",
    plural: "events",
    kind: "Event",
    namespaced: true,
    status_subresource: false,
    has_generation: false,
    delete_returns_object: false,
    // The field labels the events.k8s.io/v1 API converts to the core Event's.
    field_selectors: &[
        "regarding.kind",
        "regarding.namespace",
        "regarding.name",
        "regarding.uid",
        "regarding.apiVersion",
        "regarding.resourceVersion",
        "regarding.fieldPath",
        "reason",
        "reportingController",
        "type",
    ],
};

const LEASES: ResourceInfo = ResourceInfo {
    group: "coordination.k8s.io",
    version: "v1",
    plural: "leases",
    kind: "Lease",
    namespaced: true,
    status_subresource: false,
    has_generation: false,
    delete_returns_object: false,
    field_selectors: &[],
};

/// The API groups served besides core (all at version `v1`).
pub(crate) const GROUPS: [&str; 3] = ["resource.k8s.io", "events.k8s.io", "coordination.k8s.io"];

impl Resource {
    /// All served resources.
    pub const ALL: [Resource; 6] = [
        Resource::ResourceSlices,
        Resource::ResourceClaims,
        Resource::DeviceClasses,
        Resource::Nodes,
        Resource::Events,
        Resource::Leases,
    ];

    /// Static facts about this resource.
    pub fn info(self) -> &'static ResourceInfo {
        match self {
            Resource::ResourceSlices => &RESOURCE_SLICES,
            Resource::ResourceClaims => &RESOURCE_CLAIMS,
            Resource::DeviceClasses => &DEVICE_CLASSES,
            Resource::Nodes => &NODES,
            Resource::Events => &EVENTS,
            Resource::Leases => &LEASES,
        }
    }

    /// The resource with this group and plural, if served.
    pub fn from_group_plural(group: &str, plural: &str) -> Option<Resource> {
        Self::ALL
            .into_iter()
            .find(|r| r.info().group == group && r.info().plural == plural)
    }

    /// The resource of an object with this apiVersion and kind, if served.
    pub fn from_api_version_kind(api_version: &str, kind: &str) -> Option<Resource> {
        Self::ALL
            .into_iter()
            .find(|r| r.api_version() == api_version && r.info().kind == kind)
    }

    /// `group/version`, or just `version` for core.
    pub fn api_version(self) -> String {
        let info = self.info();
        if info.group.is_empty() {
            info.version.to_owned()
        } else {
            format!("{}/{}", info.group, info.version)
        }
    }

    /// `plural.group` as used in error messages (`resourceslices.resource.k8s.io`), or just the
    /// plural for core resources.
    pub fn qualified_plural(self) -> String {
        let info = self.info();
        if info.group.is_empty() {
            info.plural.to_owned()
        } else {
            format!("{}.{}", info.plural, info.group)
        }
    }

    /// The list kind (`ResourceSliceList`).
    pub fn list_kind(self) -> String {
        format!("{}List", self.info().kind)
    }
}

/// How a JSON array field merges and is owned (Kubernetes `+listType`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ListType {
    /// Replaced and owned as a whole.
    Atomic,
    /// A set of scalars; items are owned individually.
    Set,
    /// A list of objects identified by these key fields; items are owned individually.
    Map(&'static [&'static str]),
}

/// The list type of the array at `path` (field names only, list hops omitted). Lists not named
/// here are atomic, which is what `resource.k8s.io/v1` declares for almost all of its lists
/// (ResourceSlice `devices`, `sharedCounters`, `taints`, `consumesCounters`, ... are all atomic).
pub(crate) fn list_type(resource: Resource, path: &[&str]) -> ListType {
    match (resource, path) {
        (_, ["metadata", "ownerReferences"])
        | (Resource::ResourceClaims, ["status", "reservedFor"]) => ListType::Map(&["uid"]),
        (_, ["metadata", "finalizers"]) => ListType::Set,
        (Resource::ResourceClaims, ["status", "devices"]) => {
            ListType::Map(&["driver", "device", "pool", "shareID"])
        }
        (Resource::ResourceClaims, ["status", "devices", "conditions"])
        | (Resource::Nodes, ["status", "conditions"]) => ListType::Map(&["type"]),
        _ => ListType::Atomic,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lookup_by_group_and_plural() {
        assert_eq!(
            Resource::from_group_plural("resource.k8s.io", "resourceslices"),
            Some(Resource::ResourceSlices)
        );
        assert_eq!(
            Resource::from_group_plural("", "nodes"),
            Some(Resource::Nodes)
        );
        assert_eq!(Resource::from_group_plural("", "resourceslices"), None);
        assert_eq!(
            Resource::from_api_version_kind("resource.k8s.io/v1", "DeviceClass"),
            Some(Resource::DeviceClasses)
        );
        assert_eq!(Resource::from_api_version_kind("v1", "DeviceClass"), None);
    }

    #[test]
    fn events_and_leases_are_served_in_their_groups() {
        assert_eq!(
            Resource::from_group_plural("events.k8s.io", "events"),
            Some(Resource::Events)
        );
        assert_eq!(
            Resource::from_api_version_kind("coordination.k8s.io/v1", "Lease"),
            Some(Resource::Leases)
        );
        assert_eq!(Resource::from_group_plural("", "events"), None);
        assert_eq!(Resource::Events.qualified_plural(), "events.events.k8s.io");
    }

    #[test]
    fn list_types_follow_the_api() {
        assert_eq!(
            list_type(Resource::ResourceSlices, &["spec", "devices"]),
            ListType::Atomic
        );
        assert_eq!(
            list_type(Resource::ResourceClaims, &["status", "reservedFor"]),
            ListType::Map(&["uid"])
        );
        assert_eq!(
            list_type(Resource::Nodes, &["metadata", "finalizers"]),
            ListType::Set
        );
    }
}
