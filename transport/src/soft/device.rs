//! (being written)
use crate::api::{Device, OpenError, TransportKind};
/// Soft device configuration.
#[derive(Clone, Debug)]
pub struct SoftConfig {}
/// Soft device.
#[derive(Debug)]
pub struct SoftDevice;
impl SoftDevice {
    /// Opens.
    pub fn open(_c: &SoftConfig) -> Result<Device, OpenError> {
        Err(OpenError::Unsupported { kind: TransportKind::Soft, detail: String::new() })
    }
}
