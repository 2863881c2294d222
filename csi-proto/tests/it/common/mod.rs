//! gRPC over real unix sockets for the integration tests.

use hyper_util::rt::TokioIo;
use std::path::PathBuf;
use std::pin::Pin;
use std::task::{Context, Poll};
use tokio::net::{UnixListener, UnixStream};
use tokio::sync::oneshot;
use tokio::task::JoinHandle;
use tokio_stream::wrappers::UnixListenerStream;
use tonic::transport::{Channel, Endpoint, Uri};

/// A gRPC server on a socket in its own temp dir.
pub struct UnixServer {
    pub path: PathBuf,
    shutdown: oneshot::Sender<()>,
    task: JoinHandle<Result<(), tonic::transport::Error>>,
    _dir: tempfile::TempDir,
}

/// Resolves when the server is asked to stop.
pub struct Shutdown(oneshot::Receiver<()>);

impl Future for Shutdown {
    type Output = ();

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        Pin::new(&mut self.0).poll(cx).map(|_| ())
    }
}

impl UnixServer {
    /// Binds before spawning `serve`, so clients can connect at once.
    pub fn start<F, Fut>(serve: F) -> Self
    where
        F: FnOnce(UnixListenerStream, Shutdown) -> Fut,
        Fut: Future<Output = Result<(), tonic::transport::Error>> + Send + 'static,
    {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("csi.sock");
        let listener = UnixListener::bind(&path).unwrap();
        let (tx, rx) = oneshot::channel();
        let task = tokio::spawn(serve(UnixListenerStream::new(listener), Shutdown(rx)));
        UnixServer {
            path,
            shutdown: tx,
            task,
            _dir: dir,
        }
    }

    /// Stops the server and checks it ended without error.
    pub async fn stop(self) {
        let _ = self.shutdown.send(());
        self.task.await.unwrap().unwrap();
    }
}

/// A channel whose connector dials the unix socket at `path`; the URI is
/// required by the HTTP/2 layer but never resolved.
pub async fn connect(path: PathBuf) -> Channel {
    Endpoint::try_from("http://[::1]:50051")
        .unwrap()
        .connect_with_connector(tower::service_fn(move |_: Uri| {
            let path = path.clone();
            async move { Ok::<_, std::io::Error>(TokioIo::new(UnixStream::connect(path).await?)) }
        }))
        .await
        .unwrap()
}
