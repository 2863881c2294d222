//! Which file a driver's unix socket currently is.
//!
//! A connection to a unix socket stays open after the socket file has been deleted or replaced,
//! so a reused connection would keep talking to a driver that the kubelet can no longer reach.
//! Comparing the file's identity before each probe with the identity seen when dialing detects
//! that without dialing per probe.
//!
//! * Unix: device and inode number.
//! * Windows: the file's creation time, read from the socket file itself (`symlink_metadata`,
//!   as an AF_UNIX socket file is a reparse point). If it cannot be read, the endpoint is
//!   untracked and only a lost connection leads to a redial.
//! * TCP and named-pipe endpoints have no file: untracked as well.

use std::path::Path;

use sidecar_kit::endpoint::Endpoint;

/// Identity of a file (see the module documentation for what it consists of per platform).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct FileId {
    volume: u64,
    index: u64,
}

impl FileId {
    pub const fn new(volume: u64, index: u64) -> Self {
        Self { volume, index }
    }
}

/// What the endpoint's socket file looks like now.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SocketFile {
    Present(FileId),
    Missing,
    /// No file to watch, or its identity cannot be read.
    Untracked,
}

/// Looks at the socket file of `endpoint`.
pub fn socket_file(endpoint: &Endpoint) -> SocketFile {
    match endpoint {
        Endpoint::Unix(path) => file_at(path),
        Endpoint::NamedPipe(_) | Endpoint::Tcp(_) => SocketFile::Untracked,
    }
}

fn classify(
    metadata: std::io::Result<std::fs::Metadata>,
    id: fn(&std::fs::Metadata) -> FileId,
) -> SocketFile {
    match metadata {
        Ok(metadata) => SocketFile::Present(id(&metadata)),
        Err(err) if err.kind() == std::io::ErrorKind::NotFound => SocketFile::Missing,
        Err(_) => SocketFile::Untracked,
    }
}

#[cfg(unix)]
fn file_at(path: &Path) -> SocketFile {
    use std::os::unix::fs::MetadataExt;
    // Follows symlinks: what matters is the socket a dial would reach.
    classify(std::fs::metadata(path), |m| FileId::new(m.dev(), m.ino()))
}

#[cfg(windows)]
fn file_at(path: &Path) -> SocketFile {
    use std::os::windows::fs::MetadataExt;
    classify(std::fs::symlink_metadata(path), |m| {
        FileId::new(0, m.creation_time())
    })
}

#[cfg(all(test, unix))]
mod tests {
    use super::*;

    #[test]
    fn tracks_replacement_and_removal() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("csi.sock");
        let endpoint = Endpoint::Unix(path.clone());
        assert_eq!(socket_file(&endpoint), SocketFile::Missing);

        let first = std::os::unix::net::UnixListener::bind(&path).unwrap();
        let SocketFile::Present(first_id) = socket_file(&endpoint) else {
            panic!("socket not seen");
        };
        assert_eq!(socket_file(&endpoint), SocketFile::Present(first_id));

        std::fs::remove_file(&path).unwrap();
        assert_eq!(socket_file(&endpoint), SocketFile::Missing);
        // The old socket is still open, so the new file cannot reuse its inode.
        let _second = std::os::unix::net::UnixListener::bind(&path).unwrap();
        let SocketFile::Present(second_id) = socket_file(&endpoint) else {
            panic!("socket not seen");
        };
        assert_ne!(first_id, second_id);
        drop(first);
    }

    #[test]
    fn endpoints_without_files_are_untracked() {
        assert_eq!(
            socket_file(&Endpoint::Tcp("127.0.0.1:1".into())),
            SocketFile::Untracked
        );
        assert_eq!(
            socket_file(&Endpoint::NamedPipe(r"\\.\pipe\csi".into())),
            SocketFile::Untracked
        );
    }
}
