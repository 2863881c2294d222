//! Which file a driver's unix socket currently is.
//!
//! A connection to a unix socket stays open after the socket file has been deleted or replaced,
//! so a reused connection would keep talking to a driver that the kubelet can no longer reach.
//! Comparing the file's identity before each probe with the identity seen when dialing detects
//! that without dialing per probe.
//!
//! * Unix: device and inode number.
//! * Windows: volume serial number and file index of the socket file itself (an AF_UNIX socket
//!   file is a reparse point, opened as such). Creation times would not do: NTFS gives a file
//!   created within seconds of a deleted one of the same name the old creation time.
//!
//! When the identity cannot be read (no permission, a file system without stable file
//! indexes), and for TCP and named-pipe endpoints, which have no file, the endpoint is
//! untracked: only a lost or failing connection leads to a redial.

use std::path::Path;

use sidecar_kit::driver::endpoint::Endpoint;

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

#[cfg(unix)]
fn file_at(path: &Path) -> SocketFile {
    use std::os::unix::fs::MetadataExt;
    // Follows symlinks: what matters is the socket a dial would reach.
    match std::fs::metadata(path) {
        Ok(metadata) => SocketFile::Present(FileId::new(metadata.dev(), metadata.ino())),
        Err(err) if err.kind() == std::io::ErrorKind::NotFound => SocketFile::Missing,
        Err(_) => SocketFile::Untracked,
    }
}

#[cfg(windows)]
fn file_at(path: &Path) -> SocketFile {
    use std::os::windows::fs::OpenOptionsExt;
    use std::os::windows::io::AsRawHandle;
    use windows_sys::Win32::Storage::FileSystem::{
        BY_HANDLE_FILE_INFORMATION, FILE_FLAG_BACKUP_SEMANTICS, FILE_FLAG_OPEN_REPARSE_POINT,
        GetFileInformationByHandle,
    };

    // An AF_UNIX socket file is a reparse point: open the point itself, for attributes only.
    let file = std::fs::OpenOptions::new()
        .access_mode(0)
        .custom_flags(FILE_FLAG_OPEN_REPARSE_POINT | FILE_FLAG_BACKUP_SEMANTICS)
        .open(path);
    let file = match file {
        Ok(file) => file,
        Err(err) if err.kind() == std::io::ErrorKind::NotFound => return SocketFile::Missing,
        Err(_) => return SocketFile::Untracked,
    };
    // SAFETY: all-zero is a valid value of this plain C struct.
    let mut info: BY_HANDLE_FILE_INFORMATION = unsafe { std::mem::zeroed() };
    // SAFETY: the handle stays open for the call and `info` is a valid, writable struct.
    if unsafe { GetFileInformationByHandle(file.as_raw_handle(), &mut info) } == 0 {
        return SocketFile::Untracked;
    }
    SocketFile::Present(FileId::new(
        u64::from(info.dwVolumeSerialNumber),
        (u64::from(info.nFileIndexHigh) << 32) | u64::from(info.nFileIndexLow),
    ))
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

#[cfg(all(test, windows))]
mod windows_tests {
    use super::*;

    #[test]
    fn file_index_identifies_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("csi.sock");
        let endpoint = Endpoint::Unix(path.clone());
        assert_eq!(socket_file(&endpoint), SocketFile::Missing);

        std::fs::write(&path, b"").unwrap();
        let SocketFile::Present(first) = socket_file(&endpoint) else {
            panic!("file not identified");
        };
        assert_eq!(socket_file(&endpoint), SocketFile::Present(first));

        // The old file lives on under another name, so its index cannot be reused.
        std::fs::rename(&path, dir.path().join("old.sock")).unwrap();
        std::fs::write(&path, b"").unwrap();
        let SocketFile::Present(second) = socket_file(&endpoint) else {
            panic!("file not identified");
        };
        assert_ne!(first, second);
    }

    #[test]
    fn pipes_are_untracked() {
        assert_eq!(
            socket_file(&Endpoint::NamedPipe(r"\\.\pipe\csi".into())),
            SocketFile::Untracked
        );
    }
}
