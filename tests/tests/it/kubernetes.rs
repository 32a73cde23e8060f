//! The Kubernetes manifests in `config/kubernetes/` hang together: the agent DaemonSet sees
//! the node (host network and PID namespace, `/proc`, `/sys`, `/` and the kubelet's
//! pod-resources directory read-only, `IPC_LOCK`,
//! its id from the node's name), its configuration reads those mounts and names the
//! collectors' headless Service as its pool; the collector StatefulSet's ports, probes and
//! drain match its configuration and the Service; both embedded configurations pass the
//! real daemons' `--check-config`; and every manifest passes kubernetes-validate's strict
//! check against the Kubernetes OpenAPI schemas (`kustomization.yaml` excepted: it is
//! kustomize's file, not a Kubernetes API object, and the tool has no schema for it).

use std::path::{Path, PathBuf};
use std::process::Command;

use serde_yaml::Value;

/// Every YAML document of every `config/kubernetes/*.yaml` file, with its file name.
fn documents() -> Vec<(String, Value)> {
    let dir = uctel_tests::workspace_root().join("config/kubernetes");
    let mut files: Vec<_> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|e| e.unwrap_or_else(|e| panic!("{e}")).path())
        .filter(|p| p.extension().is_some_and(|x| x == "yaml"))
        .collect();
    files.sort();
    let mut out = Vec::new();
    for f in files {
        let text = std::fs::read_to_string(&f).unwrap_or_else(|e| panic!("{}: {e}", f.display()));
        let name = f
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        // Documents are separated by `---` lines (no other multi-document syntax is used).
        for doc in text.split("\n---\n") {
            let v: Value = serde_yaml::from_str(doc).unwrap_or_else(|e| panic!("{name}: {e}"));
            out.push((name.clone(), v));
        }
    }
    out
}

fn find<'a>(docs: &'a [(String, Value)], kind: &str, name: &str) -> &'a Value {
    docs.iter()
        .map(|(_, v)| v)
        .find(|v| v["kind"] == kind && v["metadata"]["name"] == name)
        .unwrap_or_else(|| panic!("no {kind} {name}"))
}

fn container(workload: &Value) -> &Value {
    &workload["spec"]["template"]["spec"]["containers"][0]
}

/// The mount of `container` at `path`, and the pod volume it mounts.
fn mount<'a>(workload: &'a Value, path: &str) -> (&'a Value, &'a Value) {
    let m = container(workload)["volumeMounts"]
        .as_sequence()
        .into_iter()
        .flatten()
        .find(|m| m["mountPath"] == path)
        .unwrap_or_else(|| panic!("nothing mounted at {path}"));
    let v = workload["spec"]["template"]["spec"]["volumes"]
        .as_sequence()
        .into_iter()
        .flatten()
        .find(|v| v["name"] == m["name"])
        .unwrap_or_else(|| panic!("no volume {:?}", m["name"]));
    (m, v)
}

/// The daemon configuration embedded in ConfigMap `name` under `key`.
fn embedded(docs: &[(String, Value)], name: &str, key: &str) -> Value {
    let text = find(docs, "ConfigMap", name)["data"][key]
        .as_str()
        .unwrap_or_else(|| panic!("ConfigMap {name} has no {key}"));
    serde_yaml::from_str(text).unwrap_or_else(|e| panic!("{name}/{key}: {e}"))
}

fn str_of(v: &Value) -> &str {
    v.as_str().unwrap_or_else(|| panic!("not a string: {v:?}"))
}

#[test]
fn the_agent_daemonset_sees_the_node_and_finds_the_collector_pool() {
    let docs = documents();
    let ds = find(&docs, "DaemonSet", "uctel-agent");
    let pod = &ds["spec"]["template"]["spec"];
    assert_eq!(pod["hostNetwork"], true);
    assert_eq!(pod["hostPID"], true);
    assert_eq!(pod["dnsPolicy"], "ClusterFirstWithHostNet");
    let c = container(ds);
    assert!(
        c["securityContext"]["capabilities"]["add"]
            .as_sequence()
            .is_some_and(|s| s.iter().any(|x| x == "IPC_LOCK")),
        "IPC_LOCK"
    );
    let id = c["env"]
        .as_sequence()
        .into_iter()
        .flatten()
        .find(|e| e["name"] == "UCTEL_AGENT_ID")
        .unwrap_or_else(|| panic!("no UCTEL_AGENT_ID"));
    assert_eq!(id["valueFrom"]["fieldRef"]["fieldPath"], "spec.nodeName");

    let config = embedded(&docs, "uctel-agent", "agent.yaml");
    let h = &config["sources"]["host_metrics"];
    for (key, host) in [
        ("procfs_path", "/proc"),
        ("sysfs_path", "/sys"),
        ("rootfs_path", "/"),
    ] {
        let (m, v) = mount(ds, str_of(&h[key]));
        assert_eq!(m["readOnly"], true, "{key} mounted read-only");
        assert_eq!(v["hostPath"]["path"], host, "{key} is the node's {host}");
    }
    // Pods: the kubelet's pod-resources socket is in a read-only mount of the node's
    // directory, and device ids are looked up in the node's /sys.
    let p = &config["sources"]["pod_resources"];
    let socket = Path::new(str_of(&p["socket_path"]));
    let dir = socket
        .parent()
        .map(|d| d.display().to_string())
        .unwrap_or_default();
    let (m, v) = mount(ds, &dir);
    assert_eq!(m["readOnly"], true, "pod-resources mounted read-only");
    assert_eq!(v["hostPath"]["path"], "/var/lib/kubelet/pod-resources");
    assert_eq!(p["sysfs_path"], h["sysfs_path"]);
    // The pool: the headless Service's DNS name and control port.
    let svc = find(&docs, "Service", "uctel-collector");
    assert_eq!(
        svc["spec"]["clusterIP"], "None",
        "headless: one address per collector"
    );
    let ns = str_of(&svc["metadata"]["namespace"]);
    let control_port = svc["spec"]["ports"]
        .as_sequence()
        .into_iter()
        .flatten()
        .find(|p| p["name"] == "control")
        .map(|p| p["port"].as_u64().unwrap_or(0))
        .unwrap_or(0);
    assert_eq!(
        config["collector"]["control"],
        format!("uctel-collector.{ns}.svc.cluster.local:{control_port}").as_str()
    );
    // The arguments name the mounted configuration.
    let args: Vec<&str> = c["args"]
        .as_sequence()
        .into_iter()
        .flatten()
        .map(str_of)
        .collect();
    let parent = Path::new(args[1])
        .parent()
        .map(|p| p.display().to_string())
        .unwrap_or_default();
    let (_, v) = mount(ds, &parent);
    assert_eq!(v["configMap"]["name"], "uctel-agent");
}

#[test]
fn the_collector_statefulset_matches_its_configuration_and_service_and_drains() {
    let docs = documents();
    let sts = find(&docs, "StatefulSet", "uctel-collector");
    let config = embedded(&docs, "uctel-collector", "collector.yaml");
    let port_of = |addr: &Value| {
        str_of(addr)
            .rsplit_once(':')
            .and_then(|(_, p)| p.parse::<u64>().ok())
            .unwrap_or(0)
    };
    let c = container(sts);
    let ports: Vec<(u64, &str)> = c["ports"]
        .as_sequence()
        .into_iter()
        .flatten()
        .map(|p| {
            (
                p["containerPort"].as_u64().unwrap_or(0),
                str_of(&p["protocol"]),
            )
        })
        .collect();
    let svc = find(&docs, "Service", "uctel-collector");
    let svc_ports: Vec<(u64, &str)> = svc["spec"]["ports"]
        .as_sequence()
        .into_iter()
        .flatten()
        .map(|p| (p["port"].as_u64().unwrap_or(0), str_of(&p["protocol"])))
        .collect();
    for want in [
        (port_of(&config["listen"]["control"]), "TCP"),
        (port_of(&config["listen"]["metrics"]), "TCP"),
        (port_of(&config["transport"]["soft"]["bind"]), "UDP"),
    ] {
        assert!(
            ports.contains(&want),
            "container ports {ports:?} lack {want:?}"
        );
        assert!(
            svc_ports.contains(&want),
            "Service ports {svc_ports:?} lack {want:?}"
        );
    }
    assert_eq!(c["readinessProbe"]["httpGet"]["path"], "/-/ready");
    assert_eq!(c["livenessProbe"]["httpGet"]["path"], "/-/healthy");
    let pre_stop: Vec<&str> = c["lifecycle"]["preStop"]["exec"]["command"]
        .as_sequence()
        .into_iter()
        .flatten()
        .map(str_of)
        .collect();
    assert!(
        pre_stop.concat().contains("kill -USR1 1"),
        "preStop drains: {pre_stop:?}"
    );
    let grace = sts["spec"]["template"]["spec"]["terminationGracePeriodSeconds"]
        .as_f64()
        .unwrap_or(0.0);
    let drain = config["control"]["drain_timeout_seconds"]
        .as_f64()
        .unwrap_or(30.0);
    assert!(
        grace > drain,
        "grace {grace} s must outlast the drain {drain} s"
    );
    assert_eq!(sts["spec"]["serviceName"], "uctel-collector");
    let kustomization = std::fs::read_to_string(
        uctel_tests::workspace_root().join("config/kubernetes/kustomization.yaml"),
    )
    .unwrap_or_else(|e| panic!("{e}"));
    for (file, _) in &documents() {
        assert!(
            kustomization.contains(file.as_str()) || file == "kustomization.yaml",
            "{file}"
        );
    }
}

/// Writes `config` with its token file, log file and state paths moved into `dir`; the path
/// of the file.
fn localised(mut config: Value, dir: &Path, name: &str) -> std::path::PathBuf {
    let token = dir.join("token");
    std::fs::write(&token, "k8s-test-token\n").unwrap_or_else(|e| panic!("{e}"));
    // Replaces the value at `keys` where the configuration has one; adds nothing.
    let set = |v: &mut Value, keys: &[&str], value: String| {
        let mut at = Some(v);
        for k in keys {
            at = at.and_then(|a| a.get_mut(*k));
        }
        if let Some(a) = at {
            *a = Value::from(value);
        }
    };
    let t = token.display().to_string();
    set(&mut config, &["auth", "token_file"], t.clone());
    set(&mut config, &["auth", "shared", "token_file"], t);
    set(
        &mut config,
        &["logs", "file", "path"],
        dir.join("logs.jsonl").display().to_string(),
    );
    set(
        &mut config,
        &["sources", "state_directory"],
        dir.join("state").display().to_string(),
    );
    for (key, host) in [
        ("procfs_path", "/proc"),
        ("sysfs_path", "/sys"),
        ("rootfs_path", "/"),
    ] {
        set(
            &mut config,
            &["sources", "host_metrics", key],
            host.to_owned(),
        );
    }
    set(
        &mut config,
        &["sources", "pod_resources", "sysfs_path"],
        "/sys".to_owned(),
    );
    let path = dir.join(name);
    std::fs::write(&path, serde_yaml::to_string(&config).unwrap_or_default())
        .unwrap_or_else(|e| panic!("{e}"));
    path
}

#[test]
fn the_embedded_configurations_pass_check_config() {
    let docs = documents();
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    for (binary, map, key) in [
        (uctel_tests::bins::AGENT, "uctel-agent", "agent.yaml"),
        (
            uctel_tests::bins::COLLECTOR,
            "uctel-collector",
            "collector.yaml",
        ),
    ] {
        let path = localised(embedded(&docs, map, key), dir.path(), key);
        let (code, out) =
            uctel_tests::daemon::check_config(&uctel_tests::bins::path(binary), &path);
        assert_eq!(
            code, 0,
            "{binary} --check-config on the {map} ConfigMap:\n{out}"
        );
    }
}

/// kubernetes-validate (PyPI, [`VALIDATOR_VERSION`]), in the virtual environment
/// `scripts/install-deps` makes: it checks resources against the Kubernetes OpenAPI schemas
/// (as JSON schemas) it bundles for each Kubernetes release, offline.
const VALIDATOR: &str = "/opt/uctel-test-tools/kubernetes-validate/bin/kubernetes-validate";

/// The version of kubernetes-validate `scripts/install-deps` pins.
const VALIDATOR_VERSION: &str = "1.37.0";

/// The Kubernetes releases the manifests are checked against: the oldest and the newest
/// whose schemas kubernetes-validate 1.37.0 bundles.
const KUBERNETES_VERSIONS: [&str; 2] = ["1.25.0", "1.37.0"];

/// The validator's path and version.
///
/// # Panics
/// If it is missing, does not answer `--version`, or is not [`VALIDATOR_VERSION`].
fn validator() -> (&'static Path, String) {
    let binary = Path::new(VALIDATOR);
    assert!(
        binary.is_file(),
        "{VALIDATOR} not found: install kubernetes-validate {VALIDATOR_VERSION} \
         (scripts/install-deps makes its virtual environment: python3 -m venv \
         /opt/uctel-test-tools/kubernetes-validate, then pip install \
         kubernetes-validate=={VALIDATOR_VERSION} in it)"
    );
    let out = Command::new(binary)
        .arg("--version")
        .output()
        .unwrap_or_else(|e| panic!("running {VALIDATOR}: {e}"));
    let version = String::from_utf8_lossy(&out.stdout).trim().to_owned();
    assert!(
        out.status.success() && !version.is_empty(),
        "{VALIDATOR} --version: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(
        version, VALIDATOR_VERSION,
        "{VALIDATOR}: scripts/install-deps installs {VALIDATOR_VERSION}"
    );
    (binary, version)
}

/// Runs the validator in strict mode (a property the schema does not name fails) on
/// `files` against Kubernetes `version`; its exit code and output (stdout then stderr).
fn validate(binary: &Path, version: &str, files: &[PathBuf]) -> (i32, String) {
    let out = Command::new(binary)
        .args(["--strict", "--kubernetes-version", version])
        .args(files)
        .output()
        .unwrap_or_else(|e| panic!("running {}: {e}", binary.display()));
    let mut text = String::from_utf8_lossy(&out.stdout).into_owned();
    text.push_str(&String::from_utf8_lossy(&out.stderr));
    (out.status.code().unwrap_or(-1), text)
}

/// The manifests of Kubernetes API objects: every `config/kubernetes/*.yaml` file but the
/// kustomization.
fn manifests() -> Vec<PathBuf> {
    let dir = uctel_tests::workspace_root().join("config/kubernetes");
    let mut files: Vec<PathBuf> = documents()
        .into_iter()
        .map(|(f, _)| f)
        .filter(|f| f != "kustomization.yaml")
        .map(|f| dir.join(f))
        .collect();
    files.dedup();
    files
}

#[test]
fn the_manifests_pass_the_kubernetes_openapi_schemas_strictly() {
    let (binary, tool_version) = validator();
    let files = manifests();
    // `kind/name` of every object: each must be reported as passed, since the tool only
    // warns (and exits 0) on a kind it has no schema for.
    let objects: Vec<String> = documents()
        .iter()
        .filter(|(f, _)| f != "kustomization.yaml")
        .map(|(_, v)| {
            format!(
                "{}/{}",
                str_of(&v["kind"]).to_lowercase(),
                str_of(&v["metadata"]["name"])
            )
        })
        .collect();
    assert!(objects.len() >= 6, "objects: {objects:?}");
    for version in KUBERNETES_VERSIONS {
        let (code, out) = validate(binary, version, &files);
        println!("kubernetes-validate {tool_version}, strict, Kubernetes {version}:\n{out}");
        assert_eq!(code, 0, "Kubernetes {version}:\n{out}");
        for line in out.lines() {
            assert!(
                line.starts_with("INFO ") && line.contains(" passed for resource "),
                "Kubernetes {version}: {line}"
            );
        }
        for object in &objects {
            assert!(
                out.lines()
                    .any(|l| l.contains(&format!(" passed for resource {object} "))),
                "Kubernetes {version}: {object} not reported as passed:\n{out}"
            );
        }
    }
}

/// A copy of the agent manifest in `dir` with the first `from` replaced by `to` (a text
/// edit: a YAML round trip here would turn its octal `defaultMode: 0440` into a string).
fn broken_agent(dir: &Path, name: &str, from: &str, to: &str) -> PathBuf {
    let path = uctel_tests::workspace_root().join("config/kubernetes/uctel-agent.yaml");
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{e}"));
    assert!(text.contains(from), "uctel-agent.yaml has no {from:?}");
    let out = dir.join(name);
    std::fs::write(&out, text.replacen(from, to, 1)).unwrap_or_else(|e| panic!("{e}"));
    out
}

#[test]
fn the_validator_rejects_a_broken_manifest() {
    let (binary, tool_version) = validator();
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let cases = [
        (
            broken_agent(
                dir.path(),
                "port-not-a-number.yaml",
                "containerPort: 9471",
                "containerPort: \"abc\"",
            ),
            "spec.template.spec.containers.0.ports.0.containerPort: 'abc' is not of type 'integer'",
        ),
        (
            broken_agent(
                dir.path(),
                "unknown-field.yaml",
                "hostNetwork: true",
                "hostNetwrok: true",
            ),
            "'hostNetwrok' was unexpected",
        ),
    ];
    for (file, want) in &cases {
        for version in KUBERNETES_VERSIONS {
            let (code, out) = validate(binary, version, std::slice::from_ref(file));
            println!(
                "kubernetes-validate {tool_version}, strict, Kubernetes {version}, {}:\n{out}",
                file.display()
            );
            assert_ne!(code, 0, "{} accepted:\n{out}", file.display());
            assert!(
                out.contains("did not validate for resource daemonset/uctel-agent")
                    && out.contains(want),
                "{}: want {want:?}:\n{out}",
                file.display()
            );
        }
    }
}
