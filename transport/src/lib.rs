//! `uctel-transport`: the verbs-shaped transport API and its implementations.
