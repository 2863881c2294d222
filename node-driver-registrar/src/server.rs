//! The gRPC server of the registration socket, generic over the byte stream.
//!
//! One tonic server lives as long as the process; listeners feed it connections through a
//! channel. So a deleted socket can be re-created and served again without restarting the server,
//! and Linux (unix streams) and Windows (AF_UNIX through Winsock) run the same code.

use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use tokio_stream::StreamExt;
use tokio_stream::wrappers::ReceiverStream;
use tokio_util::sync::CancellationToken;
use tonic::transport::server::Connected;

use crate::service::RegistrationService;
use crate::socket::Accept;

/// An accepted connection. The server asks it for no addresses: AF_UNIX peers have none worth
/// reporting, and on Windows the stream type would misreport them.
pub struct Conn<S>(S);

impl<S> Connected for Conn<S> {
    type ConnectInfo = ();
    fn connect_info(&self) {}
}

impl<S: AsyncRead + Unpin> AsyncRead for Conn<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.0).poll_read(cx, buf)
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Conn<S> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        data: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.0).poll_write(cx, data)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.0).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.0).poll_shutdown(cx)
    }
}

/// Hands accepted connections to the server.
pub type Connections<S> = mpsc::Sender<S>;

/// Starts the server; it serves what is sent into the returned sender until `stop` is cancelled,
/// then finishes the calls in flight.
pub fn spawn_server<S>(
    service: RegistrationService,
    stop: CancellationToken,
) -> (
    Connections<S>,
    JoinHandle<Result<(), tonic::transport::Error>>,
)
where
    S: AsyncRead + AsyncWrite + Send + Unpin + 'static,
{
    let (connections, accepted) = mpsc::channel::<S>(16);
    let incoming = ReceiverStream::new(accepted).map(|stream| Ok::<_, io::Error>(Conn(stream)));
    let server = tonic::transport::Server::builder()
        .add_service(service.into_server())
        .serve_with_incoming_shutdown(incoming, stop.cancelled_owned());
    (connections, tokio::spawn(server))
}

/// Accepts connections into `connections` until `stop` is cancelled (`Ok`) or accepting fails
/// (`Err`), after which the listener is dropped.
pub async fn accept_loop<A: Accept>(
    mut listener: A,
    connections: Connections<A::Stream>,
    stop: CancellationToken,
) -> io::Result<()> {
    loop {
        let stream = tokio::select! {
            _ = stop.cancelled() => return Ok(()),
            accepted = listener.accept() => accepted?,
        };
        if connections.send(stream).await.is_err() {
            // The server is gone: the process is shutting down.
            return Ok(());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::service::plugin_info;
    use csi_proto::pluginregistration::InfoRequest;
    use csi_proto::pluginregistration::registration_client::RegistrationClient;
    use hyper_util::rt::TokioIo;
    use tokio::io::DuplexStream;

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
    async fn serves_connections_from_any_listener_until_stopped() {
        let (service, _rejections) = RegistrationService::new(plugin_info("d", "/p"));
        let stop = CancellationToken::new();
        let (connections, server) = spawn_server::<DuplexStream>(service, stop.clone());

        // Two listeners in turn, as after a re-created socket.
        for _ in 0..2 {
            let (pipes, accepted) = mpsc::channel(1);
            let accept_stop = CancellationToken::new();
            let accepting = tokio::spawn(accept_loop(
                Pipes(accepted),
                connections.clone(),
                accept_stop.clone(),
            ));
            let info = client(&pipes)
                .await
                .get_info(InfoRequest {})
                .await
                .unwrap()
                .into_inner();
            assert_eq!(info.name, "d");
            drop(pipes);
            let ended = accepting.await.unwrap();
            assert_eq!(ended.unwrap_err().kind(), io::ErrorKind::BrokenPipe);
        }

        stop.cancel();
        server.await.unwrap().unwrap();
    }

    #[tokio::test]
    async fn accept_loop_stops_on_request() {
        let (_pipes, accepted) = mpsc::channel::<DuplexStream>(1);
        let (connections, _server_side) = mpsc::channel(1);
        let stop = CancellationToken::new();
        stop.cancel();
        accept_loop(Pipes(accepted), connections, stop)
            .await
            .unwrap();
    }
}
