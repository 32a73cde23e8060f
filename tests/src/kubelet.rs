//! A test kubelet: the pod-resources gRPC service (`PodResourcesLister`, built from the
//! agent's code generated from the vendored upstream `podresources/v1` proto) on a unix
//! socket, answering `List` with the pods of the moment. No cluster runs in the tests.
//! The one test kubelet: the agent's integration tests compile this file too
//! (`agent/tests/it/support`, `#[path]`), so it names nothing of this crate.

use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tonic::{Request, Response, Status};
use v1::pod_resources_lister_server::{PodResourcesLister, PodResourcesListerServer};
use v1::{
    AllocatableResourcesRequest, AllocatableResourcesResponse, ContainerDevices,
    ContainerResources, GetPodResourcesRequest, GetPodResourcesResponse, ListPodResourcesRequest,
    ListPodResourcesResponse, PodResources,
};

/// The messages (the agent's generated code) and the server stubs generated beside them
/// from the same proto, kept with the agent's tests (`agent/proto/gen`).
#[allow(
    clippy::all,
    clippy::pedantic,
    missing_docs,
    missing_debug_implementations,
    unreachable_pub
)]
mod v1 {
    pub use uctel_agent::sources::pod_resources::v1::*;
    include!(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../agent/tests/it/support/podresources_server.rs"
    ));
}

/// The pods the kubelet lists; change them at any time.
#[derive(Debug, Clone, Default)]
pub struct Kubelet(pub Arc<Mutex<Vec<PodResources>>>);

#[tonic::async_trait]
impl PodResourcesLister for Kubelet {
    async fn list(
        &self,
        _: Request<ListPodResourcesRequest>,
    ) -> Result<Response<ListPodResourcesResponse>, Status> {
        let pods = self
            .0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone();
        Ok(Response::new(ListPodResourcesResponse {
            pod_resources: pods,
        }))
    }
    async fn get_allocatable_resources(
        &self,
        _: Request<AllocatableResourcesRequest>,
    ) -> Result<Response<AllocatableResourcesResponse>, Status> {
        Err(Status::unimplemented("not in the test kubelet"))
    }
    async fn get(
        &self,
        _: Request<GetPodResourcesRequest>,
    ) -> Result<Response<GetPodResourcesResponse>, Status> {
        Err(Status::unimplemented("not in the test kubelet"))
    }
}

/// A pod whose containers (name, resource, device ids) each hold one resource's devices.
pub fn pod(namespace: &str, name: &str, containers: &[(&str, &str, &[&str])]) -> PodResources {
    PodResources {
        name: name.into(),
        namespace: namespace.into(),
        containers: containers
            .iter()
            .map(|(c, resource, ids)| ContainerResources {
                name: (*c).into(),
                devices: vec![ContainerDevices {
                    resource_name: (*resource).into(),
                    device_ids: ids.iter().map(|i| (*i).to_owned()).collect(),
                    topology: None,
                }],
                ..Default::default()
            })
            .collect(),
    }
}

impl Kubelet {
    /// Serves the kubelet on a unix socket at `path` (HTTP/2 without TLS, as the kubelet
    /// does) on a thread of its own, until the process ends.
    ///
    /// # Panics
    /// If the socket cannot be bound within 10 s.
    pub fn serve(&self, path: &Path) {
        let (path, kubelet) = (path.to_path_buf(), self.clone());
        let (ready, bound) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap_or_else(|e| panic!("{e}"));
            rt.block_on(async move {
                let listener =
                    tokio::net::UnixListener::bind(&path).unwrap_or_else(|e| panic!("{e}"));
                let _ = ready.send(());
                while let Ok((stream, _)) = listener.accept().await {
                    let svc = PodResourcesListerServer::new(kubelet.clone());
                    tokio::spawn(async move {
                        let _ = hyper_util::server::conn::auto::Builder::new(
                            hyper_util::rt::TokioExecutor::new(),
                        )
                        .http2_only()
                        .serve_connection(
                            hyper_util::rt::TokioIo::new(stream),
                            hyper_util::service::TowerToHyperService::new(svc),
                        )
                        .await;
                    });
                }
            });
        });
        bound
            .recv_timeout(Duration::from_secs(10))
            .unwrap_or_else(|e| panic!("the test kubelet did not start: {e}"));
    }
}
