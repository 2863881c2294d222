//! Just enough of the ustar format for image layers: regular files, directories and symbolic
//! links with fixed owners and times, written in a deterministic order, and read back to check
//! and unpack what was written.

use crate::Error;

const BLOCK: usize = 512;

/// What an entry is.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Kind {
    File(Vec<u8>),
    Dir,
    /// A symbolic link to the given target.
    Symlink(String),
}

/// One entry of a layer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Entry {
    /// Relative path inside the layer, `/`-separated, without a leading `/`.
    pub path: String,
    pub mode: u32,
    pub kind: Kind,
}

impl Entry {
    pub fn file(path: &str, mode: u32, data: Vec<u8>) -> Entry {
        Entry {
            path: path.to_owned(),
            mode,
            kind: Kind::File(data),
        }
    }

    pub fn dir(path: &str, mode: u32) -> Entry {
        Entry {
            path: path.to_owned(),
            mode,
            kind: Kind::Dir,
        }
    }

    pub fn symlink(path: &str, target: &str) -> Entry {
        Entry {
            path: path.to_owned(),
            mode: 0o777,
            kind: Kind::Symlink(target.to_owned()),
        }
    }
}

/// Writes `entries` as a tar archive, sorted by path, every entry owned by 0:0 and dated
/// `mtime`, so that the same entries always give the same bytes.
pub fn write(entries: &[Entry], mtime: u64) -> Result<Vec<u8>, Error> {
    let mut sorted: Vec<&Entry> = entries.iter().collect();
    sorted.sort_by(|a, b| a.path.cmp(&b.path));
    let mut out = Vec::new();
    for entry in sorted {
        check_path(&entry.path)?;
        let (typeflag, size, link) = match &entry.kind {
            Kind::File(data) => (b'0', data.len() as u64, ""),
            Kind::Dir => (b'5', 0, ""),
            Kind::Symlink(target) => (b'2', 0, target.as_str()),
        };
        // Directories carry a trailing slash, as tar writes them.
        let name = match entry.kind {
            Kind::Dir => format!("{}/", entry.path),
            _ => entry.path.clone(),
        };
        let mut header = [0u8; BLOCK];
        put_str(&mut header[0..100], &name, &entry.path)?;
        put_octal(
            &mut header[100..108],
            u64::from(entry.mode & 0o7777),
            &entry.path,
        )?;
        put_octal(&mut header[108..116], 0, &entry.path)?;
        put_octal(&mut header[116..124], 0, &entry.path)?;
        put_octal(&mut header[124..136], size, &entry.path)?;
        put_octal(&mut header[136..148], mtime, &entry.path)?;
        header[156] = typeflag;
        put_str(&mut header[157..257], link, &entry.path)?;
        header[257..263].copy_from_slice(b"ustar\0");
        header[263..265].copy_from_slice(b"00");
        put_octal(&mut header[329..337], 0, &entry.path)?;
        put_octal(&mut header[337..345], 0, &entry.path)?;
        // The checksum is computed with its own field read as spaces.
        header[148..156].copy_from_slice(b"        ");
        let sum: u32 = header.iter().map(|&b| u32::from(b)).sum();
        let field = format!("{sum:06o}\0 ");
        header[148..156].copy_from_slice(field.as_bytes());
        out.extend_from_slice(&header);
        if let Kind::File(data) = &entry.kind {
            out.extend_from_slice(data);
            out.resize(out.len().next_multiple_of(BLOCK), 0);
        }
    }
    // The end-of-archive marker: two zero blocks.
    out.resize(out.len() + 2 * BLOCK, 0);
    Ok(out)
}

/// Reads a tar archive written by [`write`] (or any plain ustar archive with files,
/// directories and symbolic links).
pub fn read(archive: &[u8]) -> Result<Vec<Entry>, Error> {
    let mut entries = Vec::new();
    let mut at = 0;
    while at + BLOCK <= archive.len() {
        let header = &archive[at..at + BLOCK];
        if header.iter().all(|&b| b == 0) {
            return Ok(entries);
        }
        let stored = parse_octal(&header[148..156]).ok_or(Error::Tar("bad checksum field"))?;
        let sum: u64 = header
            .iter()
            .enumerate()
            .map(|(i, &b)| u64::from(if (148..156).contains(&i) { b' ' } else { b }))
            .sum();
        if sum != stored {
            return Err(Error::Tar("header checksum mismatch"));
        }
        let mut path = c_str(&header[0..100]);
        let prefix = c_str(&header[345..500]);
        if header[257..262] == *b"ustar" && !prefix.is_empty() {
            path = format!("{prefix}/{path}");
        }
        let path = path.trim_end_matches('/').to_owned();
        let mode = parse_octal(&header[100..108]).ok_or(Error::Tar("bad mode"))? as u32;
        let size = parse_octal(&header[124..136]).ok_or(Error::Tar("bad size"))? as usize;
        at += BLOCK;
        let kind = match header[156] {
            b'0' | 0 => {
                let data = archive
                    .get(at..at + size)
                    .ok_or(Error::Tar("truncated file data"))?;
                at += size.next_multiple_of(BLOCK);
                Kind::File(data.to_vec())
            }
            b'5' => Kind::Dir,
            b'2' => Kind::Symlink(c_str(&header[157..257])),
            _ => return Err(Error::Tar("unsupported entry type")),
        };
        entries.push(Entry { path, mode, kind });
    }
    Err(Error::Tar("archive ends without its end marker"))
}

/// Paths stay relative and inside the layer.
fn check_path(path: &str) -> Result<(), Error> {
    if path.is_empty()
        || path.starts_with('/')
        || path.split('/').any(|part| part.is_empty() || part == "..")
    {
        return Err(Error::BadPath(path.to_owned()));
    }
    Ok(())
}

fn put_str(field: &mut [u8], value: &str, path: &str) -> Result<(), Error> {
    // Leave room for the terminating NUL.
    if value.len() >= field.len() {
        return Err(Error::BadPath(path.to_owned()));
    }
    field[..value.len()].copy_from_slice(value.as_bytes());
    Ok(())
}

fn put_octal(field: &mut [u8], value: u64, path: &str) -> Result<(), Error> {
    let digits = field.len() - 1;
    let text = format!("{value:0digits$o}");
    if text.len() > digits {
        return Err(Error::TooLarge(path.to_owned()));
    }
    field[..digits].copy_from_slice(text.as_bytes());
    field[digits] = 0;
    Ok(())
}

fn parse_octal(field: &[u8]) -> Option<u64> {
    let text = std::str::from_utf8(field).ok()?;
    let text = text.trim_matches(|c: char| c == '\0' || c == ' ');
    if text.is_empty() {
        return Some(0);
    }
    u64::from_str_radix(text, 8).ok()
}

fn c_str(field: &[u8]) -> String {
    let end = field.iter().position(|&b| b == 0).unwrap_or(field.len());
    String::from_utf8_lossy(&field[..end]).into_owned()
}

/// Checks that `path` (from a layer) is a safe relative path, for unpacking.
pub fn safe_path(path: &str) -> Result<&str, Error> {
    check_path(path)?;
    Ok(path)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_sorted_and_stable() {
        let entries = vec![
            Entry::file("b", 0o755, b"binary".to_vec()),
            Entry::symlink("a", "b"),
            Entry::dir("Files", 0o755),
        ];
        let first = write(&entries, 1_700_000_000).unwrap();
        let second = write(&entries, 1_700_000_000).unwrap();
        assert_eq!(first, second);
        assert_eq!(first.len() % BLOCK, 0);
        let back = read(&first).unwrap();
        let paths: Vec<_> = back.iter().map(|e| e.path.as_str()).collect();
        assert_eq!(paths, ["Files", "a", "b"]);
        assert_eq!(back[2], entries[0]);
        assert_eq!(back[1].kind, Kind::Symlink("b".into()));
    }

    #[test]
    fn refuses_escaping_and_long_paths() {
        for path in ["/abs", "../up", "a//b", ""] {
            assert!(matches!(
                write(&[Entry::dir(path, 0o755)], 0),
                Err(Error::BadPath(_))
            ));
        }
        let long = "x".repeat(100);
        assert!(write(&[Entry::dir(&long, 0o755)], 0).is_err());
    }

    #[test]
    fn detects_corruption() {
        let mut archive = write(&[Entry::file("f", 0o644, b"data".to_vec())], 0).unwrap();
        archive[0] = b'g';
        assert!(matches!(read(&archive), Err(Error::Tar(_))));
        assert!(read(&[0u8; 100]).is_err());
    }
}
