//! The fault loop's faults of the services around the processes: the dev
//! broker slow or down, a partition's leader moved, the S3 endpoint down,
//! PostgreSQL restarted.

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use super::Faults;
use crate::devtools::support;

/// Hands `command` to the dev broker: its control file, written whole.
pub(super) fn control_broker(ctl: &Path, command: &str) -> anyhow::Result<()> {
    let tmp = ctl.with_extension("tmp");
    std::fs::write(&tmp, format!("{command}\n"))?;
    std::fs::rename(&tmp, ctl)?;
    Ok(())
}

impl Faults<'_> {
    /// The dev broker down for 1–3 s, or (`slow`) every response of it delayed
    /// by 200–800 ms for 2–5 s; one broker fault at a time.
    pub(super) fn broker_fault(&mut self, slow: bool) -> anyhow::Result<()> {
        let (command, back, pause) = if slow {
            let rtt = self.between_ms(200, 800).as_millis();
            (format!("rtt {rtt}"), "rtt 0", self.between_ms(2000, 5000))
        } else {
            ("down".to_string(), "up", self.between_ms(1000, 3000))
        };
        let Some(ctl) = self.outside.broker_ctl else {
            return Ok(());
        };
        if self.broker_back.is_some() {
            return Ok(());
        }
        control_broker(ctl, &command)?;
        self.broker_back = Some((Instant::now() + pause, back));
        if slow {
            self.log.broker_slows += 1;
        } else {
            self.log.broker_downs += 1;
        }
        self.event(format!(
            "dev broker {command} for {:.1} s",
            pause.as_secs_f64()
        ));
        Ok(())
    }

    /// Moves the leadership of one partition of the input or the results topic
    /// to another broker (drawn before the metadata is asked, so the draws do
    /// not depend on it).
    pub(super) fn leader_change(&mut self) -> anyhow::Result<()> {
        let (topic, partitions) = if self.rng.below(2) == 0 {
            ("requests", self.plan.partitions)
        } else {
            ("tenant-cost", crate::devtools::chaos::RESULTS_PARTITIONS)
        };
        let p = self.rng.below(partitions as u64) as i32;
        let other = 1 + self.rng.below(crate::devtools::chaos::BROKERS as u64 - 1) as i32;
        let (Some(ctl), Some(kafka)) = (self.outside.broker_ctl, self.outside.kafka) else {
            return Ok(());
        };
        // Another broker than the leader: `other` skips over it.
        let from = support::leader(kafka, topic, p).ok();
        let to = match from {
            Some(f) if other >= f => other + 1,
            _ => other,
        };
        control_broker(ctl, &format!("leader {topic} {p} {to}"))?;
        self.log.leader_changes += 1;
        let from = from.map_or("?".to_string(), |f| f.to_string());
        self.event(format!(
            "leader of {topic}/{p} moved from broker {from} to {to}"
        ));
        Ok(())
    }

    /// The S3 endpoint is down, or came back less than 10 s ago.
    pub(super) fn s3_recently_down(&self) -> bool {
        self.s3_back.is_some()
            || self
                .s3_was_back
                .is_some_and(|t| t.elapsed() < Duration::from_secs(10))
    }

    /// Takes the S3 endpoint down for 1–4 s (unless it is down already).
    pub(super) fn s3_outage(&mut self) -> anyhow::Result<()> {
        let pause = self.between_ms(1000, 4000);
        let Some(proxy) = self.outside.s3 else {
            return Ok(());
        };
        if self.s3_back.is_some() {
            return Ok(());
        }
        proxy.down();
        self.s3_back = Some(Instant::now() + pause);
        self.log.s3_outages += 1;
        self.event(format!(
            "S3 endpoint down for {:.1} s (connections reset, new ones refused)",
            pause.as_secs_f64()
        ));
        Ok(())
    }

    pub(super) fn pg_restart(&mut self) -> anyhow::Result<()> {
        let Some(dir) = self.outside.pg_dir else {
            return Ok(());
        };
        let _restarting = crate::devtools::chaos::pg_restarting();
        let out = Command::new("scripts/pg.sh")
            .arg("restart")
            .arg(dir)
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .output()?;
        anyhow::ensure!(
            out.status.success(),
            "scripts/pg.sh restart failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        self.log.pg_restarts += 1;
        self.event("restarted PostgreSQL".into());
        Ok(())
    }
}
