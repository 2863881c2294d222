//! The registration socket file: stale-file clean-up, owner-only creation, and telling whether the
//! file at the path is still the one this process created.
//!
//! On Linux the socket is created under umask 0077, so only root (kubelet) can connect. On Windows
//! the socket is AF_UNIX too (kubelet dials it), accepted through the sidecar kit's listener.

use std::io;
use std::path::{Path, PathBuf};

#[derive(Debug, thiserror::Error)]
pub enum SocketError {
    #[error("{path} exists and is not a socket; refusing to remove it")]
    NotASocket { path: PathBuf },
    #[error("cannot remove the stale registration socket {path}: {source}")]
    Remove { path: PathBuf, source: io::Error },
    #[error("cannot listen on the registration socket {path}: {source}")]
    Bind { path: PathBuf, source: io::Error },
}

/// What is at the registration socket path now.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SocketState {
    /// The socket this process created.
    Ours,
    /// Nothing: someone deleted it.
    Missing,
    /// Another file, e.g. the socket of a second registrar instance.
    Replaced,
}

/// Identifies one socket file. On Windows, whose metadata carries no stable file id in std,
/// every file at the path counts as ours.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FileId {
    #[cfg(unix)]
    dev: u64,
    #[cfg(unix)]
    ino: u64,
}

impl FileId {
    fn of(metadata: &std::fs::Metadata) -> Self {
        #[cfg(unix)]
        {
            use std::os::unix::fs::MetadataExt;
            Self {
                dev: metadata.dev(),
                ino: metadata.ino(),
            }
        }
        #[cfg(not(unix))]
        {
            let _ = metadata;
            Self {}
        }
    }
}

/// Reads the file at `path` without following links (Windows' `stat` on an AF_UNIX socket fails
/// where `lstat` works).
pub fn socket_state(path: &Path, ours: FileId) -> io::Result<SocketState> {
    match std::fs::symlink_metadata(path) {
        Ok(metadata) if FileId::of(&metadata) == ours => Ok(SocketState::Ours),
        Ok(_) => Ok(SocketState::Replaced),
        Err(err) if err.kind() == io::ErrorKind::NotFound => Ok(SocketState::Missing),
        Err(err) => Err(err),
    }
}

/// Removes a socket left at `path` by an earlier run. On Linux a file that is not a socket is left
/// alone and reported; on Windows, where std cannot tell sockets apart, any file is removed.
pub fn remove_stale(path: &Path) -> Result<(), SocketError> {
    let metadata = match std::fs::symlink_metadata(path) {
        Ok(metadata) => metadata,
        Err(err) if err.kind() == io::ErrorKind::NotFound => return Ok(()),
        Err(source) => {
            return Err(SocketError::Remove {
                path: path.to_path_buf(),
                source,
            });
        }
    };
    #[cfg(unix)]
    {
        use std::os::unix::fs::FileTypeExt;
        if !metadata.file_type().is_socket() {
            return Err(SocketError::NotASocket {
                path: path.to_path_buf(),
            });
        }
    }
    #[cfg(not(unix))]
    let _ = metadata;
    match std::fs::remove_file(path) {
        Ok(()) => Ok(()),
        Err(err) if err.kind() == io::ErrorKind::NotFound => Ok(()),
        Err(source) => Err(SocketError::Remove {
            path: path.to_path_buf(),
            source,
        }),
    }
}

/// Removes the socket at `path` if it is still ours (another instance's socket stays).
/// Returns whether it removed a file.
pub fn remove_if_ours(path: &Path, ours: FileId) -> io::Result<bool> {
    if socket_state(path, ours)? != SocketState::Ours {
        return Ok(false);
    }
    match std::fs::remove_file(path) {
        Ok(()) => Ok(true),
        Err(err) if err.kind() == io::ErrorKind::NotFound => Ok(false),
        Err(err) => Err(err),
    }
}

/// Something that hands out connections; the server is generic over it so that one code path
/// serves Linux and Windows sockets (and test streams).
pub trait Accept: Send + 'static {
    type Stream: tokio::io::AsyncRead + tokio::io::AsyncWrite + Send + Unpin + 'static;
    fn accept(&mut self) -> impl Future<Output = io::Result<Self::Stream>> + Send;
}

#[cfg(unix)]
type PlatformListener = tokio::net::UnixListener;
#[cfg(windows)]
type PlatformListener = sidecar_kit::driver::windows::UnixListener;

/// A listening registration socket.
pub struct RegistrationListener {
    listener: PlatformListener,
    path: PathBuf,
    id: FileId,
}

impl RegistrationListener {
    /// Removes a stale socket at `path`, then binds and listens there, owner-only on Linux.
    /// Must be called inside the runtime.
    pub fn bind(path: &Path) -> Result<Self, SocketError> {
        remove_stale(path)?;
        let bind_error = |source| SocketError::Bind {
            path: path.to_path_buf(),
            source,
        };
        let listener = bind_owner_only(path).map_err(bind_error)?;
        let id = std::fs::symlink_metadata(path)
            .map(|metadata| FileId::of(&metadata))
            .map_err(bind_error)?;
        Ok(Self {
            listener,
            path: path.to_path_buf(),
            id,
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    pub fn id(&self) -> FileId {
        self.id
    }
}

#[cfg(unix)]
fn bind_owner_only(path: &Path) -> io::Result<PlatformListener> {
    // The socket file takes its mode from the umask at bind(), and bind() also starts listening,
    // so the umask is the only race-free way to keep others from connecting. Nothing else in
    // this process creates files at this point.
    // SAFETY: umask has no memory-safety preconditions.
    let previous = unsafe { libc::umask(0o077) };
    let bound = tokio::net::UnixListener::bind(path);
    // SAFETY: as above.
    unsafe { libc::umask(previous) };
    bound
}

#[cfg(windows)]
fn bind_owner_only(path: &Path) -> io::Result<PlatformListener> {
    // Windows has no umask; the directory's ACL (plugins_registry) decides who may connect.
    sidecar_kit::driver::windows::UnixListener::bind(path)
}

impl Accept for RegistrationListener {
    #[cfg(unix)]
    type Stream = tokio::net::UnixStream;
    #[cfg(windows)]
    type Stream = tokio::net::TcpStream;

    async fn accept(&mut self) -> io::Result<Self::Stream> {
        #[cfg(unix)]
        {
            self.listener.accept().await.map(|(stream, _)| stream)
        }
        #[cfg(windows)]
        {
            self.listener.accept().await
        }
    }
}

#[cfg(all(test, unix))]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    #[tokio::test]
    async fn bind_is_owner_only_and_tracks_identity() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("d-reg.sock");
        let listener = RegistrationListener::bind(&path).unwrap();
        let mode = std::fs::metadata(&path).unwrap().permissions().mode();
        assert_eq!(mode & 0o077, 0, "mode {mode:o}");
        assert_eq!(
            socket_state(&path, listener.id()).unwrap(),
            SocketState::Ours
        );

        std::fs::remove_file(&path).unwrap();
        assert_eq!(
            socket_state(&path, listener.id()).unwrap(),
            SocketState::Missing
        );
        assert!(!remove_if_ours(&path, listener.id()).unwrap());

        std::fs::write(&path, "not a socket").unwrap();
        assert_eq!(
            socket_state(&path, listener.id()).unwrap(),
            SocketState::Replaced
        );
        assert!(!remove_if_ours(&path, listener.id()).unwrap());
        assert!(path.exists());
    }

    #[tokio::test]
    async fn stale_sockets_are_replaced_other_files_are_not() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("d-reg.sock");
        let first = RegistrationListener::bind(&path).unwrap();
        drop(first);
        // The dropped listener's file stays behind, as after a crash.
        assert!(path.exists());
        let second = RegistrationListener::bind(&path).unwrap();
        assert!(remove_if_ours(&path, second.id()).unwrap());
        assert!(!path.exists());

        std::fs::write(&path, "data").unwrap();
        assert!(matches!(
            RegistrationListener::bind(&path),
            Err(SocketError::NotASocket { .. })
        ));
        assert_eq!(std::fs::read_to_string(&path).unwrap(), "data");
    }

    #[tokio::test]
    async fn missing_directory_is_a_bind_error() {
        let dir = tempfile::tempdir().unwrap();
        let err = RegistrationListener::bind(&dir.path().join("absent/d-reg.sock"))
            .err()
            .unwrap();
        assert!(matches!(err, SocketError::Bind { .. }), "{err}");
    }
}
