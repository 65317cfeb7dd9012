//! A checkpoint store in a local (or mounted, e.g. NFS) directory.
//!
//! Invariants: an object is a regular file `<root>/<key>`; `put_new` writes a
//! temporary file `<dir>/.<name>.tmp-<pid>-<n>`, fsyncs it, hard-links it to its
//! name (which fails if the name exists: create, never replace), removes the
//! temporary name and fsyncs the directory — so a crash leaves the object whole or
//! absent, plus at most a temporary file that `list` shows and retention deletes.
//! Deleting an object also removes its directory once empty.
//!
//! Reads never block on what is not a regular file: `get` opens with
//! `O_NONBLOCK` (a FIFO opens at once instead of waiting for a writer; the flag
//! changes nothing for a regular file) and refuses anything else by its type
//! before reading a byte.

use std::fs;
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use super::{valid_key, ObjectError, ObjectInfo, Objects};

pub(crate) struct LocalObjects {
    root: PathBuf,
}

static TMP_SEQ: AtomicU64 = AtomicU64::new(0);

impl LocalObjects {
    /// The store rooted at `root` (created if missing).
    pub(crate) fn create(root: &Path) -> Result<Self, ObjectError> {
        fs::create_dir_all(root).map_err(io(root))?;
        Ok(Self { root: root.into() })
    }

    /// The existing store at `root` (for inspection: creates nothing).
    pub(crate) fn existing(root: &Path) -> Result<Self, ObjectError> {
        if !root.is_dir() {
            return Err(ObjectError::NotFound {
                location: format!("{} (no checkpoint store here)", root.display()),
            });
        }
        Ok(Self { root: root.into() })
    }

    fn path(&self, key: &str) -> Result<PathBuf, ObjectError> {
        if !valid_key(key) {
            return Err(ObjectError::Refused {
                location: format!("{}/{key:?}", self.root.display()),
                msg: "not a key of this store".into(),
            });
        }
        Ok(self.root.join(key))
    }
}

fn io(path: &Path) -> impl FnOnce(std::io::Error) -> ObjectError + '_ {
    move |e| match e.kind() {
        std::io::ErrorKind::NotFound => ObjectError::NotFound {
            location: path.display().to_string(),
        },
        _ => ObjectError::Io {
            location: path.display().to_string(),
            msg: e.to_string(),
        },
    }
}

/// Opens `path` for reading without waiting: a FIFO without a writer (or a
/// device that would wait) opens at once, so its type can be refused.
fn open_nonblocking(path: &Path) -> std::io::Result<fs::File> {
    use std::os::unix::fs::OpenOptionsExt;
    fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK)
        .open(path)
}

fn sync_dir(dir: &Path) -> Result<(), ObjectError> {
    fs::File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(io(dir))
}

impl Objects for LocalObjects {
    fn location(&self, key: &str) -> String {
        self.root.join(key).display().to_string()
    }

    fn put_new(&self, key: &str, bytes: &[u8]) -> Result<(), ObjectError> {
        let path = self.path(key)?;
        let dir = path.parent().unwrap_or(&self.root);
        fs::create_dir_all(dir).map_err(io(dir))?;
        let name = path.file_name().unwrap_or_default().to_string_lossy();
        let n = TMP_SEQ.fetch_add(1, Ordering::Relaxed);
        let tmp = dir.join(format!(".{name}.tmp-{}-{n}", std::process::id()));
        let mut f = fs::File::create(&tmp).map_err(io(&tmp))?;
        f.write_all(bytes)
            .and_then(|_| f.sync_all())
            .map_err(io(&tmp))?;
        drop(f);
        let linked = fs::hard_link(&tmp, &path);
        let _ = fs::remove_file(&tmp);
        match linked {
            Ok(()) => sync_dir(dir),
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => Err(ObjectError::Exists {
                location: path.display().to_string(),
            }),
            Err(e) => Err(io(&path)(e)),
        }
    }

    fn get(&self, key: &str, limit: u64) -> Result<Vec<u8>, ObjectError> {
        let path = self.path(key)?;
        let refused = |msg: String| ObjectError::Refused {
            location: path.display().to_string(),
            msg,
        };
        let f = open_nonblocking(&path).map_err(io(&path))?;
        let md = f.metadata().map_err(io(&path))?;
        if !md.is_file() {
            return Err(refused(format!(
                "not a regular file ({:?}); a checkpoint holds only regular files",
                md.file_type()
            )));
        }
        if md.len() > limit {
            return Err(refused(format!(
                "{} bytes, more than the {limit} this object can be",
                md.len()
            )));
        }
        // A file that grows while being read is cut at `limit + 1` bytes, so the
        // caller's size check fails instead of the allocation.
        let mut buf = Vec::with_capacity(md.len() as usize);
        f.take(limit.saturating_add(1))
            .read_to_end(&mut buf)
            .map_err(io(&path))?;
        Ok(buf)
    }

    fn list(&self) -> Result<Vec<ObjectInfo>, ObjectError> {
        let mut out = Vec::new();
        let mut dirs = vec![self.root.clone()];
        while let Some(dir) = dirs.pop() {
            let entries = match fs::read_dir(&dir) {
                Ok(e) => e,
                // Removed by a concurrent retention.
                Err(e) if e.kind() == std::io::ErrorKind::NotFound && dir != self.root => continue,
                Err(e) => return Err(io(&dir)(e)),
            };
            for e in entries {
                let e = e.map_err(io(&dir))?;
                let path = e.path();
                let Ok(md) = fs::symlink_metadata(&path) else {
                    continue;
                };
                if md.is_dir() {
                    dirs.push(path);
                    continue;
                }
                let Ok(rel) = path.strip_prefix(&self.root) else {
                    continue;
                };
                let modified_ms = md
                    .modified()
                    .ok()
                    .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
                    .map_or(0, |d| d.as_millis() as i64);
                out.push(ObjectInfo {
                    key: rel.to_string_lossy().into_owned(),
                    size: md.len(),
                    modified_ms,
                });
            }
        }
        Ok(out)
    }

    fn delete(&self, key: &str) -> Result<(), ObjectError> {
        let path = self.path(key)?;
        match fs::remove_file(&path) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(io(&path)(e)),
        }
        // Empty directories up to the root go with their last object.
        let mut dir = path.parent();
        while let Some(d) = dir.filter(|d| *d != self.root && d.starts_with(&self.root)) {
            if fs::remove_dir(d).is_err() {
                break;
            }
            dir = d.parent();
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn put_new_creates_once_and_never_replaces() {
        let dir = std::env::temp_dir().join(format!("tally-local-objects-{}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        let s = LocalObjects::create(&dir).unwrap();
        s.put_new("chk-1-w/MANIFEST", b"one").unwrap();
        let again = s.put_new("chk-1-w/MANIFEST", b"two");
        assert!(
            matches!(again, Err(ObjectError::Exists { .. })),
            "{again:?}"
        );
        assert_eq!(s.get("chk-1-w/MANIFEST", 10).unwrap(), b"one");
        let big = s.get("chk-1-w/MANIFEST", 2);
        assert!(matches!(big, Err(ObjectError::Refused { .. })), "{big:?}");
        assert!(matches!(
            s.get("chk-1-w/none", 10),
            Err(ObjectError::NotFound { .. })
        ));
        let keys: Vec<String> = s.list().unwrap().into_iter().map(|o| o.key).collect();
        assert_eq!(keys, ["chk-1-w/MANIFEST"], "no temporary file is left");
        assert!(s.get("../escape", 10).is_err());
        s.delete("chk-1-w/MANIFEST").unwrap();
        s.delete("chk-1-w/MANIFEST").unwrap();
        assert!(
            !dir.join("chk-1-w").exists(),
            "the empty directory goes too"
        );
        assert!(dir.exists(), "the root stays");
        fs::remove_dir_all(&dir).unwrap();
    }

    /// Issue 33, defect 5: a FIFO in place of an object is refused at once (it
    /// used to block in `open`, waiting for a writer that never comes).
    #[test]
    fn a_fifo_in_place_of_an_object_is_refused_without_blocking() {
        let dir = std::env::temp_dir().join(format!("tally-local-fifo-{}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        let s = LocalObjects::create(&dir).unwrap();
        fs::create_dir_all(dir.join("chk-1-w")).unwrap();
        let fifo = dir.join("chk-1-w/MANIFEST");
        let made = std::process::Command::new("mkfifo").arg(&fifo).status();
        assert!(made.unwrap().success());
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let _ = tx.send(s.get("chk-1-w/MANIFEST", 10));
        });
        let got = rx
            .recv_timeout(std::time::Duration::from_secs(10))
            .expect("get blocked on a FIFO");
        match got {
            Err(ObjectError::Refused { msg, .. }) => {
                assert!(msg.contains("not a regular file"), "{msg}")
            }
            other => panic!("{other:?}"),
        }
        fs::remove_dir_all(&dir).unwrap();
    }
}
