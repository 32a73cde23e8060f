//! One `List` call to the kubelet's pod-resources API over its unix socket (gRPC, HTTP/2
//! without TLS, as the kubelet serves it).

use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use hyper_util::rt::TokioIo;

use super::v1::pod_resources_lister_client::PodResourcesListerClient;
use super::v1::{ListPodResourcesRequest, PodResources};

/// The most bytes of a `List` answer decoded (tonic's default is 4 MiB; a node's answer
/// grows with its pods and their devices).
pub const MAX_ANSWER_BYTES: usize = 16 << 20;

/// Why a `List` call failed; [`ListError::reason`] is the
/// `uctel_agent_source_errors_total{source="pod_resources",reason}` label.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("pod-resources {reason}: {detail}")]
pub struct ListError {
    /// `socket_absent` (no socket at the path: no kubelet, or the directory is not
    /// mounted), `permission_denied` (EACCES: connecting needs write permission on the
    /// socket and search permission on its directories, which the kubelet gives root only;
    /// the packaged unit's drop-in `pod-resources.conf` grants it), `connect` (the socket
    /// refused or could not be opened otherwise), `timeout` (no
    /// answer within `timeout_seconds`) or `rpc` (the call failed: a gRPC status, an
    /// answer that does not decode or is over [`MAX_ANSWER_BYTES`]).
    pub reason: &'static str,
    /// What failed, for the log.
    pub detail: String,
}

fn err(reason: &'static str, detail: impl std::fmt::Display) -> ListError {
    ListError {
        reason,
        detail: detail.to_string(),
    }
}

/// Calls `PodResourcesLister.List` on the kubelet socket at `socket`, connect included
/// within `timeout`; the pods with their containers' devices.
///
/// # Errors
/// [`ListError`], by reason.
pub async fn list(socket: &Path, timeout: Duration) -> Result<Vec<PodResources>, ListError> {
    match tokio::time::timeout(timeout, list_unbounded(socket)).await {
        Ok(r) => r,
        Err(_) => Err(err("timeout", format!("no answer within {timeout:?}"))),
    }
}

async fn list_unbounded(socket: &Path) -> Result<Vec<PodResources>, ListError> {
    let stream = tokio::net::UnixStream::connect(socket)
        .await
        .map_err(|e| match e.kind() {
            std::io::ErrorKind::NotFound => {
                err("socket_absent", format!("{}: {e}", socket.display()))
            }
            std::io::ErrorKind::PermissionDenied => {
                err("permission_denied", format!("{}: {e}", socket.display()))
            }
            _ => err("connect", format!("{}: {e}", socket.display())),
        })?;
    // The connection made above, handed to tonic once (a `List` is one call; the next
    // round connects again, so a restarted kubelet is found).
    let slot = Arc::new(Mutex::new(Some(stream)));
    let connector = tower::service_fn(move |_: tonic::codegen::http::Uri| {
        let taken = slot
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .take();
        async move {
            taken
                .map(TokioIo::new)
                .ok_or_else(|| std::io::Error::other("the kubelet connection was used already"))
        }
    });
    let channel = tonic::transport::Endpoint::from_static("http://kubelet.sock")
        .connect_with_connector(connector)
        .await
        .map_err(|e| err("connect", format!("{}: {e}", socket.display())))?;
    let mut client =
        PodResourcesListerClient::new(channel).max_decoding_message_size(MAX_ANSWER_BYTES);
    let answer = client
        .list(ListPodResourcesRequest {})
        .await
        .map_err(|s| err("rpc", format!("{}: {}", s.code(), s.message())))?;
    Ok(answer.into_inner().pod_resources)
}
