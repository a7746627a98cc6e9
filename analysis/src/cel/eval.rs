//! Evaluating compiled selectors against one device: the device is
//! converted to a CEL value once, when the evaluator is made, and every
//! selector of the round is evaluated against that value.

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::Arc;

use cel::common::types::CelBool;
use cel::{Context, Env, ExecutionError, Value};

use super::compile::{Compiler, Selector};
use super::cost;
use super::device::CelDevice;
use super::{EvalError, panic_message};

/// Stack of the thread that evaluates unusually deep programs: the
/// interpreter uses about 35 KiB per tree level in a debug build, and
/// instrumented programs are at most about twice [`Limits::max_depth`]
/// levels deep.
///
/// [`Limits::max_depth`]: super::Limits::max_depth
const DEEP_EVAL_STACK: usize = 64 << 20;

/// Evaluates selectors against one device.
pub struct Evaluator {
    context: Context<'static, 'static>,
    cost_limit: u64,
}

impl std::fmt::Debug for Evaluator {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Evaluator")
            .field("cost_limit", &self.cost_limit)
            .finish_non_exhaustive()
    }
}

impl Evaluator {
    /// Converts `device` for the compiler's environment.
    pub fn new(compiler: &Compiler, device: &CelDevice) -> Self {
        Evaluator::with_env(
            Arc::clone(&compiler.env),
            compiler.limits.runtime_cost_limit,
            device,
        )
    }

    fn with_env(env: Arc<Env>, cost_limit: u64, device: &CelDevice) -> Self {
        let mut context = Context::with_env(env);
        context.add_variable_as_val("device", device.to_value());
        Evaluator {
            context,
            cost_limit,
        }
    }

    /// Whether the device satisfies `selector`. Errors (a missing attribute,
    /// a non-bool result, the cost limit) are errors, never `false`, as in
    /// kube-scheduler.
    pub fn matches(&self, selector: &Selector) -> Result<bool, EvalError> {
        if selector.inline {
            return self.evaluate(selector);
        }
        std::thread::scope(|scope| {
            std::thread::Builder::new()
                .name("cel-eval".to_owned())
                .stack_size(DEEP_EVAL_STACK)
                .spawn_scoped(scope, || self.evaluate(selector))
                .map_err(|e| {
                    EvalError::Internal(format!("cannot start the evaluation thread: {e}"))
                })?
                .join()
                .unwrap_or_else(|p| Err(EvalError::Internal(panic_message(p.as_ref()))))
        })
    }

    /// Whether the device satisfies all `selectors` (a DeviceClass's, then a
    /// request's); stops at the first `false` or error.
    pub fn matches_all<'a>(
        &self,
        selectors: impl IntoIterator<Item = &'a Selector>,
    ) -> Result<bool, EvalError> {
        for selector in selectors {
            if !self.matches(selector)? {
                return Ok(false);
            }
        }
        Ok(true)
    }

    fn evaluate(&self, selector: &Selector) -> Result<bool, EvalError> {
        cost::start(self.cost_limit);
        let result = catch_unwind(AssertUnwindSafe(|| {
            Value::resolve_val(&selector.program, &self.context).map(|v| {
                v.downcast_ref::<CelBool>()
                    .map(|b| *b.inner())
                    .ok_or_else(|| v.get_type().name().to_owned())
            })
        }));
        let exceeded = cost::exceeded();
        match result {
            Err(panic) => Err(EvalError::Internal(panic_message(panic.as_ref()))),
            Ok(_) if exceeded => Err(EvalError::CostLimitExceeded {
                limit: self.cost_limit,
            }),
            Ok(Ok(Ok(b))) => Ok(b),
            Ok(Ok(Err(type_name))) => Err(EvalError::NotBool(type_name)),
            Ok(Err(ExecutionError::NoSuchKey(key))) => Err(EvalError::NoSuchKey(key.to_string())),
            Ok(Err(e)) => Err(EvalError::Runtime(e.to_string())),
        }
    }
}

impl Compiler {
    /// An evaluator for `device` (converted once; reuse it for every selector
    /// of the evaluation round).
    pub fn evaluator(&self, device: &CelDevice) -> Evaluator {
        Evaluator::new(self, device)
    }
}
