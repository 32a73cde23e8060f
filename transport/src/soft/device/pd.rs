//! The soft protection domain ([`SoftPd`]): registers MRs and creates QPs.

use std::sync::Arc;

use crate::api::backend::{MrOps, PdOps, QpOps};
use crate::api::{AccessFlags, CreateQpError, QpInitAttr, RegMrError};

use super::mr::SoftMrHandle;
use super::qp::SoftQp;
use super::shared::Shared;

/// A soft protection domain (the soft device has one key space; see [`crate::soft::memory`]).
#[derive(Debug)]
pub struct SoftPd {
    pub(super) shared: Arc<Shared>,
}

impl PdOps for SoftPd {
    fn reg_mr(&self, len: usize, access: AccessFlags) -> Result<Arc<dyn MrOps>, RegMrError> {
        let mr = self.shared.mrs.register(len, access)?;
        Ok(Arc::new(SoftMrHandle {
            mr,
            table: Arc::clone(&self.shared.mrs),
        }))
    }

    fn create_qp(&self, attr: &QpInitAttr<'_>) -> Result<Arc<dyn QpOps>, CreateQpError> {
        SoftQp::create(&self.shared, attr).map(|qp| qp as Arc<dyn QpOps>)
    }
}
