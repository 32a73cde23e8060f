//! SIGHUP is ignored and SIGTERM fires the shutdown handle. In its own test binary because the signal goes to the
//! whole process.

use std::time::Duration;

#[tokio::test]
async fn sighup_is_ignored_then_sigterm_fires_shutdown() {
    let (_trigger, mut shutdown) = uctel_common::shutdown::on_signals().expect("install handlers");
    assert!(!shutdown.is_triggered());
    // SIGHUP: without the handler the test process itself would die here.
    let status = std::process::Command::new("kill")
        .args(["-HUP", &std::process::id().to_string()])
        .status()
        .expect("run kill");
    assert!(status.success());
    let waited = tokio::time::timeout(Duration::from_millis(500), shutdown.wait()).await;
    assert!(waited.is_err(), "SIGHUP must not shut the daemon down");
    assert!(!shutdown.is_triggered());
    let status = std::process::Command::new("kill")
        .args(["-TERM", &std::process::id().to_string()])
        .status()
        .expect("run kill");
    assert!(status.success());
    // Generous bound: this only guards against a hang, it does not measure latency.
    tokio::time::timeout(Duration::from_secs(30), shutdown.wait())
        .await
        .expect("shutdown after SIGTERM");
    assert!(shutdown.is_triggered());
}
