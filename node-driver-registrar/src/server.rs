//! The gRPC server of the registration socket, generic over the byte stream.
//!
//! Each accepted connection is served as plain HTTP/2 by hyper with the generated
//! `Registration` service; there is one service and one method table for two methods, so
//! tonic's router and its transport layers would only add code (and so resident memory).
//! Listeners come and go (a deleted socket is re-created) while the server stays, and Linux
//! (unix streams) and Windows (AF_UNIX through Winsock) run the same code.

use std::io;
use std::time::Duration;

use csi_proto::pluginregistration::registration_server::RegistrationServer;
use h2_authority::AuthorityFix;
use hyper_util::rt::{TokioExecutor, TokioIo};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::service::RegistrationService;
use crate::socket::Accept;

/// Serves the registration service on connections from any number of listeners.
pub struct Server {
    service: RegistrationServer<RegistrationService>,
    /// Asks every connection to finish its calls in flight and close.
    draining: CancellationToken,
    connections: TaskTracker,
}

impl Server {
    pub fn new(service: RegistrationService) -> Self {
        Self {
            service: service.into_server(),
            draining: CancellationToken::new(),
            connections: TaskTracker::new(),
        }
    }

    /// Accepts on `listener` until `stop` is cancelled (`Ok`) or accepting fails (`Err`), serving
    /// each connection in a task of its own. The listener is dropped when the loop ends.
    pub fn spawn_accept_loop<A: Accept>(
        &self,
        mut listener: A,
        stop: CancellationToken,
    ) -> JoinHandle<io::Result<()>> {
        let service = self.service.clone();
        let draining = self.draining.clone();
        let connections = self.connections.clone();
        tokio::spawn(async move {
            loop {
                let stream = tokio::select! {
                    _ = stop.cancelled() => return Ok(()),
                    accepted = listener.accept() => accepted?,
                };
                connections.spawn(serve_connection(stream, service.clone(), draining.clone()));
            }
        })
    }

    /// Lets the calls in flight finish (such as kubelet's NotifyRegistrationStatus that made the
    /// registrar stop), for at most `timeout`. Accept loops must be stopped first.
    pub async fn shutdown(self, timeout: Duration) {
        self.draining.cancel();
        self.connections.close();
        if tokio::time::timeout(timeout, self.connections.wait())
            .await
            .is_err()
        {
            tracing::debug!("registration calls still in flight at exit");
        }
    }
}

async fn serve_connection<S>(
    stream: S,
    service: RegistrationServer<RegistrationService>,
    draining: CancellationToken,
) where
    S: AsyncRead + AsyncWrite + Send + Unpin + 'static,
{
    let service = hyper::service::service_fn(move |request| {
        tower::ServiceExt::oneshot(service.clone(), request)
    });
    let connection = hyper::server::conn::http2::Builder::new(TokioExecutor::new())
        .serve_connection(TokioIo::new(AuthorityFix::new(stream)), service);
    tokio::pin!(connection);
    let served = tokio::select! {
        served = connection.as_mut() => served,
        _ = draining.cancelled() => {
            connection.as_mut().graceful_shutdown();
            connection.await
        }
    };
    if let Err(err) = served {
        // A peer that hangs up early, or a probe that connects and closes (kubelet on Windows
        // does that to tell sockets apart), is not worth more than a debug line.
        tracing::debug!(error = %err, "registration connection ended");
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::service::plugin_info;
    use csi_proto::pluginregistration::registration_client::RegistrationClient;
    use csi_proto::pluginregistration::{InfoRequest, RegistrationStatus};
    use tokio::io::DuplexStream;
    use tokio::sync::mpsc;

    /// Hands out the server ends of in-memory pipes, then fails.
    struct Pipes(mpsc::Receiver<DuplexStream>);

    impl Accept for Pipes {
        type Stream = DuplexStream;
        async fn accept(&mut self) -> io::Result<DuplexStream> {
            self.0
                .recv()
                .await
                .ok_or_else(|| io::Error::new(io::ErrorKind::BrokenPipe, "no more pipes"))
        }
    }

    async fn client(
        pipes: &mpsc::Sender<DuplexStream>,
    ) -> RegistrationClient<tonic::transport::Channel> {
        let (client_end, server_end) = tokio::io::duplex(64 * 1024);
        pipes.send(server_end).await.unwrap();
        let mut client_end = Some(client_end);
        let channel = tonic::transport::Endpoint::from_static("http://pipe")
            .connect_with_connector(tower::service_fn(move |_| {
                let stream = client_end.take();
                async move {
                    stream
                        .map(TokioIo::new)
                        .ok_or_else(|| io::Error::other("one connection per pipe"))
                }
            }))
            .await
            .unwrap();
        RegistrationClient::new(channel)
    }

    #[tokio::test]
    async fn serves_connections_from_any_listener_until_shut_down() {
        let (service, mut rejections) = RegistrationService::new(plugin_info("d", "/p"));
        let server = Server::new(service);

        // Two listeners in turn, as after a re-created socket.
        for _ in 0..2 {
            let (pipes, accepted) = mpsc::channel(1);
            let accepting = server.spawn_accept_loop(Pipes(accepted), CancellationToken::new());
            let mut client = client(&pipes).await;
            let info = client.get_info(InfoRequest {}).await.unwrap().into_inner();
            assert_eq!(info.name, "d");
            assert_eq!(info.supported_versions, vec!["1.0.0".to_string()]);
            drop(pipes);
            let ended = accepting.await.unwrap();
            assert_eq!(ended.unwrap_err().kind(), io::ErrorKind::BrokenPipe);
        }

        // A connection still open when the server stops gets its call answered.
        let (pipes, accepted) = mpsc::channel(1);
        let stop = CancellationToken::new();
        let accepting = server.spawn_accept_loop(Pipes(accepted), stop.clone());
        let mut client = client(&pipes).await;
        client
            .notify_registration_status(RegistrationStatus {
                plugin_registered: false,
                error: "no".into(),
            })
            .await
            .unwrap();
        assert_eq!(rejections.recv().await.unwrap().error, "no");
        stop.cancel();
        accepting.await.unwrap().unwrap();
        server.shutdown(Duration::from_secs(5)).await;
        assert!(client.get_info(InfoRequest {}).await.is_err());
    }
}
