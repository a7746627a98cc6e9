//! The chart's security as the real API server enforces it:
//!
//! - the ValidatingAdmissionPolicy keeps the kubelet plugin's
//!   ServiceAccount to its own node's ResourceSlices of its own driver: a
//!   token bound to the running plugin pod (which carries the pod's node)
//!   may create a slice of node `gpu-dra-node` and delete one, but not
//!   create a slice of another node or of another driver, nor delete
//!   another node's slice; a token bound to no pod may write nothing;
//! - neither the plugin's nor the controller's ServiceAccount can read
//!   Secrets (`kubectl auth can-i` says no, `kubectl get` is Forbidden),
//!   while the same tokens can do what the chart grants them;
//! - every RBAC rule the cluster grants the chart's ServiceAccounts (the
//!   plugin, the controller, and the MPS host's, which gets no token) is in
//!   the list below next to the code that uses it, and every listed rule is
//!   granted: the rules are read from the cluster's (Cluster)RoleBindings
//!   and cross-checked with SelfSubjectRulesReviews, and each piece of code
//!   is checked to exist. The running pods' logs show no request refused
//!   for want of a permission.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::time::Duration;

use libtest_mimic::Failed;
use serde_json::Value;

use crate::claims::get_json;
use crate::harness::{Cluster, DRIVER, DRIVER_NS, NODE};

pub const TESTS: [(&str, crate::Test); 3] = [
    (
        "security::the_plugin_token_writes_only_its_own_nodes_slices",
        own_node_slices_only,
    ),
    (
        "security::plugin_and_controller_tokens_cannot_read_secrets",
        no_secrets,
    ),
    (
        "security::every_rbac_rule_of_the_chart_is_used_by_the_code",
        every_rule_used,
    ),
];

/// The plugin's ServiceAccount (`<release>-kubelet-plugin`).
const PLUGIN_SA: &str = "gpu-dra-driver-kubelet-plugin";
/// The controller's ServiceAccount (`<release>-controller`).
const CONTROLLER_SA: &str = "gpu-dra-driver-controller";
/// The MPS host's DaemonSet (`<release>-mps-host`).
const MPS_HOST_DS: &str = "gpu-dra-driver-mps-host";
/// The ValidatingAdmissionPolicy of `templates/resourceslice-policy.yaml`.
const POLICY: &str = "gpu-dra-driver-kubelet-plugin-resourceslices";
/// The controller's leader-election Lease (`gpu-dra-driver.leaseName`).
const LEASE: &str = "gpu-dra-driver-controller";
/// The Secret holding the webhook's certificate (hack/cluster/values.yaml).
const WEBHOOK_SECRET: &str = "gpu-dra-webhook-tls";
/// A node that is not the plugin's (it need not exist).
const OTHER_NODE: &str = "e2e-security-other-node";

/// The user name of ServiceAccount `sa` of the driver's namespace.
fn sa_user(sa: &str) -> String {
    format!("system:serviceaccount:{DRIVER_NS}:{sa}")
}

/// The running pod of component `component` (its name and node), for a
/// token bound to it.
fn running_pod(c: &Cluster, component: &str) -> Result<(String, String), Failed> {
    let pods = get_json(
        c,
        DRIVER_NS,
        &[
            "pods",
            "-l",
            &format!("app.kubernetes.io/component={component}"),
        ],
    )?;
    pods["items"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|p| p["status"]["phase"] == "Running" && p["metadata"]["deletionTimestamp"].is_null())
        .map(|p| {
            (
                p["metadata"]["name"]
                    .as_str()
                    .unwrap_or_default()
                    .to_owned(),
                p["spec"]["nodeName"]
                    .as_str()
                    .unwrap_or_default()
                    .to_owned(),
            )
        })
        .ok_or_else(|| format!("no running {component} pod in {DRIVER_NS}").into())
}

/// A kubectl identity of its own: a kubeconfig with a ServiceAccount token
/// for the cluster's server and CA.
struct TokenUser {
    dir: tempfile::TempDir,
    kubeconfig: PathBuf,
    /// What the token is, for messages.
    who: String,
}

impl TokenUser {
    /// A token of `sa`, bound to `pod` when given (`kubectl create token
    /// --bound-object-kind Pod`), valid for ten minutes.
    fn new(c: &Cluster, sa: &str, pod: Option<&str>) -> Result<Self, Failed> {
        let mut args = vec!["create", "token", sa, "-n", DRIVER_NS, "--duration=10m"];
        if let Some(pod) = pod {
            args.extend(["--bound-object-kind", "Pod", "--bound-object-name", pod]);
        }
        let token = c.kubectl(&args)?.trim().to_owned();
        let config: Value = serde_json::from_str(
            &c.kubectl(&["config", "view", "--raw", "--minify", "-o", "json"])?,
        )
        .map_err(|e| format!("kubectl config view: {e}"))?;
        let cluster = &config["clusters"][0]["cluster"];
        let server = cluster["server"]
            .as_str()
            .ok_or("the admin kubeconfig names no server")?;
        let ca = match (
            cluster["certificate-authority-data"].as_str(),
            cluster["certificate-authority"].as_str(),
        ) {
            (Some(data), _) => format!("certificate-authority-data: {data}"),
            (None, Some(file)) => format!("certificate-authority: {file}"),
            (None, None) => return Err("the admin kubeconfig has no CA".into()),
        };
        let dir = tempfile::tempdir().map_err(|e| format!("a temporary directory: {e}"))?;
        let kubeconfig = dir.path().join("kubeconfig");
        std::fs::write(
            &kubeconfig,
            format!(
                "apiVersion: v1
kind: Config
clusters:
- name: c
  cluster: {{server: {server:?}, {ca}}}
users:
- name: u
  user: {{token: {token}}}
contexts:
- name: x
  context: {{cluster: c, user: u}}
current-context: x
"
            ),
        )
        .map_err(|e| format!("{}: {e}", kubeconfig.display()))?;
        Ok(TokenUser {
            dir,
            kubeconfig,
            who: match pod {
                Some(pod) => format!("{sa} (token bound to pod {pod})"),
                None => format!("{sa} (token bound to no pod)"),
            },
        })
    }

    /// Runs kubectl with this identity: whether it succeeded and its
    /// output.
    fn kubectl(&self, c: &Cluster, args: &[&str]) -> Result<(bool, String), Failed> {
        let out = c
            .command("kubectl")
            .arg("--kubeconfig")
            .arg(&self.kubeconfig)
            .args(args)
            .stdin(std::process::Stdio::null())
            .output()
            .map_err(|e| format!("cannot run kubectl: {e}"))?;
        Ok((
            out.status.success(),
            format!(
                "{}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            ),
        ))
    }

    /// `kubectl <verb> -f <file>` of `yaml` with this identity.
    fn with_file(&self, c: &Cluster, verb: &[&str], yaml: &str) -> Result<(bool, String), Failed> {
        let file = self.dir.path().join("object.yaml");
        std::fs::write(&file, yaml).map_err(|e| format!("{}: {e}", file.display()))?;
        let mut args = verb.to_vec();
        let path = file.to_string_lossy().into_owned();
        args.extend(["-f", &path]);
        self.kubectl(c, &args)
    }

    /// `kubectl auth can-i <verb> <resource> [-n ns | -A]`: the answer.
    fn can_i(
        &self,
        c: &Cluster,
        verb: &str,
        resource: &str,
        ns: Option<&str>,
    ) -> Result<bool, Failed> {
        let mut args = vec!["auth", "can-i", verb, resource];
        match ns {
            Some(ns) => args.extend(["-n", ns]),
            None => args.push("--all-namespaces"),
        }
        let (yes, out) = self.kubectl(c, &args)?;
        match (yes, out.trim()) {
            (true, "yes") => Ok(true),
            (false, "no") => Ok(false),
            _ => Err(format!("{}: kubectl {args:?} answered {out:?}", self.who).into()),
        }
    }
}

/// A token bound to the running pod of `component`, with the node the pod
/// runs on; retried when the pod is replaced in between (other tests
/// restart the plugin).
fn pod_token(c: &Cluster, sa: &str, component: &str) -> Result<(TokenUser, String), Failed> {
    let mut last = String::new();
    for _ in 0..30 {
        let token = running_pod(c, component)
            .and_then(|(pod, node)| Ok((TokenUser::new(c, sa, Some(&pod))?, node)));
        match token {
            Ok(token) => return Ok(token),
            Err(e) => e.message().unwrap_or_default().clone_into(&mut last),
        }
        std::thread::sleep(Duration::from_secs(2));
    }
    Err(format!("no token bound to a running {component} pod within 60 s: {last}").into())
}

/// A ResourceSlice of `driver` on `node` in pool `pool`, without devices.
fn slice(name: &str, driver: &str, node: &str, pool: &str) -> String {
    format!(
        "apiVersion: resource.k8s.io/v1
kind: ResourceSlice
metadata: {{name: {name}}}
spec:
  driver: {driver}
  nodeName: {node}
  pool: {{name: {pool}, generation: 0, resourceSliceCount: 1}}
  devices: []
"
    )
}

/// Checks that `(ok, out)` is a refusal by the policy with `message`.
fn refused_by_policy(what: &str, (ok, out): (bool, String), message: &str) -> Result<(), Failed> {
    if ok {
        return Err(format!("{what} was allowed; the policy should refuse it:\n{out}").into());
    }
    let policy = format!("ValidatingAdmissionPolicy '{POLICY}'");
    let missing: Vec<&str> = [policy.as_str(), "denied request", message]
        .into_iter()
        .filter(|want| !out.contains(want))
        .collect();
    if !missing.is_empty() {
        return Err(format!(
            "{what} was refused, but not by the policy: missing {missing:?} in\n{out}"
        )
        .into());
    }
    Ok(())
}

fn own_node_slices_only(c: &Cluster) -> Result<(), Failed> {
    let (plugin, node) = pod_token(c, PLUGIN_SA, "kubelet-plugin")?;
    if node != NODE {
        return Err(format!("the plugin pod runs on {node:?}, not {NODE}").into());
    }
    // The token carries the pod's node, which the policy compares.
    let (ok, whoami) = plugin.kubectl(c, &["auth", "whoami", "-o", "json"])?;
    let whoami: Value = serde_json::from_str(&whoami)
        .map_err(|e| format!("kubectl auth whoami (ok {ok}): {e}: {whoami}"))?;
    let info = &whoami["status"]["userInfo"];
    if info["username"] != sa_user(PLUGIN_SA)
        || info["extra"]["authentication.kubernetes.io/node-name"][0] != NODE
    {
        return Err(format!(
            "{}: the token's user is not the plugin's on {NODE}: {info:#}",
            plugin.who
        )
        .into());
    }

    let suffix = std::process::id();
    let (own, foreign, other_driver) = (
        format!("e2e-security-own-{suffix}"),
        format!("e2e-security-foreign-{suffix}"),
        format!("e2e-security-driver-{suffix}"),
    );
    let cleanup = || {
        for name in [&own, &foreign, &other_driver] {
            let _ = c.kubectl(&["delete", "resourceslice", name, "--ignore-not-found"]);
        }
    };
    cleanup();
    let result = (|| -> Result<(), Failed> {
        // Another node's slice: refused, and not stored.
        refused_by_policy(
            &format!("{}: creating a slice of node {OTHER_NODE}", plugin.who),
            plugin.with_file(
                c,
                &["create"],
                &slice(&foreign, DRIVER, OTHER_NODE, &foreign),
            )?,
            &format!(
                "the kubelet plugin on node {NODE} may not write ResourceSlices of node {OTHER_NODE}"
            ),
        )?;
        let stored = c.kubectl(&[
            "get",
            "resourceslice",
            &foreign,
            "--ignore-not-found",
            "-o",
            "name",
        ])?;
        if !stored.trim().is_empty() {
            return Err(format!("the refused slice {foreign} is stored").into());
        }
        // Another driver's slice on its own node: refused.
        let driver = "e2e-security.example.com";
        refused_by_policy(
            &format!("{}: creating a slice of driver {driver}", plugin.who),
            plugin.with_file(
                c,
                &["create"],
                &slice(&other_driver, driver, NODE, &other_driver),
            )?,
            &format!(
                "the kubelet plugin may only write ResourceSlices of driver {DRIVER}, not {driver}"
            ),
        )?;
        // Another node's slice (made by the admin, whom the policy does not
        // match): the plugin may not delete it either.
        c.apply("default", &slice(&foreign, DRIVER, OTHER_NODE, &foreign))?;
        refused_by_policy(
            &format!("{}: deleting a slice of node {OTHER_NODE}", plugin.who),
            plugin.kubectl(c, &["delete", "resourceslice", &foreign])?,
            &format!(
                "the kubelet plugin on node {NODE} may not write ResourceSlices of node {OTHER_NODE}"
            ),
        )?;
        c.kubectl(&["get", "resourceslice", &foreign, "-o", "name"])
            .map_err(|e| format!("the slice {foreign} is gone after a refused delete: {e}"))?;
        c.kubectl(&["delete", "resourceslice", &foreign])?;

        // A token bound to no pod names no node: refused even for its node.
        let unbound = TokenUser::new(c, PLUGIN_SA, None)?;
        refused_by_policy(
            &format!("{}: creating a slice of node {NODE}", unbound.who),
            unbound.with_file(c, &["create"], &slice(&own, DRIVER, NODE, &own))?,
            "the kubelet plugin's token names no node",
        )?;

        // Its own node, a pool of its own: allowed, so the policy
        // discriminates. (The plugin owns its node's slices of the driver and
        // may delete this one itself as surplus: NotFound is fine then.)
        let (ok, out) = plugin.with_file(c, &["create"], &slice(&own, DRIVER, NODE, &own))?;
        if !ok || !out.contains(&format!("resourceslice.resource.k8s.io/{own} created")) {
            return Err(format!(
                "{}: creating a slice of its own node {NODE} failed:\n{out}",
                plugin.who
            )
            .into());
        }
        let (ok, out) =
            plugin.kubectl(c, &["delete", "resourceslice", &own, "--ignore-not-found"])?;
        if !ok {
            return Err(format!(
                "{}: deleting its own node's slice {own} failed:\n{out}",
                plugin.who
            )
            .into());
        }
        // Deleting a slice the plugin published itself, as a server-side dry
        // run (admission runs, nothing changes): allowed.
        let published = c.kubectl(&[
            "get",
            "resourceslices",
            "--field-selector",
            &format!("spec.nodeName={NODE},spec.driver={DRIVER}"),
            "-o",
            "jsonpath={.items[0].metadata.name}",
        ])?;
        let published = published.trim();
        if published.is_empty() {
            return Err(format!("no ResourceSlice of {DRIVER} on {NODE}").into());
        }
        let (ok, out) = plugin.kubectl(
            c,
            &["delete", "resourceslice", published, "--dry-run=server"],
        )?;
        if !ok {
            return Err(format!(
                "{}: a dry-run delete of its own slice {published} failed:\n{out}",
                plugin.who
            )
            .into());
        }
        Ok(())
    })();
    cleanup();
    result
}

fn no_secrets(c: &Cluster) -> Result<(), Failed> {
    let (plugin, _) = pod_token(c, PLUGIN_SA, "kubelet-plugin")?;
    let (controller, _) = pod_token(c, CONTROLLER_SA, "controller")?;
    // What each may do (so that a "no" below is the RBAC's, not a broken
    // token's): one rule the chart grants.
    for (user, verb, resource) in [
        (&plugin, "list", "resourceslices.resource.k8s.io"),
        (&controller, "watch", "resourceclaims.resource.k8s.io"),
    ] {
        if !user.can_i(c, verb, resource, None)? {
            return Err(format!(
                "{}: cannot {verb} {resource}, which the chart grants",
                user.who
            )
            .into());
        }
    }
    for (user, sa) in [(&plugin, PLUGIN_SA), (&controller, CONTROLLER_SA)] {
        for (verb, ns) in [
            ("get", Some(DRIVER_NS)),
            ("list", Some(DRIVER_NS)),
            ("watch", Some(DRIVER_NS)),
            ("list", None),
            ("get", Some("kube-system")),
        ] {
            if user.can_i(c, verb, "secrets", ns)? {
                return Err(format!(
                    "{}: kubectl auth can-i {verb} secrets in {} says yes",
                    user.who,
                    ns.unwrap_or("all namespaces")
                )
                .into());
            }
        }
        let user_name = sa_user(sa);
        for (args, verb) in [
            (vec!["get", "secrets", "-n", DRIVER_NS], "list"),
            (
                vec!["get", "secret", WEBHOOK_SECRET, "-n", DRIVER_NS],
                "get",
            ),
            (vec!["get", "secrets", "--all-namespaces"], "list"),
        ] {
            let (ok, out) = user.kubectl(c, &args)?;
            let want = format!("User \"{user_name}\" cannot {verb} resource \"secrets\"");
            if ok || !out.contains("Forbidden") || !out.contains(&want) {
                return Err(format!(
                    "{}: kubectl {args:?} was not refused as Forbidden ({want:?}):\n{out}",
                    user.who
                )
                .into());
            }
        }
    }
    Ok(())
}

/// One permission the chart grants, next to the code that uses it.
struct Use {
    /// `cluster` (a ClusterRoleBinding) or the namespace of a RoleBinding.
    scope: &'static str,
    group: &'static str,
    resource: &'static str,
    /// `resourceNames`, comma-separated; empty: any.
    names: &'static str,
    verbs: &'static [&'static str],
    /// The file of the code, from the repository root.
    file: &'static str,
    /// A distinctive piece of that code.
    code: &'static str,
}

/// A granted rule: (scope, apiGroup, resource, resourceNames, verb).
type Rule = (String, String, String, String, String);

const fn used(
    scope: &'static str,
    group: &'static str,
    resource: &'static str,
    names: &'static str,
    verbs: &'static [&'static str],
    file: &'static str,
    code: &'static str,
) -> Use {
    Use {
        scope,
        group,
        resource,
        names,
        verbs,
        file,
        code,
    }
}

/// Every rule of the kubelet plugin's ServiceAccount.
const PLUGIN_USES: &[Use] = &[
    // The Node's UID for the slices' owner reference, and its kubelet version.
    used(
        "cluster",
        "",
        "nodes",
        "",
        &["get"],
        "driver/src/slices/wire.rs",
        "Request::new(path::<Node>()).get(name, &GetParams::default())",
    ),
    // The pool's slices, listed by field selector.
    used(
        "cluster",
        "resource.k8s.io",
        "resourceslices",
        "",
        &["list"],
        "driver/src/slices/wire.rs",
        "Request::new(path::<ResourceSlice>()).list(&ListParams::default().fields(selector))",
    ),
    // ... and watched.
    used(
        "cluster",
        "resource.k8s.io",
        "resourceslices",
        "",
        &["watch"],
        "driver/src/slices/publisher.rs",
        "watcher(api, config).default_backoff()",
    ),
    // Server-side apply: a patch, authorized as create when the slice is new.
    used(
        "cluster",
        "resource.k8s.io",
        "resourceslices",
        "",
        &["create", "patch"],
        "driver/src/slices/wire.rs",
        "Request::new(path::<ResourceSlice>()).patch(name, params, &Patch::Apply(slice))",
    ),
    used(
        "cluster",
        "resource.k8s.io",
        "resourceslices",
        "",
        &["delete"],
        "driver/src/slices/wire.rs",
        "Request::new(path::<ResourceSlice>()).delete(name, &DeleteParams::default())",
    ),
    // Prepare reads the claim.
    used(
        "cluster",
        "resource.k8s.io",
        "resourceclaims",
        "",
        &["get"],
        "driver/src/prepare.rs",
        "status::bounded(limit, api.get_opt(&claim.name))",
    ),
    // status.devices: applied (patch), and cleared by read-modify-write (update).
    used(
        "cluster",
        "resource.k8s.io",
        "resourceclaims/status",
        "",
        &["patch"],
        "driver/src/prepare/status.rs",
        "api.patch_status(&claim.name, &params, &patch)",
    ),
    used(
        "cluster",
        "resource.k8s.io",
        "resourceclaims/status",
        "",
        &["update"],
        "driver/src/prepare/status.rs",
        "api.replace_status(&claim.name, &params, &object)",
    ),
    // The same two writes, as the API server authorizes status.devices of
    // this driver from 1.36 (DRAResourceClaimGranularStatusAuthorization).
    used(
        "cluster",
        "resource.k8s.io",
        "resourceclaims/driver",
        DRIVER,
        &["associated-node:patch"],
        "driver/src/prepare/status.rs",
        "api.patch_status(&claim.name, &params, &patch)",
    ),
    used(
        "cluster",
        "resource.k8s.io",
        "resourceclaims/driver",
        DRIVER,
        &["associated-node:update"],
        "driver/src/prepare/status.rs",
        "api.replace_status(&claim.name, &params, &object)",
    ),
    // The health monitor's Event on the Node at each transition.
    used(
        "cluster",
        "events.k8s.io",
        "events",
        "",
        &["create"],
        "driver/src/health/events.rs",
        "api.create(&PostParams::default(), &event)",
    ),
];

/// Every rule of the controller's ServiceAccount.
const CONTROLLER_USES: &[Use] = &[
    // The webhook's DeviceClass cache (and the lifecycle's, lifecycle/mod.rs).
    used(
        "cluster",
        "resource.k8s.io",
        "deviceclasses",
        "",
        &["list", "watch"],
        "controller/src/classes.rs",
        "let api: Api<DeviceClass> = Api::all(client);",
    ),
    // The claim lifecycle's controller over every claim.
    used(
        "cluster",
        "resource.k8s.io",
        "resourceclaims",
        "",
        &["list", "watch"],
        "controller/src/lifecycle/mod.rs",
        "Controller::new(\n        Api::<ResourceClaim>::all(client.clone())",
    ),
    // The slice cache of the simulation and the GC.
    used(
        "cluster",
        "resource.k8s.io",
        "resourceslices",
        "",
        &["list", "watch"],
        "controller/src/lifecycle/mod.rs",
        "watcher(\n        Api::<ResourceSlice>::all(client.clone())",
    ),
    // The GC deletes orphaned slices (UID precondition).
    used(
        "cluster",
        "resource.k8s.io",
        "resourceslices",
        "",
        &["delete"],
        "controller/src/lifecycle/gc.rs",
        "self.slice_api.delete(name, &params)",
    ),
    // The GC's metadata watch of Nodes ...
    used(
        "cluster",
        "",
        "nodes",
        "",
        &["list", "watch"],
        "controller/src/lifecycle/mod.rs",
        "Api::<PartialObjectMeta<Node>>::all(client.clone())",
    ),
    // ... and its re-read before a delete.
    used(
        "cluster",
        "",
        "nodes",
        "",
        &["get"],
        "controller/src/lifecycle/gc.rs",
        ".get_metadata_opt(name)",
    ),
    // "Why pending" Events: listed first (once per explanation), then created.
    used(
        "cluster",
        "events.k8s.io",
        "events",
        "",
        &["list"],
        "controller/src/lifecycle/events.rs",
        "events.list(&params)",
    ),
    used(
        "cluster",
        "events.k8s.io",
        "events",
        "",
        &["create"],
        "controller/src/lifecycle/events.rs",
        ".create(&PostParams::default(), &event)",
    ),
    // Leader election: the Lease created once, then read and renewed by name.
    used(
        DRIVER_NS,
        "coordination.k8s.io",
        "leases",
        "",
        &["create"],
        "controller/src/lifecycle/leader.rs",
        "self.api.create(&PostParams::default(), &lease)",
    ),
    used(
        DRIVER_NS,
        "coordination.k8s.io",
        "leases",
        LEASE,
        &["get"],
        "controller/src/lifecycle/leader.rs",
        "self.api.get_opt(&self.settings.name)",
    ),
    used(
        DRIVER_NS,
        "coordination.k8s.io",
        "leases",
        LEASE,
        &["update"],
        "controller/src/lifecycle/leader.rs",
        ".replace(&name, &PostParams::default(), &updated)",
    ),
];

/// The listed uses as rules.
fn listed(uses: &[Use]) -> BTreeSet<Rule> {
    let mut out = BTreeSet::new();
    for u in uses {
        for verb in u.verbs {
            out.insert((
                u.scope.to_owned(),
                u.group.to_owned(),
                u.resource.to_owned(),
                u.names.to_owned(),
                (*verb).to_owned(),
            ));
        }
    }
    out
}

fn show(rule: &Rule) -> String {
    let (scope, group, resource, names, verb) = rule;
    let scope = if scope.is_empty() {
        String::new()
    } else {
        format!("{scope}: ")
    };
    let group = if group.is_empty() { "core" } else { group };
    let names = if names.is_empty() {
        String::new()
    } else {
        format!("[{names}]")
    };
    format!("{scope}{group} {resource}{names} {verb}")
}

/// The strings of a JSON array field.
fn strings(v: &Value) -> Vec<String> {
    v.as_array()
        .into_iter()
        .flatten()
        .filter_map(|s| s.as_str().map(str::to_owned))
        .collect()
}

/// Expands RBAC `rules` (of a Role or ClusterRole, or of a
/// SelfSubjectRulesReview's `resourceRules`) bound at `scope` into single
/// rules; non-resource rules become `nonResourceURL` rules.
fn expand(scope: &str, rules: &Value, out: &mut BTreeSet<Rule>) {
    for r in rules.as_array().into_iter().flatten() {
        let verbs = strings(&r["verbs"]);
        let mut names = strings(&r["resourceNames"]);
        names.sort();
        let names = names.join(",");
        for url in strings(&r["nonResourceURLs"]) {
            for verb in &verbs {
                out.insert((
                    scope.to_owned(),
                    "nonResourceURL".into(),
                    url.clone(),
                    String::new(),
                    verb.clone(),
                ));
            }
        }
        for group in strings(&r["apiGroups"]) {
            for resource in strings(&r["resources"]) {
                for verb in &verbs {
                    out.insert((
                        scope.to_owned(),
                        group.clone(),
                        resource.clone(),
                        names.clone(),
                        verb.clone(),
                    ));
                }
            }
        }
    }
}

/// The rules the cluster's RBAC objects grant ServiceAccount `sa` of the
/// driver's namespace: through every ClusterRoleBinding and RoleBinding
/// whose subjects name it, or name the ServiceAccount groups it is in
/// (`system:serviceaccounts`, `system:serviceaccounts:<namespace>`), except
/// Kubernetes' own default bindings (labelled
/// `kubernetes.io/bootstrapping: rbac-defaults`: service account issuer
/// and trust bundle discovery, given to every ServiceAccount), which are not
/// the chart's. Also returns the bindings, in words.
fn granted(c: &Cluster, sa: &str) -> Result<(BTreeSet<Rule>, Vec<String>), Failed> {
    let all = |what: &[&str]| -> Result<Vec<Value>, Failed> {
        let mut args = vec!["get"];
        args.extend_from_slice(what);
        args.extend(["-o", "json"]);
        let v: Value = serde_json::from_str(&c.kubectl(&args)?)
            .map_err(|e| format!("kubectl {args:?}: {e}"))?;
        Ok(v["items"].as_array().cloned().unwrap_or_default())
    };
    let cluster_roles: BTreeMap<String, Value> = all(&["clusterroles"])?
        .into_iter()
        .map(|r| {
            (
                r["metadata"]["name"]
                    .as_str()
                    .unwrap_or_default()
                    .to_owned(),
                r,
            )
        })
        .collect();
    let roles: BTreeMap<(String, String), Value> = all(&["roles", "--all-namespaces"])?
        .into_iter()
        .map(|r| {
            (
                (
                    r["metadata"]["namespace"]
                        .as_str()
                        .unwrap_or_default()
                        .to_owned(),
                    r["metadata"]["name"]
                        .as_str()
                        .unwrap_or_default()
                        .to_owned(),
                ),
                r,
            )
        })
        .collect();
    let groups = [
        "system:serviceaccounts".to_owned(),
        format!("system:serviceaccounts:{DRIVER_NS}"),
    ];
    let names_sa = |b: &Value| {
        b["metadata"]["labels"]["kubernetes.io/bootstrapping"] != "rbac-defaults"
            && b["subjects"].as_array().into_iter().flatten().any(|s| {
                (s["kind"] == "ServiceAccount" && s["name"] == sa && s["namespace"] == DRIVER_NS)
                    || (s["kind"] == "Group" && groups.iter().any(|g| s["name"] == g.as_str()))
            })
    };
    let mut rules = BTreeSet::new();
    let mut bindings = Vec::new();
    let mut bindings_json = all(&["clusterrolebindings"])?;
    bindings_json.extend(all(&["rolebindings", "--all-namespaces"])?);
    for b in bindings_json.iter().filter(|b| names_sa(b)) {
        let ns = b["metadata"]["namespace"].as_str();
        let role = b["roleRef"]["name"].as_str().unwrap_or_default().to_owned();
        let scope = ns.unwrap_or("cluster");
        let role_json = match (b["roleRef"]["kind"].as_str(), ns) {
            (Some("ClusterRole"), _) => cluster_roles.get(&role),
            (Some("Role"), Some(ns)) => roles.get(&(ns.to_owned(), role.clone())),
            _ => None,
        }
        .ok_or_else(|| {
            format!(
                "binding {} names a missing role {role}",
                b["metadata"]["name"]
            )
        })?;
        bindings.push(format!(
            "{} {}/{} -> {} {role}",
            b["kind"].as_str().unwrap_or_default(),
            scope,
            b["metadata"]["name"].as_str().unwrap_or_default(),
            b["roleRef"]["kind"].as_str().unwrap_or_default()
        ));
        expand(scope, &role_json["rules"], &mut rules);
    }
    Ok((rules, bindings))
}

/// What user `user` may do in the driver's namespace (cluster-wide rules
/// included), by a SelfSubjectRulesReview made as that user.
fn effective(c: &Cluster, user: &str) -> Result<BTreeSet<Rule>, Failed> {
    let review = format!(
        "{{\"apiVersion\": \"authorization.k8s.io/v1\", \"kind\": \"SelfSubjectRulesReview\", \
         \"spec\": {{\"namespace\": \"{DRIVER_NS}\"}}}}"
    );
    let (ok, out) = c.kubectl_with_input(
        &[
            "create",
            "--as",
            user,
            "--validate=false",
            "-o",
            "json",
            "-f",
            "-",
        ],
        &review,
    )?;
    if !ok {
        return Err(format!("SelfSubjectRulesReview as {user}: {out}").into());
    }
    let v: Value = serde_json::from_str(&out)
        .map_err(|e| format!("SelfSubjectRulesReview as {user}: {e}: {out}"))?;
    if v["status"]["incomplete"] == true {
        return Err(format!(
            "SelfSubjectRulesReview as {user} is incomplete: {}",
            v["status"]
        )
        .into());
    }
    let mut rules = BTreeSet::new();
    expand("", &v["status"]["resourceRules"], &mut rules);
    expand("", &v["status"]["nonResourceRules"], &mut rules);
    Ok(rules)
}

/// Rules without their scope (SelfSubjectRulesReviews do not say it).
fn unscoped(rules: &BTreeSet<Rule>) -> BTreeSet<Rule> {
    rules
        .iter()
        .map(|(_, g, r, n, v)| (String::new(), g.clone(), r.clone(), n.clone(), v.clone()))
        .collect()
}

fn every_rule_used(c: &Cluster) -> Result<(), Failed> {
    // The MPS host talks to no API server: no token, and its
    // ServiceAccount is granted nothing.
    let ds = get_json(c, DRIVER_NS, &["daemonset", MPS_HOST_DS])?;
    let pod_spec = &ds["spec"]["template"]["spec"];
    if pod_spec["automountServiceAccountToken"] != false {
        return Err(
            format!("the MPS host's pods mount a ServiceAccount token: {pod_spec:#}").into(),
        );
    }
    let mps_sa = pod_spec["serviceAccountName"]
        .as_str()
        .unwrap_or("default")
        .to_owned();
    let mps_pods = get_json(
        c,
        DRIVER_NS,
        &["pods", "-l", "app.kubernetes.io/component=mps-host"],
    )?;
    for p in mps_pods["items"].as_array().into_iter().flatten() {
        let token = p["spec"]["volumes"]
            .as_array()
            .into_iter()
            .flatten()
            .flat_map(|v| v["projected"]["sources"].as_array().into_iter().flatten())
            .any(|s| !s["serviceAccountToken"].is_null());
        if token {
            return Err(format!(
                "MPS host pod {} has a ServiceAccount token volume",
                p["metadata"]["name"]
            )
            .into());
        }
    }

    let mut problems = Vec::new();
    let mut report = Vec::new();
    for (sa, uses) in [
        (PLUGIN_SA, PLUGIN_USES),
        (CONTROLLER_SA, CONTROLLER_USES),
        (mps_sa.as_str(), &[][..]),
    ] {
        // The code of each listed rule exists.
        for u in uses {
            let path = c.repo.join(u.file);
            match std::fs::read_to_string(&path) {
                Ok(text) if text.contains(u.code) => {}
                Ok(_) => problems.push(format!(
                    "{sa}: {} {:?}: {} does not contain {:?}",
                    u.resource, u.verbs, u.file, u.code
                )),
                Err(e) => problems.push(format!(
                    "{sa}: {} {:?}: {}: {e}",
                    u.resource,
                    u.verbs,
                    Path::new(u.file).display()
                )),
            }
        }
        let want = listed(uses);
        let (have, bindings) = granted(c, sa)?;
        report.push(format!("{sa}: {} rules through {bindings:?}", have.len()));
        for rule in have.difference(&want) {
            problems.push(format!(
                "{sa}: the cluster grants {}, which no code listed here uses",
                show(rule)
            ));
        }
        for rule in want.difference(&have) {
            problems.push(format!(
                "{sa}: {} is listed as used but the cluster does not grant it",
                show(rule)
            ));
        }
        // Cross-check with what the API server says the ServiceAccount may
        // do, less what any ServiceAccount of another namespace may do.
        let baseline = effective(c, "system:serviceaccount:e2e-security-rbac:nobody")?;
        let may = effective(c, &sa_user(sa))?;
        let listed_unscoped = unscoped(&want);
        for rule in may.difference(&baseline) {
            if !listed_unscoped.contains(rule) {
                problems.push(format!(
                    "{sa}: the API server allows {}, which no code listed here uses",
                    show(rule)
                ));
            }
        }
        for rule in want.iter().filter(|r| r.0 == "cluster" || r.0 == DRIVER_NS) {
            let bare = (
                String::new(),
                rule.1.clone(),
                rule.2.clone(),
                rule.3.clone(),
                rule.4.clone(),
            );
            if !may.contains(&bare) {
                problems.push(format!(
                    "{sa}: the API server does not allow {}",
                    show(rule)
                ));
            }
        }
    }
    if !problems.is_empty() {
        return Err(format!(
            "the chart's RBAC and the code disagree:\n- {}\n({})",
            problems.join("\n- "),
            report.join("; ")
        )
        .into());
    }

    // No request of the running pods was refused for want of a permission
    // (RBAC's "is forbidden: User ... cannot <verb> resource") or by the
    // slice policy. (Other refusals, e.g. an Event in a namespace being
    // deleted, are not the chart's business.)
    for (component, sa) in [("kubelet-plugin", PLUGIN_SA), ("controller", CONTROLLER_SA)] {
        let rbac = format!("is forbidden: User \"{}\" cannot ", sa_user(sa));
        let policy = format!("ValidatingAdmissionPolicy '{POLICY}'");
        let logs = c.kubectl(&[
            "logs",
            "-n",
            DRIVER_NS,
            "-l",
            &format!("app.kubernetes.io/component={component}"),
            "--all-containers",
            "--tail=-1",
        ])?;
        let refused: Vec<&str> = logs
            .lines()
            .filter(|l| l.contains(&rbac) || l.contains(&policy))
            .take(5)
            .collect();
        if !refused.is_empty() {
            return Err(format!(
                "the {component}'s log shows requests refused for want of a permission:\n{}",
                refused.join("\n")
            )
            .into());
        }
    }
    Ok(())
}
