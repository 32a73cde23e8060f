//! Opening a [`Device`] from configuration: [`DeviceConfig`] names the transport and its
//! settings, [`Device::open`] starts it.
//!
//! This is the only module that names both transports ([`crate::soft`] and [`crate::verbs`]);
//! everything else is written against [`crate::api`]. Each transport owns its configuration
//! type ([`SoftConfig`] beside the soft device, [`VerbsConfig`] beside the verbs transport);
//! both are re-exported here so that callers import one module.

#[cfg(not(feature = "verbs"))]
use crate::api::TransportKind;
use crate::api::{Device, OpenError};
pub use crate::soft::device::SoftConfig;
pub use crate::verbs::VerbsConfig;

/// Which device to open. Agent and collector map their YAML `transport:` section to this.
#[derive(Clone, Debug)]
pub enum DeviceConfig {
    /// The soft transport: RoCEv2 UC over a UDP socket.
    Soft(SoftConfig),
    /// The verbs transport (needs the cargo feature `verbs` to open).
    Verbs(VerbsConfig),
}

impl Device {
    /// Opens the device described by `config`.
    ///
    /// Soft: binds the UDP socket and, in [`crate::soft::device::ProgressMode::Thread`], starts
    /// the progress thread. Verbs: opens the named RDMA device.
    ///
    /// # Errors
    /// [`OpenError::Unsupported`] when the transport is not built in, [`OpenError::Io`] when the
    /// socket/device cannot be opened, [`OpenError::InvalidConfig`] for inconsistent settings.
    pub fn open(config: &DeviceConfig) -> Result<Device, OpenError> {
        match config {
            DeviceConfig::Soft(cfg) => crate::soft::device::SoftDevice::open(cfg).map(Device::from),
            #[cfg(feature = "verbs")]
            DeviceConfig::Verbs(cfg) => crate::verbs::open(cfg),
            #[cfg(not(feature = "verbs"))]
            DeviceConfig::Verbs(_) => Err(OpenError::Unsupported {
                kind: TransportKind::Verbs,
                detail: "the verbs transport is not built into this binary (cargo feature \
                         `verbs`)"
                    .to_owned(),
            }),
        }
    }
}
