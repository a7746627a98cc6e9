//! A whole GPU: its device node in the claim's CDI spec, and, with dynamic
//! MIG, MIG mode switched off first if no MIG device is left on it. Nothing
//! to undo: MIG mode stays off until a MIG claim needs it again, and an
//! admin-access device only gets its node.

use super::{Kind, Setup};
use crate::prepare::error::PrepareError;
use crate::prepare::mig;
use crate::prepare::plan::Target;

/// The whole-GPU kind.
pub(crate) struct WholeGpu;

impl Kind for WholeGpu {
    fn setup(&self, claim: &mut Setup<'_>, i: usize) -> Result<(), PrepareError> {
        let d = claim.device(i);
        let Target::Gpu(g) = &d.target else {
            return Ok(());
        };
        let nodes = claim.inner.nodes.gpu(g.minor)?;
        claim.spec.add_gpu(&claim.names[i], &nodes)?;
        if !d.admin && g.dynamic_mig {
            mig::ensure_full_gpu(&*claim.inner.backend, g.index).map_err(|error| {
                PrepareError::Mig {
                    device: d.device.clone(),
                    error,
                }
            })?;
        }
        Ok(())
    }
}
