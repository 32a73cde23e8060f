//! The agent's metrics port over real HTTP requests to an in-process agent: `/-/ready` is
//! 503 (with the reason) while the agent has no collector and 200 once it is connected to a
//! real in-process collector; `/-/healthy` is 200 throughout; `/` is an HTML index; `/metrics`
//! is gzipped when the scraper accepts gzip.

use std::io::Read;
use std::net::SocketAddr;
use std::path::Path;
use std::time::Duration;

use tokio::net::TcpListener;
use uctel_agent::config::AgentConfig;
use uctel_agent::run::Options;
use uctel_testkit::wait::until_async;
use uctel_testkit::{RunningAgent, RunningCollector};

fn example(name: &str) -> String {
    let p = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../config")
        .join(name);
    std::fs::read_to_string(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()))
}

/// `config/collector.yaml` with its control plane on `control`, the other listeners on
/// ephemeral loopback ports and the log sink in `dir`.
fn collector_config(control: SocketAddr, dir: &Path) -> uctel_collector::config::Config {
    let mut v: serde_yaml::Value =
        serde_yaml::from_str(&example("collector.yaml")).unwrap_or_else(|e| panic!("{e}"));
    v["listen"]["control"] = control.to_string().into();
    v["listen"]["metrics"] = "127.0.0.1:0".into();
    v["transport"]["soft"]["bind"] = "127.0.0.1:0".into();
    v["logs"]["sink"] = "file".into();
    v["logs"]["file"]["path"] = dir.join("logs.jsonl").display().to_string().into();
    let text = serde_yaml::to_string(&v).unwrap_or_else(|e| panic!("{e}"));
    uctel_common::config::from_str("collector.yaml", &text).unwrap_or_else(|e| panic!("{e}"))
}

/// `config/agent.yaml` pointed at `control`, reconnecting fast, no log sources.
fn agent_config(control: SocketAddr, dir: &Path) -> AgentConfig {
    let mut v: serde_yaml::Value =
        serde_yaml::from_str(&example("agent.yaml")).unwrap_or_else(|e| panic!("{e}"));
    v["collector"]["control"] = control.to_string().into();
    v["collector"]["reconnect_initial_seconds"] = 0.05.into();
    v["collector"]["reconnect_max_seconds"] = 0.2.into();
    v["sources"]["logs"] = serde_yaml::Value::Sequence(Vec::new());
    v["sources"]["state_directory"] = dir.join("state").display().to_string().into();
    let text = serde_yaml::to_string(&v).unwrap_or_else(|e| panic!("{e}"));
    AgentConfig::from_yaml("agent.yaml", &text).unwrap_or_else(|e| panic!("{e}"))
}

/// One request with `extra` header lines: (status, head, body bytes).
async fn request(addr: SocketAddr, path: &str, extra: &str) -> (u16, String, Vec<u8>) {
    let r = uctel_testkit::http::request(addr, path, extra).await;
    (r.status, r.head, r.body)
}

/// Polls `/-/ready` until it answers `want` (or panics after `timeout`); returns the body.
async fn ready_becomes(addr: SocketAddr, want: u16, timeout: Duration) -> String {
    until_async(&format!("/-/ready answering {want}"), timeout, || async {
        let (code, _, body) = request(addr, "/-/ready", "").await;
        let body = String::from_utf8_lossy(&body).into_owned();
        if code == want {
            Ok(body)
        } else {
            Err(format!("still {code} ({body:?})"))
        }
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ready_flips_when_the_collector_comes_up_and_goes_away() {
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    // A loopback port nobody listens on yet: the collector starts there later.
    let control = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .unwrap_or_else(|e| panic!("{e}"));
    let metrics = TcpListener::bind("127.0.0.1:0")
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    let addr = metrics.local_addr().unwrap_or_else(|e| panic!("{e}"));
    let agent = RunningAgent::start_with(
        agent_config(control, dir.path()),
        Options {
            stats: None,
            metrics_listener: Some(metrics),
            ..Options::default()
        },
    );

    // No collector: alive but not ready, and it says why.
    let (code, _, body) = request(addr, "/-/ready", "").await;
    assert_eq!(code, 503, "{}", String::from_utf8_lossy(&body));
    assert_eq!(
        String::from_utf8_lossy(&body),
        format!("uctel-agent is not ready: not connected to the collector at {control}\n")
    );
    let (code, _, body) = request(addr, "/-/healthy", "").await;
    assert_eq!((code, &body[..]), (200, &b"uctel-agent is healthy.\n"[..]));
    let (code, head, body) = request(addr, "/", "").await;
    let page = String::from_utf8_lossy(&body);
    assert_eq!(code, 200, "{page}");
    assert!(head.contains("content-type: text/html"), "{head}");
    assert!(page.contains("<title>uctel-agent</title>"), "{page}");
    for href in ["metrics", "-/healthy", "-/ready"] {
        assert!(
            page.contains(&format!("<a href=\"{href}\">")),
            "{href}: {page}"
        );
    }
    assert_eq!(request(addr, "/nope", "").await.0, 404);

    // gzip when asked; the body decodes to the exposition.
    let (code, head, zipped) = request(addr, "/metrics", "Accept-Encoding: gzip\r\n").await;
    assert_eq!(code, 200, "{head}");
    assert!(head.contains("content-encoding: gzip"), "{head}");
    let mut text = String::new();
    flate2::read::GzDecoder::new(&zipped[..])
        .read_to_string(&mut text)
        .unwrap_or_else(|e| panic!("not gzip: {e}"));
    assert!(
        text.contains("# TYPE uctel_agent_connected gauge"),
        "{text}"
    );
    assert!(text.contains("\nuctel_agent_connected 0\n"), "{text}");
    let (_, head, plain) = request(addr, "/metrics", "").await;
    assert!(!head.contains("content-encoding"), "{head}");
    assert!(String::from_utf8_lossy(&plain).contains("# TYPE uctel_agent_connected gauge"));

    // The collector comes up: ready within a few reconnect attempts.
    let collector = RunningCollector::start(collector_config(control, dir.path())).await;
    let body = ready_becomes(addr, 200, Duration::from_secs(20)).await;
    assert_eq!(body, "uctel-agent is ready.\n");

    // The collector goes away: not ready again.
    collector.stop().await;
    let body = ready_becomes(addr, 503, Duration::from_secs(30)).await;
    assert!(body.contains("not connected to the collector"), "{body}");

    let summary = agent.stop().await;
    assert_eq!(summary.sessions, 1, "{summary:?}");
}
