//! How a chaos run starts its processes: a worker (with its static member id,
//! and armed at a crash point if asked), the sink, `reprocess-late --follow`.
//! Each is the `tally` binary beside `tally-dev`, on the run's config; workers
//! and the reprocessor append their logs beside their state (`state-<i>.log`,
//! `reprocess.log` in the run's directory).

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

use crate::devtools::support;

/// How processes of a run are started.
pub(super) struct Spawner {
    pub(super) exe: PathBuf,
    pub(super) cfg: PathBuf,
    pub(super) static_membership: bool,
}

impl Spawner {
    /// Worker `i`, with `group.instance.id = chaos-w<i>` under static membership,
    /// armed at `crash` (`<point>:<n>`) if given.
    pub(super) fn worker(
        &self,
        i: usize,
        state: &Path,
        crash: Option<&str>,
    ) -> anyhow::Result<Child> {
        let id = format!("chaos-w{i}");
        let mut envs = Vec::new();
        if self.static_membership {
            envs.push(("TALLY_KAFKA__GROUP_INSTANCE_ID", id.as_str()));
        }
        if let Some(c) = crash {
            envs.push(("TALLY_CRASH_AT", c));
        }
        support::spawn_worker(&self.exe, &self.cfg, state, &envs)
    }

    /// `tally reprocess-late --follow`, from the start of the late topic or from
    /// its group's committed position.
    pub(super) fn reprocess(&self, from: &str) -> anyhow::Result<Child> {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.cfg.with_file_name("reprocess.log"))?;
        Ok(Command::new(&self.exe)
            .args(["reprocess-late", "--follow", "--from", from, "--config"])
            .arg(&self.cfg)
            .env("TALLY_LOG", "info")
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()?)
    }

    pub(super) fn sink(&self, crash: Option<&str>) -> anyhow::Result<Child> {
        let mut cmd = Command::new(&self.exe);
        cmd.args(["sink", "--config"])
            .arg(&self.cfg)
            .env("TALLY_LOG", "warn")
            .stdout(Stdio::null());
        if let Some(c) = crash {
            cmd.env("TALLY_CRASH_AT", c);
        }
        Ok(cmd.spawn()?)
    }
}
