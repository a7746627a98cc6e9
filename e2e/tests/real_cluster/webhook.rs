//! The controller's validating admission webhook as the real API server
//! calls it, and its claim diagnostics as a user meets them:
//!
//! - a DeviceClass with a misspelt attribute, a ResourceClaim comparing a
//!   string attribute with an int, a ResourceClaimTemplate with an invalid
//!   `GpuConfig`, and `demo/invalid-selector.yaml` are each refused by
//!   `kubectl apply` with the webhook's cause (the field path and the
//!   message of the mistake, with its hint) and are not stored, and the
//!   API server's answer is the webhook's denial (422 Invalid, `admission
//!   webhook "validate.gpu.nvidia.com" denied the request: <Kind> "<name>"
//!   is invalid for driver gpu.nvidia.com (...)`; kubectl prints the causes
//!   of an Invalid answer, not its message); the same objects with the
//!   mistake fixed are admitted.
//! - a claim no device can satisfy (`demo/too-much-memory.yaml`), used by a
//!   pod: the scheduler leaves the pod Pending (Unschedulable) and the
//!   controller explains why in a Warning Event on the claim.

use std::time::{Duration, Instant};

use kube::Api;
use kube::api::{ApiResource, DynamicObject, GroupVersionKind, PostParams};
use kube::core::Status;
use libtest_mimic::Failed;
use serde_json::Value;

use crate::claims::{check_pod, claim_yaml, get_json};
use crate::harness::{Cluster, DRIVER, DRIVER_NS};

pub const TESTS: [(&str, crate::Test); 5] = [
    (
        "webhook::a_device_class_with_a_misspelt_attribute_is_refused",
        device_class_typo,
    ),
    (
        "webhook::a_claim_comparing_a_string_with_an_int_is_refused",
        claim_type_error,
    ),
    (
        "webhook::a_template_with_an_invalid_gpu_config_is_refused",
        template_bad_config,
    ),
    (
        "webhook::demo_invalid_selector_is_refused",
        demo_invalid_selector,
    ),
    (
        "webhook::an_unallocatable_claim_is_explained_in_an_event",
        unallocatable_claim_explained,
    ),
];

/// The webhook's name in the chart (`validate.<driverName>`).
const WEBHOOK: &str = "validate.gpu.nvidia.com";
/// The ValidatingWebhookConfiguration of the chart (the controller's name).
const WEBHOOK_CONFIG: &str = "gpu-dra-driver-controller";
/// The webhook's Service, in front of the controller's pods.
const WEBHOOK_SERVICE: &str = "gpu-dra-driver-webhook";
/// `reportingController` of the controller's Events (`<driver>/controller`).
const REPORTING_CONTROLLER: &str = "gpu.nvidia.com/controller";
/// Reason of the controller's Event on a claim no node can satisfy
/// (controller/src/lifecycle/events.rs).
const REASON_UNALLOCATABLE: &str = "Unallocatable";
/// How long the Event may take: the chart values of the test cluster set
/// `pendingGracePeriod: 5s`; the rest is the scheduler's first attempt and
/// the controller's reconcile.
const EXPLAINED_WITHIN: Duration = Duration::from_secs(90);

/// Checks that the chart's webhook is registered and calls the
/// controller's service.
fn webhook_registered(c: &Cluster) -> Result<(), Failed> {
    let config = get_json(
        c,
        "default",
        &["validatingwebhookconfiguration", WEBHOOK_CONFIG],
    )?;
    let service = config["webhooks"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|w| w["name"] == WEBHOOK)
        .map(|w| &w["clientConfig"]["service"])
        .ok_or_else(|| {
            format!("ValidatingWebhookConfiguration {WEBHOOK_CONFIG} has no webhook {WEBHOOK}")
        })?;
    if service["namespace"] != DRIVER_NS
        || service["name"] != WEBHOOK_SERVICE
        || service["path"] != "/validate"
    {
        return Err(format!(
            "webhook {WEBHOOK} does not call {DRIVER_NS}/{WEBHOOK_SERVICE} /validate: {service}"
        )
        .into());
    }
    Ok(())
}

/// What the API server answers when `yaml` is created in `ns` (as a
/// server-side dry run: admission runs, nothing is stored): the Status of
/// the refusal, `None` when it was admitted.
fn api_refusal(c: &Cluster, ns: &str, yaml: &str) -> Result<Option<Status>, Failed> {
    let value: Value = yaml_serde::from_str(yaml).map_err(|e| format!("{e}: {yaml}"))?;
    let object: DynamicObject =
        serde_json::from_value(value).map_err(|e| format!("{e}: {yaml}"))?;
    let kind = object
        .types
        .as_ref()
        .map(|t| t.kind.clone())
        .unwrap_or_default();
    let resource = ApiResource::from_gvk(&GroupVersionKind::gvk("resource.k8s.io", "v1", &kind));
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| format!("a tokio runtime: {e}"))?;
    runtime.block_on(async {
        let client = c.client().await?;
        let api: Api<DynamicObject> = if kind == "DeviceClass" {
            Api::all_with(client, &resource)
        } else {
            Api::namespaced_with(client, ns, &resource)
        };
        let params = PostParams {
            dry_run: true,
            ..PostParams::default()
        };
        match api.create(&params, &object).await {
            Ok(_) => Ok(None),
            Err(kube::Error::Api(status)) => Ok(Some(*status)),
            Err(e) => Err(format!("creating {kind}: {e}").into()),
        }
    })
}

/// Checks that the webhook refuses `yaml` (of `kind` `name`, created in
/// `ns`) for a mistake at field `path` whose message has every one of
/// `expect`: `kubectl apply` fails with the webhook's cause (kubectl shows
/// the causes of an `Invalid` answer, not its message), nothing is stored,
/// and the API server's answer is the webhook's denial (its name, the
/// `<Kind> "<name>" is invalid for driver ...` head, the cause's field).
fn refused(
    c: &Cluster,
    ns: &str,
    yaml: &str,
    (kind, name): (&str, &str),
    path: &str,
    expect: &[&str],
) -> Result<(), Failed> {
    let (ok, out) = c.kubectl_with_input(&["apply", "-n", ns, "-f", "-"], yaml)?;
    if ok {
        return Err(format!(
            "{kind} {name} was admitted; the webhook should have refused it:\n{out}\n{yaml}"
        )
        .into());
    }
    let head = format!("The {kind} \"{name}\" is invalid: {path}: ");
    let missing: Vec<&str> = [head.as_str()]
        .into_iter()
        .chain(expect.iter().copied())
        .filter(|want| !out.contains(want))
        .collect();
    if !missing.is_empty() {
        return Err(format!(
            "kubectl apply of {kind} {name} was refused, but not for the mistake: missing {missing:?} in\n{out}"
        )
        .into());
    }
    let stored = c.kubectl(&[
        "get",
        "-n",
        ns,
        kind,
        name,
        "--ignore-not-found",
        "-o",
        "name",
    ])?;
    if !stored.trim().is_empty() {
        return Err(format!("{kind} {name} was refused but is stored: {stored}").into());
    }

    let Some(status) = api_refusal(c, ns, yaml)? else {
        return Err(format!("{kind} {name} was admitted by a server-side dry run").into());
    };
    let denial = format!(
        "admission webhook \"{WEBHOOK}\" denied the request: {kind} \"{name}\" is invalid for driver {DRIVER} ("
    );
    let causes: Vec<(String, String)> = status
        .details
        .as_ref()
        .map(|d| {
            d.causes
                .iter()
                .map(|c| (c.field.clone(), c.message.clone()))
                .collect()
        })
        .unwrap_or_default();
    let cause_found = causes
        .iter()
        .any(|(field, message)| field == path && expect.iter().all(|e| message.contains(e)));
    if status.code != 422
        || status.reason != "Invalid"
        || !status.message.starts_with(&denial)
        || !status.message.contains(&format!("\n- {path}: "))
        || !cause_found
    {
        return Err(format!(
            "{kind} {name}: the API server's answer is not the webhook's denial \
             (want 422 Invalid, a message starting {denial:?} listing {path}, a cause at {path} \
             with {expect:?}): {} {} {:?}\ncauses: {causes:#?}",
            status.code, status.reason, status.message
        )
        .into());
    }
    Ok(())
}

/// Applies `yaml` in `ns` and checks that it was admitted and stored.
fn admitted(c: &Cluster, ns: &str, yaml: &str, (kind, name): (&str, &str)) -> Result<(), Failed> {
    let (ok, out) = c.kubectl_with_input(&["apply", "-n", ns, "-f", "-"], yaml)?;
    if !ok {
        return Err(
            format!("{kind} {name} (the mistake fixed) was refused:\n{out}\n{yaml}").into(),
        );
    }
    let stored = c.kubectl(&["get", "-n", ns, kind, name, "-o", "name"])?;
    if stored.trim().is_empty() {
        return Err(format!("{kind} {name} was admitted but is not stored").into());
    }
    Ok(())
}

/// A DeviceClass of the driver's whole GPUs narrowed by `selector`.
fn device_class(name: &str, selector: &str) -> String {
    format!(
        "apiVersion: resource.k8s.io/v1
kind: DeviceClass
metadata: {{name: {name}}}
spec:
  selectors:
  - cel: {{expression: \"device.driver == '{DRIVER}' && device.attributes['{DRIVER}'].type == 'gpu'\"}}
  - cel: {{expression: {selector}}}
",
        selector = serde_json::to_string(selector).expect("a string")
    )
}

fn device_class_typo(c: &Cluster) -> Result<(), Failed> {
    webhook_registered(c)?;
    // Cluster-scoped: a name of its own, deleted before and after.
    let name = "e2e-webhook-a100.gpu.nvidia.com";
    let delete = || {
        c.kubectl(&[
            "delete",
            "deviceclass",
            name,
            "--ignore-not-found",
            "--wait=true",
        ])
    };
    delete()?;
    let result = (|| {
        let typo = "device.attributes['gpu.nvidia.com'].productname.startsWith('NVIDIA A100')";
        refused(
            c,
            "default",
            &device_class(name, typo),
            ("DeviceClass", name),
            "spec.selectors[1].cel.expression",
            &[
                "`productname` is not an attribute of gpu.nvidia.com; did you mean `productName`?",
                "hint: device.attributes['gpu.nvidia.com'].productName.startsWith('NVIDIA A100')",
            ],
        )?;
        let fixed = "device.attributes['gpu.nvidia.com'].productName.startsWith('NVIDIA A100')";
        admitted(
            c,
            "default",
            &device_class(name, fixed),
            ("DeviceClass", name),
        )
    })();
    delete()?;
    result
}

fn claim_type_error(c: &Cluster) -> Result<(), Failed> {
    webhook_registered(c)?;
    let ns = "e2e-webhook-claim";
    c.fresh_namespace(ns)?;
    let name = "string-vs-int";
    let wrong = claim_yaml(
        name,
        "gpu.nvidia.com",
        &["device.attributes['gpu.nvidia.com'].productName == 100"],
        "",
        "",
    );
    refused(
        c,
        ns,
        &wrong,
        ("ResourceClaim", name),
        "spec.devices.requests[0].exactly.selectors[0].cel.expression",
        &[
            "`device.attributes['gpu.nvidia.com'].productName` is a string and `100` an int: \
             `==` between them is always false",
        ],
    )?;
    let fixed = claim_yaml(
        name,
        "gpu.nvidia.com",
        &["device.attributes['gpu.nvidia.com'].productName == 'NVIDIA A100-SXM4-80GB'"],
        "",
        "",
    );
    admitted(c, ns, &fixed, ("ResourceClaim", name))?;
    c.kubectl(&["delete", "namespace", ns, "--wait=false"])?;
    Ok(())
}

/// A ResourceClaimTemplate of one GPU with an opaque `GpuConfig` whose
/// `sharing` is `sharing`.
fn template(name: &str, sharing: &str) -> String {
    format!(
        "apiVersion: resource.k8s.io/v1
kind: ResourceClaimTemplate
metadata: {{name: {name}}}
spec:
  spec:
    devices:
      requests:
      - name: gpu
        exactly: {{deviceClassName: gpu.nvidia.com}}
      config:
      - requests: [gpu]
        opaque:
          driver: {DRIVER}
          parameters:
            apiVersion: resource.nvidia.com/v1beta1
            kind: GpuConfig
            sharing: {sharing}
"
    )
}

fn template_bad_config(c: &Cluster) -> Result<(), Failed> {
    webhook_registered(c)?;
    let ns = "e2e-webhook-template";
    c.fresh_namespace(ns)?;
    let name = "time-sliced";
    // A strategy that does not exist.
    refused(
        c,
        ns,
        &template(name, "{strategy: TimeSharing}"),
        ("ResourceClaimTemplate", name),
        "spec.spec.devices.config[0].opaque.parameters.sharing.strategy",
        &["unknown variant `TimeSharing`, expected `TimeSlicing` or `MPS`"],
    )?;
    // A field that does not exist (misspelt `timeSlicingConfig`).
    refused(
        c,
        ns,
        &template(
            name,
            "{strategy: TimeSlicing, timeSliceConfig: {interval: Long}}",
        ),
        ("ResourceClaimTemplate", name),
        "spec.spec.devices.config[0].opaque.parameters.sharing.timeSliceConfig",
        &[
            "unknown field `timeSliceConfig`, expected one of `strategy`, `timeSlicingConfig`, `mpsConfig`",
        ],
    )?;
    admitted(
        c,
        ns,
        &template(
            name,
            "{strategy: TimeSlicing, timeSlicingConfig: {interval: Long}}",
        ),
        ("ResourceClaimTemplate", name),
    )?;
    c.kubectl(&["delete", "namespace", ns, "--wait=false"])?;
    Ok(())
}

fn demo_invalid_selector(c: &Cluster) -> Result<(), Failed> {
    webhook_registered(c)?;
    let ns = "e2e-webhook-demo";
    c.fresh_namespace(ns)?;
    let path = c.repo.join("demo/invalid-selector.yaml");
    let yaml = std::fs::read_to_string(&path).map_err(|e| format!("{}: {e}", path.display()))?;
    refused(
        c,
        ns,
        &yaml,
        ("ResourceClaim", "invalid-selector"),
        "spec.devices.requests[0].exactly.selectors[0].cel.expression",
        &[
            "`productname` is not an attribute of gpu.nvidia.com; did you mean `productName`?",
            "hint: device.attributes['gpu.nvidia.com'].productName.startsWith('NVIDIA H100')",
        ],
    )?;
    // The file's own fix, as its comment says: `productName`.
    admitted(
        c,
        ns,
        &yaml.replace(".productname.", ".productName."),
        ("ResourceClaim", "invalid-selector"),
    )?;
    c.kubectl(&["delete", "namespace", ns, "--wait=false"])?;
    Ok(())
}

/// The Events recorded on claim `claim` in `ns` (events.k8s.io/v1).
fn claim_events(c: &Cluster, ns: &str, claim: &str) -> Result<Vec<Value>, Failed> {
    let list = get_json(c, ns, &["events.v1.events.k8s.io"])?;
    Ok(list["items"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|e| e["regarding"]["kind"] == "ResourceClaim" && e["regarding"]["name"] == claim)
        .cloned()
        .collect())
}

fn unallocatable_claim_explained(c: &Cluster) -> Result<(), Failed> {
    let ns = "e2e-webhook-pending";
    c.fresh_namespace(ns)?;
    let path = c.repo.join("demo/too-much-memory.yaml");
    let yaml = std::fs::read_to_string(&path).map_err(|e| format!("{}: {e}", path.display()))?;
    let claim = "too-much-memory";
    // Valid: the webhook admits it.
    c.apply(ns, &yaml)?;
    let pod = "wants-too-much-memory";
    c.apply(
        ns,
        &check_pod(pod, &[("gpu", &format!("resourceClaimName: {claim}"))]),
    )?;

    let start = Instant::now();
    let mut unschedulable = false;
    let mut explained: Option<Value> = None;
    let mut last_events = Vec::new();
    while start.elapsed() < EXPLAINED_WITHIN && !(unschedulable && explained.is_some()) {
        let p = get_json(c, ns, &["pod", pod])?;
        let phase = p["status"]["phase"].as_str().unwrap_or_default();
        if phase != "Pending" {
            return Err(format!(
                "pod {pod} on the unallocatable claim left Pending: phase {phase}\n{p:#}"
            )
            .into());
        }
        unschedulable = p["status"]["conditions"]
            .as_array()
            .into_iter()
            .flatten()
            .any(|cond| {
                cond["type"] == "PodScheduled"
                    && cond["status"] == "False"
                    && cond["reason"] == "Unschedulable"
            });
        last_events = claim_events(c, ns, claim)?;
        explained = last_events
            .iter()
            .find(|e| {
                e["reportingController"] == REPORTING_CONTROLLER
                    && e["reason"] == REASON_UNALLOCATABLE
            })
            .cloned();
        std::thread::sleep(Duration::from_millis(500));
    }
    let describe = c
        .kubectl(&["describe", "-n", ns, "pod", pod])
        .unwrap_or_default();
    if !unschedulable {
        return Err(format!(
            "pod {pod} was not reported Unschedulable within {EXPLAINED_WITHIN:?}:\n{describe}"
        )
        .into());
    }
    let Some(event) = explained else {
        return Err(format!(
            "no {REASON_UNALLOCATABLE} Event from {REPORTING_CONTROLLER} on claim {claim} within \
             {EXPLAINED_WITHIN:?}; its events: {last_events:#?}"
        )
        .into());
    };
    let note = event["note"].as_str().unwrap_or_default();
    let mut wrong = Vec::new();
    if event["type"] != "Warning" {
        wrong.push(format!("type {} (want Warning)", event["type"]));
    }
    if event["action"] != "SimulateAllocation" {
        wrong.push(format!(
            "action {} (want SimulateAllocation)",
            event["action"]
        ));
    }
    // The explanation names the node, the request and the selector that
    // rules every device out, and the device that came closest.
    for want in [
        "node `gpu-dra-node`",
        "devices match selector 1 of request `gpu`",
        "device.capacity['gpu.nvidia.com'].memory.compareTo(quantity('256Gi')) >= 0",
        "closest device",
    ] {
        if !note.contains(want) {
            wrong.push(format!("the note does not mention {want:?}"));
        }
    }
    if !wrong.is_empty() {
        return Err(
            format!("the controller's Event on claim {claim}: {wrong:?}\n{event:#}").into(),
        );
    }
    // The claim itself stays unallocated.
    let claim_json = get_json(c, ns, &["resourceclaim", claim])?;
    if !claim_json["status"]["allocation"].is_null() {
        return Err(format!("claim {claim} was allocated: {claim_json:#}").into());
    }
    c.kubectl(&["delete", "namespace", ns, "--wait=false"])?;
    Ok(())
}
