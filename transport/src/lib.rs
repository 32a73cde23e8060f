//! `uctel-transport`: the verbs-shaped transport API and its implementations.

pub mod api;
pub mod soft;
