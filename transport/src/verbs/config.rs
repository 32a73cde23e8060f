//! [`VerbsConfig`]: which RDMA device, port and GID the verbs transport uses. Always compiled
//! (without the cargo feature `verbs` too), so that configuration parses everywhere and
//! [`Device::open`](crate::api::Device::open) can say that the transport is not built in.

use std::net::IpAddr;

/// Configuration of the verbs transport.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct VerbsConfig {
    /// RDMA device name (`ibv_get_device_name`, e.g. `mlx5_0`, `rxe0`); `None` = the first.
    pub device: Option<String>,
    /// Port number (1-based, `ibv_query_port`).
    pub port_num: u8,
    /// GID table index; `None` = the RoCE v2 GID of `local_ip` (or the first RoCE v2 GID).
    pub gid_index: Option<u8>,
    /// Local IP address whose RoCE v2 GID to use when `gid_index` is `None`.
    pub local_ip: Option<IpAddr>,
}

impl Default for VerbsConfig {
    fn default() -> Self {
        Self {
            device: None,
            port_num: 1,
            gid_index: None,
            local_ip: None,
        }
    }
}
