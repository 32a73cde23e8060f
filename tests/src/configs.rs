//! Collector and agent configurations for the tests, derived from the example files in
//! `config/` the way an operator adapts them: load the example, change the addresses, paths
//! and a few knobs, write the YAML next to the daemon's log. Only keys the example documents
//! are set, so a renamed key fails the daemon's strict config check loudly.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use serde_yaml::{Mapping, Value};

/// A YAML document being edited.
#[derive(Debug, Clone)]
pub struct Yaml(pub Value);

impl Yaml {
    /// Loads `config/<name>` from the workspace.
    ///
    /// # Panics
    /// If the example is missing or not YAML.
    pub fn example(name: &str) -> Yaml {
        let path = crate::workspace_root().join("config").join(name);
        let text = std::fs::read_to_string(&path)
            .unwrap_or_else(|e| panic!("reading {}: {e}", path.display()));
        Yaml(
            serde_yaml::from_str(&text)
                .unwrap_or_else(|e| panic!("parsing {}: {e}", path.display())),
        )
    }

    /// Sets the dotted `key` (`transport.soft.fault.drop_ratio`) to `value`, creating
    /// mappings on the way.
    ///
    /// # Panics
    /// If a part of the path exists and is not a mapping.
    pub fn set(&mut self, key: &str, value: impl Into<Value>) -> &mut Self {
        let mut node = &mut self.0;
        let parts: Vec<&str> = key.split('.').collect();
        for (i, part) in parts.iter().enumerate() {
            if node.is_null() {
                *node = Value::Mapping(Mapping::new());
            }
            let Value::Mapping(map) = node else {
                panic!("{key}: {part} is inside a non-mapping");
            };
            let k = Value::String((*part).to_owned());
            if i + 1 == parts.len() {
                map.insert(k, value.into());
                return self;
            }
            if !map.contains_key(&k) {
                map.insert(k.clone(), Value::Mapping(Mapping::new()));
            }
            node = map
                .get_mut(&k)
                .unwrap_or_else(|| panic!("{key}: cannot descend into {part}"));
        }
        self
    }

    /// Removes the dotted `key` if present.
    pub fn remove(&mut self, key: &str) -> &mut Self {
        let parts: Vec<&str> = key.split('.').collect();
        let Some((last, path)) = parts.split_last() else {
            return self;
        };
        let mut node = &mut self.0;
        for part in path {
            match node {
                Value::Mapping(map) => match map.get_mut(Value::String((*part).to_owned())) {
                    Some(n) => node = n,
                    None => return self,
                },
                _ => return self,
            }
        }
        if let Value::Mapping(map) = node {
            map.remove(Value::String((*last).to_owned()));
        }
        self
    }

    /// The value at the dotted `key`.
    pub fn get(&self, key: &str) -> Option<&Value> {
        let mut node = &self.0;
        for part in key.split('.') {
            node = node.as_mapping()?.get(Value::String(part.to_owned()))?;
        }
        Some(node)
    }

    /// Writes the document to `path`.
    ///
    /// # Panics
    /// If it cannot be serialised or written.
    pub fn write(&self, path: &Path) {
        let text = serde_yaml::to_string(&self.0).unwrap_or_else(|e| panic!("serialising: {e}"));
        std::fs::write(path, text).unwrap_or_else(|e| panic!("writing {}: {e}", path.display()));
    }
}

/// Addresses of a collector under test.
#[derive(Debug, Clone, Copy)]
pub struct CollectorAddrs {
    /// Control plane (TCP).
    pub control: SocketAddr,
    /// `/metrics` (HTTP).
    pub metrics: SocketAddr,
    /// Soft RoCEv2 UDP socket.
    pub udp: SocketAddr,
}

impl CollectorAddrs {
    /// Three free loopback addresses.
    pub fn free() -> CollectorAddrs {
        CollectorAddrs {
            control: crate::net::free_addr(),
            metrics: crate::net::free_addr(),
            udp: crate::net::free_addr(),
        }
    }
}

/// The demo token of the example configs (the tests use the shared-token mode).
pub const TOKEN: &str = "uctel-e2e-token";

/// `config/collector.yaml` on `addrs`, logs to a JSON Lines file in `dir`, reports every
/// second.
pub fn collector(addrs: &CollectorAddrs, dir: &Path) -> Yaml {
    let mut y = Yaml::example("collector.yaml");
    y.set("listen.control", addrs.control.to_string())
        .set("listen.metrics", addrs.metrics.to_string())
        .set("auth.shared.token", TOKEN)
        .set("control.report_interval_seconds", 1)
        .set("logs.sink", "file")
        .set(
            "logs.file.path",
            dir.join("collector-logs.jsonl").display().to_string(),
        );
    y.set("transport.soft.bind", addrs.udp.to_string());
    y
}

/// Options of one test agent.
#[derive(Debug, Clone)]
pub struct AgentOptions {
    /// `agent_id`.
    pub id: String,
    /// Local `/metrics`.
    pub metrics: SocketAddr,
    /// A log file the agent tails (read from the beginning).
    pub log_file: PathBuf,
    /// `transport.soft.fault.drop_ratio` (0 = off).
    pub drop_ratio: f64,
    /// Seconds between host-metric collections.
    pub host_interval_seconds: f64,
}

/// `config/agent.yaml` for one agent of a test pipeline.
pub fn agent(o: &AgentOptions, collector_control: SocketAddr, dir: &Path) -> Yaml {
    let mut y = Yaml::example("agent.yaml");
    y.set("agent_id", o.id.as_str())
        .set("collector.control", collector_control.to_string())
        .set("collector.reconnect_initial_seconds", 0.2)
        .set("collector.reconnect_max_seconds", 2.0)
        .set("listen.metrics", o.metrics.to_string())
        .remove("auth.token_file")
        .set("auth.token", TOKEN)
        .set(
            "sources.host_metrics.interval_seconds",
            o.host_interval_seconds,
        )
        .set("sources.self_metrics.interval_seconds", 1.0)
        .set(
            "sources.state_directory",
            dir.join(format!("{}-state", o.id)).display().to_string(),
        );
    let mut log = Mapping::new();
    log.insert("path".into(), o.log_file.display().to_string().into());
    log.insert("start_at".into(), "beginning".into());
    y.set("sources.logs", Value::Sequence(vec![Value::Mapping(log)]));
    if o.drop_ratio > 0.0 {
        y.set("transport.soft.fault.drop_ratio", o.drop_ratio)
            .set("transport.soft.fault.seed", 42);
    } else {
        y.remove("transport.soft.fault");
    }
    y
}
