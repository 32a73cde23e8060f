//! `transport.soft.fault`, the one configuration section both daemons share, and its
//! conversions to and from the soft transport's fault injector configuration; plus the keys
//! both daemons spelt otherwise before.

/// `transport.soft.fault`, the same section in both daemons: seeded fault injection on the
/// soft transport's UDP datagrams, for labs and demos (the daemons turn it into the
/// transport's `FaultConfig`). Every fault is off by default.
#[derive(Clone, Debug, Default, PartialEq, serde::Deserialize, serde::Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct FaultSection {
    /// Probability that a datagram is dropped.
    pub drop_ratio: f64,
    /// Probability that a datagram is sent twice.
    pub duplicate_ratio: f64,
    /// Probability that a datagram is held back and released after 1 to `reorder_window`
    /// later datagrams (after 20 ms when fewer follow); needs `reorder_window` above 0.
    pub reorder_ratio: f64,
    /// Most later datagrams a held-back datagram waits for; 0 turns reordering off.
    pub reorder_window: usize,
    /// Probability that one random bit of a datagram's payload is flipped (the ICRC check
    /// then drops it at the receiver).
    pub corrupt_ratio: f64,
    /// Delay added to every datagram; 0 is none.
    pub delay_milliseconds: u64,
    /// Seed of the fault generator: the same seed gives the same faults.
    pub seed: u64,
    /// Which datagrams the faults apply to.
    pub direction: FaultDirection,
}

/// `transport.soft.fault.direction`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Deserialize, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum FaultDirection {
    /// The datagrams this daemon sends.
    #[default]
    Send,
    /// The datagrams this daemon receives.
    Recv,
    /// Both (a datagram meets the faults once each way it takes).
    Both,
}

impl From<FaultDirection> for uctel_transport::soft::fault::FaultDirection {
    fn from(d: FaultDirection) -> Self {
        match d {
            FaultDirection::Send => Self::Send,
            FaultDirection::Recv => Self::Recv,
            FaultDirection::Both => Self::Both,
        }
    }
}

impl From<uctel_transport::soft::fault::FaultDirection> for FaultDirection {
    fn from(d: uctel_transport::soft::fault::FaultDirection) -> Self {
        use uctel_transport::soft::fault::FaultDirection as D;
        match d {
            D::Send => Self::Send,
            D::Recv => Self::Recv,
            D::Both => Self::Both,
        }
    }
}

/// The transport's fault injector configuration of a `transport.soft.fault` section.
impl From<&FaultSection> for uctel_transport::soft::fault::FaultConfig {
    fn from(f: &FaultSection) -> Self {
        Self {
            drop_ratio: f.drop_ratio,
            duplicate_ratio: f.duplicate_ratio,
            reorder_ratio: f.reorder_ratio,
            reorder_window: f.reorder_window,
            corrupt_ratio: f.corrupt_ratio,
            delay_ms: f.delay_milliseconds,
            seed: f.seed,
            direction: f.direction.into(),
        }
    }
}

/// The `transport.soft.fault` section of a transport fault injector configuration.
impl From<&uctel_transport::soft::fault::FaultConfig> for FaultSection {
    fn from(f: &uctel_transport::soft::fault::FaultConfig) -> Self {
        Self {
            drop_ratio: f.drop_ratio,
            duplicate_ratio: f.duplicate_ratio,
            reorder_ratio: f.reorder_ratio,
            reorder_window: f.reorder_window,
            corrupt_ratio: f.corrupt_ratio,
            delay_milliseconds: f.delay_ms,
            seed: f.seed,
            direction: f.direction.into(),
        }
    }
}

/// Keys both daemons spelt otherwise before, for [`Validate::renamed_keys`](super::Validate::renamed_keys).
pub const RENAMED_SOFT_KEYS: &[(&str, &str)] = &[
    ("transport.soft.faults", "transport.soft.fault"),
    (
        "transport.soft.fault.delay_ms",
        "transport.soft.fault.delay_milliseconds",
    ),
    ("transport.soft.udp.bind", "transport.soft.bind"),
];
