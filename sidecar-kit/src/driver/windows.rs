//! Windows transports tokio lacks: AF_UNIX sockets (Windows 10 1803+ / Server 2019+), which the
//! kubelet and Windows CSI drivers use, and named-pipe clients with busy-pipe retries.
//!
//! A Winsock AF_UNIX stream socket is driven by the same readiness machinery as a TCP socket; only
//! the address family differs. So connected sockets are handed to tokio as `TcpStream`s, and no
//! code path here asks them for addresses.

use std::io;
use std::os::windows::io::{FromRawSocket, IntoRawSocket};
use std::path::{Path, PathBuf};
use std::time::Duration;

use socket2::{Domain, SockAddr, Socket, Type};
use tokio::net::TcpStream;
use tokio::net::windows::named_pipe::{ClientOptions, NamedPipeClient};
use tokio::sync::mpsc;

/// `ERROR_PIPE_BUSY`: every instance of the pipe is in use; the server will offer another.
const ERROR_PIPE_BUSY: i32 = 231;

fn into_tokio(socket: Socket) -> io::Result<TcpStream> {
    socket.set_nonblocking(true)?;
    // SAFETY: the raw socket comes from `into_raw_socket`, so ownership moves exactly once.
    let stream = unsafe { std::net::TcpStream::from_raw_socket(socket.into_raw_socket()) };
    TcpStream::from_std(stream)
}

/// Connects to an AF_UNIX socket at `path`.
pub async fn unix_connect(path: &Path) -> io::Result<TcpStream> {
    let path = path.to_path_buf();
    let socket = tokio::task::spawn_blocking(move || -> io::Result<Socket> {
        let socket = Socket::new(Domain::UNIX, Type::STREAM, None)?;
        socket.connect(&SockAddr::unix(&path)?)?;
        Ok(socket)
    })
    .await
    .map_err(io::Error::other)??;
    into_tokio(socket)
}

/// Opens a named pipe, waiting while all its instances are busy.
pub async fn pipe_connect(name: &str) -> io::Result<NamedPipeClient> {
    loop {
        match ClientOptions::new().open(name) {
            Ok(client) => return Ok(client),
            Err(err) if err.raw_os_error() == Some(ERROR_PIPE_BUSY) => {}
            Err(err) => return Err(err),
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// An AF_UNIX listener. Accepting blocks, so it runs on a thread of its own that hands each
/// connection over as a tokio stream.
pub struct UnixListener {
    accepted: mpsc::Receiver<io::Result<TcpStream>>,
    path: PathBuf,
}

impl UnixListener {
    /// Binds `path` (which must not exist) and starts accepting.
    pub fn bind(path: &Path) -> io::Result<Self> {
        let socket = Socket::new(Domain::UNIX, Type::STREAM, None)?;
        socket.bind(&SockAddr::unix(path)?)?;
        socket.listen(128)?;
        let (sender, accepted) = mpsc::channel(16);
        let runtime = tokio::runtime::Handle::current();
        std::thread::Builder::new()
            .name("unix-accept".into())
            .spawn(move || {
                loop {
                    let next = socket.accept().and_then(|(conn, _)| {
                        let _guard = runtime.enter();
                        into_tokio(conn)
                    });
                    let failed = next.is_err();
                    if sender.blocking_send(next).is_err() || failed {
                        return;
                    }
                }
            })?;
        Ok(Self {
            accepted,
            path: path.to_path_buf(),
        })
    }

    pub async fn accept(&mut self) -> io::Result<TcpStream> {
        match self.accepted.recv().await {
            Some(next) => next,
            None => Err(io::Error::new(
                io::ErrorKind::BrokenPipe,
                format!("listener on {} stopped", self.path.display()),
            )),
        }
    }
}
