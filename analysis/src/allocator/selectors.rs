//! The seam between the allocator and CEL: the selectors of one simulation
//! (compiled once, class selectors shared by the requests of a class), what
//! each can read of a device, and a memo of results keyed by those values.
//!
//! A selector that reads the device only through `device.driver`,
//! `device.allowMultipleAllocations` and `device.attributes[D].x` /
//! `device.capacity[D].x` with literal `D` and `x` (as `.x`, `[x]`, `.?x`,
//! `[?x]` or inside `has()`) gives the same result, or the same error, for
//! every device with the same values there: the memo reuses it, so a
//! thousand nodes of identical GPUs cost a handful of CEL evaluations. Any
//! other use of `device` (iterating a map, `size(device.attributes[D])`,
//! a comprehension variable named `device`) makes the selector
//! "unprojectable": it is evaluated for every device.

use std::collections::HashMap;
use std::fmt;
use std::sync::Arc;

use cel::common::ast::{Expr, IdedExpr, LiteralValue, operators};
use k8s_openapi::api::resource::v1::Device;

use super::device::{RawValue, lookup, raw_attribute, raw_capacity};
use super::intern::{FastMap, OVERFLOW_ID};
use crate::cel::{EvalError, Selector};

/// Where a selector comes from.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum SelectorSource {
    /// Selector `index` (0-based) of a DeviceClass.
    DeviceClass {
        /// The class.
        class: String,
        /// Position in `spec.selectors`.
        index: usize,
    },
    /// Selector `index` (0-based) of a request or sub-request.
    Request {
        /// The request (`main/sub` for a sub-request).
        request: String,
        /// Position in `selectors`.
        index: usize,
    },
}

impl fmt::Display for SelectorSource {
    /// Human form, 1-based: "selector 2 of request `gpu`".
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SelectorSource::DeviceClass { class, index } => {
                write!(f, "selector {} of device class `{class}`", index + 1)
            }
            SelectorSource::Request { request, index } => {
                write!(f, "selector {} of request `{request}`", index + 1)
            }
        }
    }
}

impl SelectorSource {
    /// Kubernetes' form for errors, 0-based: "device class gpu: selector #0".
    pub(crate) fn location(&self) -> String {
        match self {
            SelectorSource::DeviceClass { class, index } => {
                format!("device class {class}: selector #{index}")
            }
            SelectorSource::Request { request, index } => {
                format!("request {request}: selector #{index}")
            }
        }
    }
}

/// Something of the device a selector reads.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(crate) enum Read {
    Driver,
    AllowMultiple,
    Attribute(Key),
    Capacity(Key),
}

/// An attribute or capacity by domain and id.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(crate) struct Key {
    pub domain: String,
    pub id: String,
    /// `domain/id`.
    pub qualified: String,
}

impl Key {
    fn new(domain: &str, id: &str) -> Self {
        Key {
            domain: domain.to_owned(),
            id: id.to_owned(),
            qualified: format!("{domain}/{id}"),
        }
    }
}

impl Read {
    /// The value of this read on a raw device of `driver`.
    pub(crate) fn raw<'a>(&self, device: &'a Device, driver: &'a str) -> RawValue<'a> {
        match self {
            Read::Driver => RawValue::Str(driver),
            Read::AllowMultiple => {
                RawValue::Bool(device.allow_multiple_allocations.unwrap_or(false))
            }
            Read::Attribute(k) => raw_attribute(lookup(
                device.attributes.as_ref(),
                driver,
                &k.domain,
                &k.id,
                &k.qualified,
            )),
            Read::Capacity(k) => raw_capacity(lookup(
                device.capacity.as_ref(),
                driver,
                &k.domain,
                &k.id,
                &k.qualified,
            )),
        }
    }

    /// Short human name: `memory`, `gpu.nvidia.com/type` for a foreign
    /// domain is shown fully.
    pub(crate) fn label(&self, driver: &str) -> String {
        match self {
            Read::Driver => "driver".to_owned(),
            Read::AllowMultiple => "allowMultipleAllocations".to_owned(),
            Read::Attribute(k) | Read::Capacity(k) if k.domain == driver => k.id.clone(),
            Read::Attribute(k) | Read::Capacity(k) => k.qualified.clone(),
        }
    }
}

/// One compiled selector of the simulation.
#[derive(Debug)]
pub(crate) struct Entry {
    pub selector: Arc<Selector>,
    pub source: SelectorSource,
    /// What the result depends on; `None` when it cannot be told.
    pub projection: Option<Vec<Read>>,
    /// Everything recognisably read, for explanations.
    pub mentions: Vec<Read>,
}

/// The selectors of one simulation.
#[derive(Debug, Default)]
pub(crate) struct SelectorTable {
    pub entries: Vec<Entry>,
    by_class: HashMap<String, Vec<usize>>,
}

impl SelectorTable {
    /// Adds a compiled selector; returns its index.
    pub(crate) fn add(&mut self, selector: Arc<Selector>, source: SelectorSource) -> usize {
        let (projection, mentions) = analyze(&selector.program);
        self.entries.push(Entry {
            selector,
            source,
            projection,
            mentions,
        });
        self.entries.len() - 1
    }

    /// The selectors of a class, if already added.
    pub(crate) fn class(&self, class: &str) -> Option<&[usize]> {
        self.by_class.get(class).map(Vec::as_slice)
    }

    pub(crate) fn set_class(&mut self, class: &str, indices: Vec<usize>) {
        self.by_class.insert(class.to_owned(), indices);
    }
}

/// What the memo knows about a selector on a device.
pub(crate) enum Recall {
    /// Seen before.
    Hit(Result<bool, EvalError>),
    /// Not seen: evaluate, then [`Memo::store`] the result.
    Miss,
}

/// Results of projectable selectors by (selector, ids of the values read).
#[derive(Debug, Default, Clone)]
pub(crate) struct Memo {
    selectors: Vec<SelectorMemo>,
    /// The key of the last miss.
    key: Vec<u32>,
    pub hits: u64,
    pub evaluations: u64,
}

/// The results of one selector.
#[derive(Debug, Default, Clone)]
struct SelectorMemo {
    results: FastMap<Vec<u32>, Result<bool, EvalError>>,
    /// The last key recalled and its result: devices of a pool come in runs
    /// of equal values, so most recalls need no hashing.
    last_key: Vec<u32>,
    last: Option<Result<bool, EvalError>>,
}

impl Memo {
    /// Looks up `selector` for a device whose read values have these ids.
    pub(crate) fn recall(&mut self, selector: usize, ids: impl Iterator<Item = u32>) -> Recall {
        self.key.clear();
        self.key.extend(ids);
        if self.selectors.len() <= selector {
            self.selectors
                .resize_with(selector + 1, SelectorMemo::default);
        }
        let memo = &mut self.selectors[selector];
        if let Some(r) = &memo.last
            && same(&memo.last_key, &self.key)
        {
            self.hits += 1;
            return Recall::Hit(r.clone());
        }
        match memo.results.get(self.key.as_slice()) {
            Some(r) => {
                self.hits += 1;
                memo.last_key.clone_from(&self.key);
                memo.last = Some(r.clone());
                Recall::Hit(r.clone())
            }
            None => Recall::Miss,
        }
    }

    /// Stores the result for the key of the last [`Recall::Miss`] (unless
    /// ids ran out: such a key stands for more than one value).
    pub(crate) fn store(&mut self, selector: usize, result: Result<bool, EvalError>) {
        if self.key.contains(&OVERFLOW_ID) {
            return;
        }
        let memo = &mut self.selectors[selector];
        memo.last_key.clone_from(&self.key);
        memo.last = Some(result.clone());
        memo.results.insert(self.key.clone(), result);
    }
}

/// Whether two (short) keys are equal, compared in place.
fn same(a: &[u32], b: &[u32]) -> bool {
    a.len() == b.len() && a.iter().zip(b).all(|(x, y)| x == y)
}

/// The reads of a selector: (projection if complete, everything seen).
fn analyze(program: &IdedExpr) -> (Option<Vec<Read>>, Vec<Read>) {
    let mut walker = Walker {
        reads: Vec::new(),
        projectable: true,
        shadowed: 0,
    };
    walker.walk(program);
    let reads = walker.reads;
    (walker.projectable.then(|| reads.clone()), reads)
}

struct Walker {
    reads: Vec<Read>,
    projectable: bool,
    /// Comprehensions in scope that declare a variable named `device`.
    shadowed: usize,
}

fn literal(e: &IdedExpr) -> Option<&str> {
    match &e.expr {
        Expr::Literal(LiteralValue::String(s)) => Some(s.inner()),
        _ => None,
    }
}

fn is_device(e: &IdedExpr) -> bool {
    matches!(&e.expr, Expr::Ident(n) if n == "device")
}

/// `device.f` or `device["f"]`.
fn device_field(e: &IdedExpr) -> Option<&str> {
    match &e.expr {
        Expr::Select(s) if !s.test && is_device(&s.operand) => Some(&s.field),
        Expr::Call(c)
            if c.func_name == operators::INDEX
                && c.target.is_none()
                && c.args.len() == 2
                && is_device(&c.args[0]) =>
        {
            literal(&c.args[1])
        }
        _ => None,
    }
}

#[derive(Clone, Copy)]
enum MapKind {
    Attributes,
    Capacity,
}

/// `device.attributes[D]` / `device.capacity.D` and the like.
fn domain_map(e: &IdedExpr) -> Option<(MapKind, &str)> {
    let (operand, domain) = match &e.expr {
        Expr::Select(s) if !s.test => (&*s.operand, s.field.as_str()),
        Expr::Call(c)
            if c.func_name == operators::INDEX && c.target.is_none() && c.args.len() == 2 =>
        {
            (&c.args[0], literal(&c.args[1])?)
        }
        _ => return None,
    };
    match device_field(operand)? {
        "attributes" => Some((MapKind::Attributes, domain)),
        "capacity" => Some((MapKind::Capacity, domain)),
        _ => None,
    }
}

impl Walker {
    /// The read `e` is, if it is one.
    fn read(e: &IdedExpr) -> Option<Read> {
        let entry = |map: &IdedExpr, id: &str| {
            domain_map(map).map(|(kind, domain)| {
                let key = Key::new(domain, id);
                match kind {
                    MapKind::Attributes => Read::Attribute(key),
                    MapKind::Capacity => Read::Capacity(key),
                }
            })
        };
        let field = |f: &str| match f {
            "driver" => Some(Read::Driver),
            "allowMultipleAllocations" => Some(Read::AllowMultiple),
            _ => None,
        };
        match &e.expr {
            Expr::Select(s) if !s.test && is_device(&s.operand) => field(&s.field),
            Expr::Select(s) => entry(&s.operand, &s.field),
            Expr::Call(c)
                if c.target.is_none()
                    && c.args.len() == 2
                    && [
                        operators::INDEX,
                        operators::OPT_INDEX,
                        operators::OPT_SELECT,
                    ]
                    .contains(&c.func_name.as_str()) =>
            {
                let id = literal(&c.args[1])?;
                if c.func_name == operators::INDEX && is_device(&c.args[0]) {
                    return field(id);
                }
                entry(&c.args[0], id)
            }
            _ => None,
        }
    }

    fn walk(&mut self, e: &IdedExpr) {
        if self.shadowed == 0
            && let Some(read) = Self::read(e)
        {
            if !self.reads.contains(&read) {
                self.reads.push(read);
            }
            return;
        }
        match &e.expr {
            Expr::Ident(name) if name == "device" => {
                // a use of the whole device (or of a shadowing variable)
                if self.shadowed == 0 {
                    self.projectable = false;
                }
            }
            Expr::Ident(_) | Expr::Literal(_) | Expr::Unspecified => {}
            Expr::Select(s) => self.walk(&s.operand),
            Expr::Call(c) => {
                if let Some(t) = &c.target {
                    self.walk(t);
                }
                for a in &c.args {
                    self.walk(a);
                }
            }
            Expr::List(l) => {
                for i in &l.elements {
                    self.walk(i);
                }
            }
            Expr::Map(m) => {
                for entry in &m.entries {
                    match &entry.expr {
                        cel::common::ast::EntryExpr::MapEntry(me) => {
                            self.walk(&me.key);
                            self.walk(&me.value);
                        }
                        cel::common::ast::EntryExpr::StructField(f) => self.walk(&f.value),
                    }
                }
            }
            Expr::Struct(s) => {
                for entry in &s.entries {
                    if let cel::common::ast::EntryExpr::StructField(f) = &entry.expr {
                        self.walk(&f.value);
                    }
                }
            }
            Expr::Comprehension(c) => {
                self.walk(&c.iter_range);
                self.walk(&c.accu_init);
                let shadows = c.iter_var == "device"
                    || c.accu_var == "device"
                    || c.iter_var2.as_deref() == Some("device");
                if shadows {
                    // reads inside refer to the local variable, not the
                    // device: be safe and give up on the memo
                    self.projectable = false;
                    self.shadowed += 1;
                }
                self.walk(&c.loop_cond);
                self.walk(&c.loop_step);
                self.walk(&c.result);
                if shadows {
                    self.shadowed -= 1;
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cel::Compiler;

    fn reads(expr: &str) -> (Option<Vec<Read>>, Vec<Read>) {
        let compiler = Compiler::new();
        let selector = compiler.compile(expr).unwrap();
        analyze(&selector.program)
    }

    fn attr(domain: &str, id: &str) -> Read {
        Read::Attribute(Key::new(domain, id))
    }

    fn cap(domain: &str, id: &str) -> Read {
        Read::Capacity(Key::new(domain, id))
    }

    #[test]
    fn nvidia_selectors_are_projectable() {
        let (p, _) = reads(
            "device.driver == 'gpu.nvidia.com' && device.attributes['gpu.nvidia.com'].type == 'gpu'",
        );
        assert_eq!(
            p.unwrap(),
            vec![Read::Driver, attr("gpu.nvidia.com", "type")]
        );
        let (p, _) =
            reads("device.capacity['gpu.nvidia.com'].memory.isGreaterThan(quantity('40Gi'))");
        assert_eq!(p.unwrap(), vec![cap("gpu.nvidia.com", "memory")]);
        let (p, _) = reads(
            "has(device.attributes['gpu.nvidia.com'].profile) && device.attributes['gpu.nvidia.com']['profile'] == '1g.10gb'",
        );
        assert_eq!(p.unwrap(), vec![attr("gpu.nvidia.com", "profile")]);
        let (p, _) = reads(
            "device.attributes['gpu.nvidia.com'].?index.orValue(0) < 4 && device.allowMultipleAllocations",
        );
        assert_eq!(
            p.unwrap(),
            vec![attr("gpu.nvidia.com", "index"), Read::AllowMultiple]
        );
        let (p, _) = reads("device['driver'] == 'x' && device['attributes']['x'][?'y'].hasValue()");
        assert_eq!(p.unwrap(), vec![Read::Driver, attr("x", "y")]);
    }

    #[test]
    fn whole_maps_and_shadowing_are_not_projectable() {
        let (p, m) = reads(
            "'type' in device.attributes['gpu.nvidia.com'] && device.attributes['gpu.nvidia.com'].type == 'gpu'",
        );
        assert!(p.is_none());
        assert_eq!(m, vec![attr("gpu.nvidia.com", "type")]);
        assert!(
            reads("size(device.capacity['gpu.nvidia.com']) > 2")
                .0
                .is_none()
        );
        assert!(reads("device.attributes.exists(d, d == 'x')").0.is_none());
        assert!(reads("[1, 2].exists(device, device == 2)").0.is_none());
        assert!(
            reads("device.attributes['gpu.nvidia.com'][device.driver] == 1")
                .0
                .is_none()
        );
    }

    #[test]
    fn sources_display_one_based_and_locate_zero_based() {
        let s = SelectorSource::Request {
            request: "gpu".into(),
            index: 1,
        };
        assert_eq!(s.to_string(), "selector 2 of request `gpu`");
        assert_eq!(s.location(), "request gpu: selector #1");
    }
}
