//! [`SoftConfig`]: the settings of a soft device (the `transport.soft` section of agent and
//! collector YAML), its [`ProgressMode`], and the device's limits.

use std::net::SocketAddr;

use serde::Deserialize;

use crate::api::{Mtu, OpenError, TransportKind};
use crate::soft::fault::FaultConfig;
use crate::soft::udp::UdpConfig;

/// Largest CQ depth.
pub const MAX_CQ_DEPTH: u32 = 1 << 20;
/// Largest send or receive queue depth.
pub const MAX_QP_WR: u32 = 1 << 16;
/// Largest message the soft device accepts, in bytes ([`PortAttr::max_msg_size`]): 8 MiB, as
/// rxe advertises (`RXE_PORT_MAX_MSG_SZ`), so that nothing built on the soft transport relies
/// on more than a kernel rxe peer accepts. The protocol's own limit is
/// [`IBTA_MAX_MSG_SIZE`] (2^31).
///
/// [`PortAttr::max_msg_size`]: crate::api::PortAttr::max_msg_size
/// [`IBTA_MAX_MSG_SIZE`]: crate::api::IBTA_MAX_MSG_SIZE
pub const SOFT_MAX_MSG_SIZE: u32 = 0x0080_0000;

/// How the device makes progress. See the module docs.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ProgressMode {
    /// A background thread acts as the NIC.
    #[default]
    Thread,
    /// No thread: `poll_cq` drives the device.
    BusyPoll,
    /// No thread: the owner drives the device once per round of its own loop with
    /// [`crate::api::Device::drive`]; `poll_cq` only reads the CQ (one receive per round
    /// however many CQs are polled).
    Driven,
}

/// Configuration of a soft device (the `transport.soft` section of agent and collector YAML).
#[derive(Clone, Debug, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct SoftConfig {
    /// Device name, for logs and metric labels.
    pub name: String,
    /// The UDP socket (bind address, buffers, batch size).
    pub udp: UdpConfig,
    /// Address peers should send to, when `udp.bind` is a wildcard address; `None` = the bind
    /// address.
    pub advertise_addr: Option<SocketAddr>,
    /// Active path MTU in bytes: 256, 512, 1024 (default; rxe's MTU on a 1500-byte netdev),
    /// 2048 or 4096.
    pub mtu_bytes: u32,
    /// Progress mode.
    pub progress: ProgressMode,
    /// Thread mode, in microseconds (1..=1000000): how long a round waits in the link's
    /// `recv` when the link cannot be slept on from outside (in-memory links), and after how
    /// long packets the socket refused are retried. An idle device sleeps without a timeout.
    pub progress_wait_micros: u64,
    /// Most datagrams sent or received per link call (1..=1024).
    pub batch: usize,
    /// Faults injected on the UDP link (testing and demos); `None` = none.
    pub faults: Option<FaultConfig>,
}

impl Default for SoftConfig {
    fn default() -> Self {
        Self {
            name: "soft0".to_owned(),
            udp: UdpConfig::default(),
            advertise_addr: None,
            mtu_bytes: Mtu::Mtu1024.bytes(),
            progress: ProgressMode::Thread,
            progress_wait_micros: 500,
            batch: 64,
            faults: None,
        }
    }
}

impl SoftConfig {
    pub(super) fn validate(&self) -> Result<Mtu, OpenError> {
        let bad = |detail: String| OpenError::InvalidConfig {
            kind: TransportKind::Soft,
            detail,
        };
        let mtu = Mtu::from_bytes(self.mtu_bytes).ok_or_else(|| {
            bad(format!(
                "mtu_bytes {} is not 256, 512, 1024, 2048 or 4096",
                self.mtu_bytes
            ))
        })?;
        if !(1..=1_000_000).contains(&self.progress_wait_micros) {
            return Err(bad(format!(
                "progress_wait_micros {} outside 1..=1000000",
                self.progress_wait_micros
            )));
        }
        if !(1..=1024).contains(&self.batch) {
            return Err(bad(format!("batch {} outside 1..=1024", self.batch)));
        }
        if let Some(f) = &self.faults {
            f.validate().map_err(|e| bad(format!("faults: {e}")))?;
        }
        Ok(mtu)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn config_deserializes_strictly_with_defaults() {
        let cfg: SoftConfig = serde_json::from_str(
            r#"{"udp": {"bind": "127.0.0.1:4791"}, "progress": "busy_poll", "mtu_bytes": 4096,
                "faults": {"drop_ratio": 0.01, "seed": 7}}"#,
        )
        .expect("valid config");
        assert_eq!(cfg.progress, ProgressMode::BusyPoll);
        assert_eq!(cfg.mtu_bytes, 4096);
        assert_eq!(cfg.name, "soft0");
        assert_eq!(cfg.faults.as_ref().map(|f| f.seed), Some(7));
        assert_eq!(cfg.validate().ok(), Some(Mtu::Mtu4096));
        assert!(
            serde_json::from_str::<SoftConfig>(r#"{"mtu": 1024}"#).is_err(),
            "unknown key"
        );
    }

    #[test]
    fn invalid_settings_are_reported() {
        for cfg in [
            SoftConfig {
                mtu_bytes: 1500,
                ..SoftConfig::default()
            },
            SoftConfig {
                batch: 0,
                ..SoftConfig::default()
            },
            SoftConfig {
                progress_wait_micros: 0,
                ..SoftConfig::default()
            },
            SoftConfig {
                faults: Some(FaultConfig {
                    drop_ratio: 2.0,
                    ..FaultConfig::default()
                }),
                ..SoftConfig::default()
            },
        ] {
            assert!(
                matches!(cfg.validate(), Err(OpenError::InvalidConfig { .. })),
                "{cfg:?}"
            );
        }
    }
}
