//! The files a file run reads and writes, and the check that no output is the input.
//!
//! A run writes three files: the results (`--output-file OUT`), `OUT.late.jsonl` and
//! `OUT.dlq.jsonl` (for an `OUT` with an extension `.e`, the side files are
//! `OUT.late.jsonl` too: `results.jsonl` → `results.jsonl.late.jsonl`). Creating a
//! file truncates it, and the working copy `<state.dir>/rocksdb` is wiped at start.
//!
//! Invariant: `check` runs before anything is opened for writing or deleted, and
//! refuses, naming both paths, when
//! - an output is the input: the same file by device and inode (a second name, a hard
//!   link or a symlink is the same file), or the input lies in a directory the run
//!   wipes (`<state.dir>/rocksdb`) or prunes (its checkpoint store);
//! - two outputs are the same file (a link between them, or a dangling symlink that
//!   would be created at another output's path).
//!
//! An output that does not exist yet is identified by its canonical parent and name
//! (after following a dangling symlink), so two such outputs are the same file exactly
//! when creating them would open one file.

use std::fs;
use std::io;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use super::WorkerError;
use crate::base::error::Refusal;

/// Everything a file run reads and writes.
#[derive(Debug, Clone)]
pub(crate) struct Paths {
    pub input: PathBuf,
    pub output: PathBuf,
    pub late: PathBuf,
    pub dlq: PathBuf,
}

impl Paths {
    pub(crate) fn new(input: &Path, output: &Path) -> Self {
        let side = |ext: &str| {
            output.with_extension(format!(
                "{}{ext}",
                output
                    .extension()
                    .map_or(String::new(), |e| format!("{}.", e.to_string_lossy()))
            ))
        };
        Self {
            input: input.to_path_buf(),
            output: output.to_path_buf(),
            late: side("late.jsonl"),
            dlq: side("dlq.jsonl"),
        }
    }

    /// The outputs, each with what it is (for messages).
    fn outputs(&self) -> [(&'static str, &Path); 3] {
        [
            ("the results file (--output-file)", &self.output),
            ("the late-events file", &self.late),
            ("the dead-letter file", &self.dlq),
        ]
    }

    /// Refuses a run that would overwrite its input, or write two outputs into one
    /// file; `wiped` are directories the run deletes or prunes. Creates nothing.
    pub(crate) fn check(&self, wiped: &[&Path]) -> Result<(), WorkerError> {
        let io_err = |path: &Path| {
            let path = path.display().to_string();
            move |source| WorkerError::Io { path, source }
        };
        let input = fs::metadata(&self.input).map_err(io_err(&self.input))?;
        let input_id = Identity::File(input.dev(), input.ino());
        let mut seen: Vec<(&str, &Path, Identity)> = Vec::new();
        for (what, path) in self.outputs() {
            let id = identity(path, 0).map_err(io_err(path))?;
            if id == input_id {
                return Err(WorkerError::Refused(Refusal::setup(format!(
                    "{what} {} is the input file {} (the same file: device {}, inode {}); \
                     writing it would destroy the input before it is read. Choose another \
                     --output-file",
                    path.display(),
                    self.input.display(),
                    input.dev(),
                    input.ino()
                ))));
            }
            if let Some((other, other_path, _)) = seen.iter().find(|(_, _, o)| *o == id) {
                return Err(WorkerError::Refused(Refusal::setup(format!(
                    "{what} {} and {other} {} are the same file; one would overwrite the \
                     other. Remove the link between them or choose another --output-file",
                    path.display(),
                    other_path.display()
                ))));
            }
            seen.push((what, path, id));
        }
        // An input without a path of its own (a pipe: /dev/stdin → pipe:[…]) is in no
        // directory.
        let Ok(canonical_input) = fs::canonicalize(&self.input) else {
            return Ok(());
        };
        for dir in wiped {
            if let Ok(dir) = fs::canonicalize(dir) {
                if canonical_input.starts_with(&dir) {
                    return Err(WorkerError::Refused(Refusal::setup(format!(
                        "the input file {} is inside {}, which a file run deletes; move the \
                         input or change state.dir / checkpoint.dir",
                        self.input.display(),
                        dir.display()
                    ))));
                }
            }
        }
        Ok(())
    }
}

/// Which file a path opens (or would create).
#[derive(Debug, PartialEq, Eq)]
enum Identity {
    /// An existing file: device and inode.
    File(u64, u64),
    /// No file yet: the canonical parent directory and the name it would be created as.
    Absent(PathBuf),
}

/// Symlinks followed at most (the kernel's own limit is 40; ELOOP beyond).
const MAX_LINKS: usize = 40;

fn identity(path: &Path, depth: usize) -> io::Result<Identity> {
    match fs::metadata(path) {
        Ok(m) => Ok(Identity::File(m.dev(), m.ino())),
        Err(e) if e.kind() == io::ErrorKind::NotFound => {
            let parent = match path.parent() {
                Some(p) if !p.as_os_str().is_empty() => p,
                _ => Path::new("."),
            };
            // A dangling symlink: creating the path creates its target.
            if let Ok(target) = fs::read_link(path) {
                if depth >= MAX_LINKS {
                    return Err(io::Error::other("too many levels of symbolic links"));
                }
                return identity(&parent.join(target), depth + 1);
            }
            let name = path.file_name().ok_or(e)?;
            // A parent that does not exist fails later, when the file is created.
            let parent = fs::canonicalize(parent).unwrap_or_else(|_| parent.to_path_buf());
            Ok(Identity::Absent(parent.join(name)))
        }
        Err(e) => Err(e),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dir(tag: &str) -> PathBuf {
        let p = std::env::temp_dir().join(format!("tally-paths-{tag}-{}", std::process::id()));
        let _ = fs::remove_dir_all(&p);
        fs::create_dir_all(&p).unwrap();
        p
    }

    fn refusal(p: &Paths, wiped: &[&Path]) -> String {
        match p.check(wiped) {
            Err(WorkerError::Refused(r)) => r.message,
            other => panic!("expected a refusal, got {other:?}"),
        }
    }

    #[test]
    fn side_files_follow_the_output_name() {
        let p = Paths::new(Path::new("in.jsonl"), Path::new("d/results.jsonl"));
        assert_eq!(p.late, Path::new("d/results.jsonl.late.jsonl"));
        assert_eq!(p.dlq, Path::new("d/results.jsonl.dlq.jsonl"));
        let p = Paths::new(Path::new("in.jsonl"), Path::new("results"));
        assert_eq!(p.dlq, Path::new("results.dlq.jsonl"));
    }

    #[test]
    fn distinct_files_pass_and_nothing_is_created() {
        let d = dir("ok");
        fs::write(d.join("in.jsonl"), "x\n").unwrap();
        let p = Paths::new(&d.join("in.jsonl"), &d.join("out.jsonl"));
        p.check(&[&d.join("state")]).unwrap();
        assert!(!d.join("out.jsonl").exists());
        fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn a_pipe_is_an_input() {
        use std::os::fd::AsRawFd;
        let d = dir("pipe");
        let mut child = std::process::Command::new("sleep")
            .arg("5")
            .stdout(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        let fd = child.stdout.as_ref().unwrap().as_raw_fd();
        let input = PathBuf::from(format!("/proc/self/fd/{fd}"));
        let checked = Paths::new(&input, &d.join("out.jsonl")).check(&[&d]);
        let _ = child.kill();
        let _ = child.wait();
        checked.unwrap();
        fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn an_output_that_is_the_input_is_refused_by_any_name() {
        let d = dir("same");
        let input = d.join("in.jsonl");
        fs::write(&input, "x\n").unwrap();
        // The same name, and a different spelling of it.
        let m = refusal(&Paths::new(&input, &input), &[]);
        assert!(m.contains("results file") && m.contains("in.jsonl"), "{m}");
        let m = refusal(&Paths::new(&input, &d.join(".").join("in.jsonl")), &[]);
        assert!(m.contains("is the input file"), "{m}");
        // A hard link and a symlink.
        fs::hard_link(&input, d.join("hard.jsonl")).unwrap();
        refusal(&Paths::new(&input, &d.join("hard.jsonl")), &[]);
        std::os::unix::fs::symlink(&input, d.join("soft.jsonl")).unwrap();
        refusal(&Paths::new(&input, &d.join("soft.jsonl")), &[]);
        // A side file: `OUT.late.jsonl` for an OUT without extension, and
        // `OUT.dlq.jsonl` for one with.
        let late = d.join("x.late.jsonl");
        fs::rename(&input, &late).unwrap();
        let m = refusal(&Paths::new(&late, &d.join("x")), &[]);
        assert!(m.contains("late-events file"), "{m}");
        let dlq = d.join("r.jsonl.dlq.jsonl");
        fs::rename(&late, &dlq).unwrap();
        let m = refusal(&Paths::new(&dlq, &d.join("r.jsonl")), &[]);
        assert!(m.contains("dead-letter file"), "{m}");
        assert_eq!(fs::read(&dlq).unwrap(), b"x\n");
        fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn two_outputs_that_are_one_file_are_refused() {
        let d = dir("outs");
        fs::write(d.join("in.jsonl"), "x\n").unwrap();
        // An existing link, and a dangling symlink to another output's path.
        fs::write(d.join("out.jsonl"), "").unwrap();
        fs::hard_link(d.join("out.jsonl"), d.join("out.jsonl.late.jsonl")).unwrap();
        let m = refusal(&Paths::new(&d.join("in.jsonl"), &d.join("out.jsonl")), &[]);
        assert!(m.contains("are the same file"), "{m}");
        std::os::unix::fs::symlink("b", d.join("b.dlq.jsonl")).unwrap();
        let m = refusal(&Paths::new(&d.join("in.jsonl"), &d.join("b")), &[]);
        assert!(
            m.contains("dead-letter file") && m.contains("results file"),
            "{m}"
        );
        fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn an_input_inside_a_wiped_directory_is_refused() {
        let d = dir("wiped");
        fs::create_dir_all(d.join("state/rocksdb")).unwrap();
        fs::write(d.join("state/rocksdb/in.jsonl"), "x\n").unwrap();
        let p = Paths::new(&d.join("state/rocksdb/in.jsonl"), &d.join("out.jsonl"));
        let m = refusal(&p, &[&d.join("state/rocksdb")]);
        assert!(m.contains("which a file run deletes"), "{m}");
        fs::remove_dir_all(&d).unwrap();
    }
}
