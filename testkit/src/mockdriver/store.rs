//! The shared [`State`], optionally mirrored to a JSON file that is
//! replaced atomically (write a temp file beside it, then rename) after
//! every change, so a restarted mock finds its volumes again. The file is
//! not fsynced: it has to survive the mock's process, not the machine.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::{Mutex, MutexGuard, PoisonError};

use super::state::State;

/// The state file could not be read or written.
#[derive(Debug, thiserror::Error)]
pub enum PersistError {
    #[error("state file {path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("state file {path}: {source}")]
    Json {
        path: PathBuf,
        source: serde_json::Error,
    },
}

struct Inner {
    state: State,
    /// What the file holds now, to skip rewriting it after a no-op.
    written: Vec<u8>,
}

pub(crate) struct Store {
    inner: Mutex<Inner>,
    file: Option<PathBuf>,
}

impl Store {
    /// Loads `file` if it exists; a missing file is an empty state.
    pub(crate) fn open(file: Option<PathBuf>) -> Result<Self, PersistError> {
        let (state, written) = match &file {
            Some(path) => load(path)?,
            None => (State::default(), Vec::new()),
        };
        Ok(Self {
            inner: Mutex::new(Inner { state, written }),
            file,
        })
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        // A panic while holding the lock cannot leave the plain data torn
        // in a way that matters to a mock; keep serving.
        self.inner.lock().unwrap_or_else(PoisonError::into_inner)
    }

    pub(crate) fn read<R>(&self, f: impl FnOnce(&State) -> R) -> R {
        f(&self.lock().state)
    }

    /// Runs `f` on the state and persists the result. Writing happens
    /// under the lock so the file never goes back to an older state.
    pub(crate) fn update<R, E>(&self, f: impl FnOnce(&mut State) -> Result<R, E>) -> Result<R, E>
    where
        E: From<PersistError>,
    {
        let mut inner = self.lock();
        let result = f(&mut inner.state)?;
        if let Some(path) = &self.file {
            let bytes = serde_json::to_vec(&inner.state).map_err(|source| PersistError::Json {
                path: path.clone(),
                source,
            })?;
            if bytes != inner.written {
                write_atomically(path, &bytes)?;
                inner.written = bytes;
            }
        }
        Ok(result)
    }
}

fn load(path: &Path) -> Result<(State, Vec<u8>), PersistError> {
    let bytes = match std::fs::read(path) {
        Ok(bytes) => bytes,
        Err(err) if err.kind() == std::io::ErrorKind::NotFound => {
            return Ok((State::default(), Vec::new()));
        }
        Err(source) => {
            return Err(PersistError::Io {
                path: path.to_owned(),
                source,
            });
        }
    };
    let state = serde_json::from_slice(&bytes).map_err(|source| PersistError::Json {
        path: path.to_owned(),
        source,
    })?;
    Ok((state, bytes))
}

fn write_atomically(path: &Path, bytes: &[u8]) -> Result<(), PersistError> {
    let io = |source| PersistError::Io {
        path: path.to_owned(),
        source,
    };
    let dir = match path.parent() {
        Some(dir) if !dir.as_os_str().is_empty() => dir,
        _ => Path::new("."),
    };
    let mut temp = tempfile::NamedTempFile::new_in(dir).map_err(io)?;
    temp.write_all(bytes).map_err(io)?;
    temp.persist(path).map_err(|err| io(err.error))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::mockdriver::state::Snapshot;

    #[derive(Debug)]
    enum TestError {
        Persist,
        Refused,
    }

    impl From<PersistError> for TestError {
        fn from(_: PersistError) -> Self {
            Self::Persist
        }
    }

    fn add_snapshot(state: &mut State, id: &str) -> Result<(), TestError> {
        state.snapshots.insert(
            id.into(),
            Snapshot {
                id: id.into(),
                name: id.into(),
                source_volume_id: "vol-1".into(),
                size_bytes: 1,
                creation_seconds: 0,
                creation_nanos: 0,
                answers: 0,
                group_snapshot_id: String::new(),
            },
        );
        Ok(())
    }

    #[test]
    fn persists_and_reloads() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("state.json");
        let store = Store::open(Some(path.clone())).unwrap();
        assert!(!path.exists(), "nothing written before the first change");
        store.update(|s| add_snapshot(s, "snap-1")).unwrap();
        let reopened = Store::open(Some(path.clone())).unwrap();
        assert!(reopened.read(|s| s.snapshots.contains_key("snap-1")));
        // Only the state file is left behind, no temp files.
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 1);
    }

    #[test]
    fn failed_updates_write_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("state.json");
        let store = Store::open(Some(path.clone())).unwrap();
        let result: Result<(), TestError> = store.update(|_| Err(TestError::Refused));
        assert!(matches!(result, Err(TestError::Refused)));
        assert!(!path.exists());
    }

    #[test]
    fn corrupt_file_is_an_error() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("state.json");
        std::fs::write(&path, b"{not json").unwrap();
        assert!(matches!(
            Store::open(Some(path)),
            Err(PersistError::Json { .. })
        ));
    }

    #[test]
    fn unwritable_file_fails_the_update() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("missing-dir").join("state.json");
        let store = Store::open(Some(path)).unwrap();
        assert!(matches!(
            store.update(|s| add_snapshot(s, "snap-1")),
            Err(TestError::Persist)
        ));
    }
}
