//! Reading the claim to allocate: its requests (plain or `firstAvailable`
//! sub-requests, flattened into "variants"), their classes and compiled
//! selectors, counts, capacity requests, tolerations, and the constraints,
//! with a precise error for everything the API server or the scheduler
//! would refuse.

use std::collections::HashMap;
use std::ops::Range;

use k8s_openapi::api::resource::v1::{
    CapacityRequirements, DeviceClass, DeviceSelector, DeviceToleration, ResourceClaim,
};

use super::capacity::CapacityRequest;
use super::selectors::{SelectorSource, SelectorTable};
use super::{AllocError, MAX_RESULTS_PER_CLAIM};
use crate::cel::{Compiler, split_qualified_name};
use gpu_dra_api::quantity::Quantity;

/// How many devices a variant takes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Mode {
    Count(usize),
    All,
}

/// A request of the claim.
#[derive(Debug)]
pub(crate) struct Request {
    pub name: String,
    /// Its variants (one, or one per sub-request) in `Plan::variants`.
    pub variants: Range<usize>,
}

/// A request, or one sub-request of a `firstAvailable` request.
#[derive(Debug)]
pub(crate) struct Variant {
    /// Index of the request.
    pub request: usize,
    /// Result name: `req` or `req/sub`.
    pub name: String,
    pub class: String,
    /// Selector indices: the class's, then the request's.
    pub selectors: Vec<usize>,
    pub mode: Mode,
    pub admin: bool,
    pub tolerations: Vec<DeviceToleration>,
    pub capacity: Vec<CapacityRequest>,
    /// Indices of the constraints that apply.
    pub constraints: Vec<usize>,
}

/// `matchAttribute` or `distinctAttribute`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ConstraintKind {
    Match,
    Distinct,
}

/// A constraint of the claim.
#[derive(Debug)]
pub(crate) struct Constraint {
    pub kind: ConstraintKind,
    /// The attribute as written (fully qualified).
    pub attribute: String,
    pub domain: String,
    pub id: String,
    /// `domain/id`.
    pub qualified: String,
    /// Requests it applies to; empty means all.
    pub requests: Vec<String>,
}

impl Constraint {
    pub(crate) fn describe(&self, index: usize) -> String {
        let kind = match self.kind {
            ConstraintKind::Match => "matchAttribute",
            ConstraintKind::Distinct => "distinctAttribute",
        };
        let scope = if self.requests.is_empty() {
            "all requests".to_owned()
        } else {
            let names: Vec<String> = self.requests.iter().map(|r| format!("`{r}`")).collect();
            format!("requests {}", names.join(", "))
        };
        format!(
            "{kind} `{}` (constraint {}, {scope})",
            self.attribute,
            index + 1
        )
    }
}

/// The claim, ready to allocate.
#[derive(Debug)]
pub(crate) struct Plan {
    pub requests: Vec<Request>,
    pub variants: Vec<Variant>,
    pub constraints: Vec<Constraint>,
    /// Seed of share IDs: the claim's UID, or namespace/name.
    pub claim_key: String,
}

impl Plan {
    /// The first selector of each variant (the one every device it
    /// considers meets).
    pub(crate) fn first_selectors(&self) -> impl Iterator<Item = usize> + '_ {
        self.variants
            .iter()
            .filter_map(|v| v.selectors.first().copied())
    }
}

fn invalid(field: impl Into<String>, reason: impl Into<String>) -> AllocError {
    AllocError::InvalidClaim {
        field: field.into(),
        reason: reason.into(),
    }
}

/// The fields a request and a sub-request share.
struct Fields<'c> {
    class: &'c str,
    selectors: &'c [DeviceSelector],
    mode: Option<&'c str>,
    count: Option<i64>,
    admin: bool,
    tolerations: &'c [DeviceToleration],
    capacity: Option<&'c CapacityRequirements>,
}

struct Planner<'p> {
    compiler: &'p Compiler,
    classes: &'p HashMap<&'p str, &'p DeviceClass>,
    table: &'p mut SelectorTable,
}

impl Planner<'_> {
    fn compile(
        &mut self,
        selector: &DeviceSelector,
        source: SelectorSource,
    ) -> Result<usize, AllocError> {
        let Some(cel) = &selector.cel else {
            return Err(AllocError::EmptySelector {
                location: source.location(),
            });
        };
        let compiled = self
            .compiler
            .compile(&cel.expression)
            .map_err(|e| AllocError::Compile {
                location: source.location(),
                source: e,
            })?;
        Ok(self.table.add(compiled, source))
    }

    fn class_selectors(
        &mut self,
        class_name: &str,
        request: &str,
    ) -> Result<Vec<usize>, AllocError> {
        if let Some(s) = self.table.class(class_name) {
            return Ok(s.to_vec());
        }
        let Some(class) = self.classes.get(class_name) else {
            return Err(AllocError::UnknownDeviceClass {
                request: request.to_owned(),
                class: class_name.to_owned(),
            });
        };
        let mut indices = Vec::new();
        for (index, s) in class.spec.selectors.iter().flatten().enumerate() {
            let source = SelectorSource::DeviceClass {
                class: class_name.to_owned(),
                index,
            };
            indices.push(self.compile(s, source)?);
        }
        self.table.set_class(class_name, indices.clone());
        Ok(indices)
    }

    fn variant(
        &mut self,
        request: usize,
        name: String,
        f: &Fields<'_>,
        field: &str,
    ) -> Result<Variant, AllocError> {
        if f.class.is_empty() {
            return Err(invalid(
                format!("{field}.deviceClassName"),
                "missing device class name",
            ));
        }
        let mut selectors = self.class_selectors(f.class, &name)?;
        for (index, s) in f.selectors.iter().enumerate() {
            let source = SelectorSource::Request {
                request: name.clone(),
                index,
            };
            selectors.push(self.compile(s, source)?);
        }
        let mode = match f.mode.unwrap_or("ExactCount") {
            "ExactCount" => {
                let count = f.count.unwrap_or(1);
                if count <= 0 {
                    return Err(invalid(
                        format!("{field}.count"),
                        format!("must be greater than zero, got {count}"),
                    ));
                }
                let count = usize::try_from(count)
                    .ok()
                    .filter(|c| *c <= MAX_RESULTS_PER_CLAIM)
                    .ok_or(AllocError::TooManyDevices {
                        requested: count.unsigned_abs(),
                        max: MAX_RESULTS_PER_CLAIM,
                    })?;
                Mode::Count(count)
            }
            "All" => {
                if let Some(count) = f.count {
                    return Err(invalid(
                        format!("{field}.count"),
                        format!("must not be set with allocationMode All, got {count}"),
                    ));
                }
                Mode::All
            }
            other => {
                return Err(invalid(
                    format!("{field}.allocationMode"),
                    format!("unsupported allocation mode {other:?} (ExactCount or All)"),
                ));
            }
        };
        for (i, t) in f.tolerations.iter().enumerate() {
            let op = t.operator.as_deref().unwrap_or("Equal");
            if !matches!(op, "Equal" | "Exists") {
                return Err(invalid(
                    format!("{field}.tolerations[{i}].operator"),
                    format!("unsupported operator {op:?} (Equal or Exists)"),
                ));
            }
        }
        let mut capacity = Vec::new();
        for (cname, q) in f
            .capacity
            .and_then(|c| c.requests.as_ref())
            .into_iter()
            .flatten()
        {
            let path = format!("{field}.capacity.requests[{cname}]");
            if split_qualified_name("driver.invalid", cname).is_err() {
                return Err(invalid(path, "not a capacity name"));
            }
            let amount = Quantity::parse(&q.0).map_err(|e| invalid(path.clone(), e.to_string()))?;
            if amount.signum() < 0 {
                return Err(invalid(path, format!("must not be negative, got {}", q.0)));
            }
            capacity.push(CapacityRequest {
                name: cname.clone(),
                amount: amount.nanos(),
            });
        }
        Ok(Variant {
            request,
            name,
            class: f.class.to_owned(),
            selectors,
            mode,
            admin: f.admin,
            tolerations: f.tolerations.to_vec(),
            capacity,
            constraints: Vec::new(),
        })
    }
}

/// Reads `claim`, compiling its selectors into `table`.
pub(crate) fn plan(
    claim: &ResourceClaim,
    classes: &HashMap<&str, &DeviceClass>,
    table: &mut SelectorTable,
    compiler: &Compiler,
) -> Result<Plan, AllocError> {
    let mut planner = Planner {
        compiler,
        classes,
        table,
    };
    let devices = claim.spec.devices.as_ref();
    let mut requests: Vec<Request> = Vec::new();
    let mut variants: Vec<Variant> = Vec::new();
    let mut min_devices = 0usize;
    for (ri, r) in devices
        .and_then(|d| d.requests.as_ref())
        .into_iter()
        .flatten()
        .enumerate()
    {
        let field = format!("spec.devices.requests[{ri}]");
        if r.name.is_empty() {
            return Err(invalid(format!("{field}.name"), "must not be empty"));
        }
        if requests.iter().any(|x| x.name == r.name) {
            return Err(invalid(
                format!("{field}.name"),
                format!("duplicate request name {:?}", r.name),
            ));
        }
        let start = variants.len();
        match (&r.exactly, &r.first_available) {
            (Some(e), None) => {
                let f = Fields {
                    class: &e.device_class_name,
                    selectors: e.selectors.as_deref().unwrap_or(&[]),
                    mode: e.allocation_mode.as_deref(),
                    count: e.count,
                    admin: e.admin_access == Some(true),
                    tolerations: e.tolerations.as_deref().unwrap_or(&[]),
                    capacity: e.capacity.as_ref(),
                };
                variants.push(planner.variant(
                    ri,
                    r.name.clone(),
                    &f,
                    &format!("{field}.exactly"),
                )?);
            }
            (None, Some(subs)) => {
                if subs.is_empty() {
                    return Err(invalid(
                        format!("{field}.firstAvailable"),
                        "must not be empty",
                    ));
                }
                for (si, s) in subs.iter().enumerate() {
                    let sfield = format!("{field}.firstAvailable[{si}]");
                    if s.name.is_empty() {
                        return Err(invalid(format!("{sfield}.name"), "must not be empty"));
                    }
                    if subs[..si].iter().any(|x| x.name == s.name) {
                        return Err(invalid(
                            format!("{sfield}.name"),
                            format!("duplicate sub-request name {:?}", s.name),
                        ));
                    }
                    let f = Fields {
                        class: &s.device_class_name,
                        selectors: s.selectors.as_deref().unwrap_or(&[]),
                        mode: s.allocation_mode.as_deref(),
                        count: s.count,
                        admin: false,
                        tolerations: s.tolerations.as_deref().unwrap_or(&[]),
                        capacity: s.capacity.as_ref(),
                    };
                    variants.push(planner.variant(
                        ri,
                        format!("{}/{}", r.name, s.name),
                        &f,
                        &sfield,
                    )?);
                }
            }
            (Some(_), Some(_)) => {
                return Err(invalid(
                    field,
                    "exactly one of exactly and firstAvailable may be set, not both",
                ));
            }
            (None, None) => {
                return Err(invalid(
                    field,
                    "one of exactly and firstAvailable must be set",
                ));
            }
        }
        min_devices += variants[start..]
            .iter()
            .map(|v| match v.mode {
                Mode::Count(n) => n,
                Mode::All => 1,
            })
            .min()
            .unwrap_or(0);
        requests.push(Request {
            name: r.name.clone(),
            variants: start..variants.len(),
        });
    }
    if min_devices > MAX_RESULTS_PER_CLAIM {
        return Err(AllocError::TooManyDevices {
            requested: min_devices as u64,
            max: MAX_RESULTS_PER_CLAIM,
        });
    }

    let mut constraints = Vec::new();
    for (ci, c) in devices
        .and_then(|d| d.constraints.as_ref())
        .into_iter()
        .flatten()
        .enumerate()
    {
        let field = format!("spec.devices.constraints[{ci}]");
        let (kind, attribute, afield) = match (&c.match_attribute, &c.distinct_attribute) {
            (Some(a), None) => (ConstraintKind::Match, a, "matchAttribute"),
            (None, Some(a)) => (ConstraintKind::Distinct, a, "distinctAttribute"),
            (Some(_), Some(_)) => {
                return Err(invalid(
                    field,
                    "exactly one of matchAttribute and distinctAttribute may be set",
                ));
            }
            (None, None) => {
                return Err(invalid(
                    field,
                    "one of matchAttribute and distinctAttribute must be set",
                ));
            }
        };
        // with an empty driver domain, a name without a domain is refused
        // like one with an empty domain: only `<domain>/<id>` passes
        let Ok((domain, id)) = split_qualified_name("", attribute) else {
            return Err(invalid(
                format!("{field}.{afield}"),
                format!("{attribute:?} is not a fully qualified attribute name (<domain>/<id>)"),
            ));
        };
        let names = c.requests.clone().unwrap_or_default();
        for (i, n) in names.iter().enumerate() {
            if !variants.iter().any(|v| v.name == *n) && !requests.iter().any(|r| r.name == *n) {
                return Err(invalid(
                    format!("{field}.requests[{i}]"),
                    format!("unknown request {n:?}"),
                ));
            }
        }
        constraints.push(Constraint {
            kind,
            attribute: attribute.clone(),
            domain: domain.to_owned(),
            id: id.to_owned(),
            qualified: format!("{domain}/{id}"),
            requests: names,
        });
    }
    if constraints.len() > 64 {
        return Err(invalid(
            "spec.devices.constraints",
            "more than 64 constraints",
        ));
    }
    for v in &mut variants {
        let request = &requests[v.request].name;
        v.constraints = constraints
            .iter()
            .enumerate()
            .filter(|(_, c)| {
                c.requests.is_empty() || c.requests.iter().any(|n| n == request || *n == v.name)
            })
            .map(|(i, _)| i)
            .collect();
    }
    let claim_key = claim.metadata.uid.clone().unwrap_or_else(|| {
        format!(
            "{}/{}",
            claim.metadata.namespace.as_deref().unwrap_or(""),
            claim.metadata.name.as_deref().unwrap_or("")
        )
    });
    Ok(Plan {
        requests,
        variants,
        constraints,
        claim_key,
    })
}
