//! Reloading the price table without a restart: on SIGHUP the Kafka worker reads
//! its config file again (and the `TALLY_*` environment it started with) and
//! applies the new price table between two batches, under the rule of a restart
//! (`checkpoint::evolution::compare`): every price entry added, removed or changed
//! takes effect after the high-water `completed_ts` of every partition the worker
//! owns. Then every record before the swap was priced where both tables agree and
//! every record after it by the new one — what a replay under the new table from the
//! log start computes — and the next checkpoints carry the new fingerprint.
//!
//! Only prices are reloaded: any other difference in the semantic config refuses
//! the reload (naming the key), and settings outside it take effect at the next
//! restart. A refused or failed reload changes nothing and is logged as an error.

use std::collections::BTreeSet;
use std::path::Path;
use std::sync::Arc;

use tracing::{error, info, warn};

use super::worker::Worker;
use crate::checkpoint::evolution::{compare, Rules, Semantics};
use crate::config::rating::from_source;
use crate::config::Config;

impl Worker {
    /// Reloads the price table from `path` (see the module header).
    pub(crate) fn reload_prices(&mut self, path: Option<&Path>) {
        match self.try_reload(path) {
            Ok(None) => info!("price reload (SIGHUP): the price table is unchanged"),
            Ok(Some(n)) => info!(
                changes = n,
                fingerprint = %&self.job.rules.fingerprint[..12],
                "price table reloaded (SIGHUP)"
            ),
            Err(why) => {
                error!("PRICE RELOAD REFUSED (SIGHUP): {why}; the running price table stays")
            }
        }
    }

    fn try_reload(&mut self, path: Option<&Path>) -> Result<Option<usize>, String> {
        let cfg = Config::load(path).map_err(|e| e.to_string())?;
        let engine = cfg.engine().map_err(|e| e.to_string())?;
        let new = Semantics::of(
            &cfg.topics.input,
            &engine,
            cfg.watermark.idle_timeout.0.map(|m| m.0),
        );
        let Some(now) = &self.job.rules.semantics else {
            return Err("the running rules are not known".into());
        };
        let mut changes = BTreeSet::new();
        if self.parts.is_empty() {
            changes.extend(compare(now, &new, None, Some(from_source))?);
        }
        for (p, hw) in self.parts.high_waters() {
            let found = compare(now, &new, hw, Some(from_source))
                .map_err(|why| format!("partition {p}: {why}"))?;
            changes.extend(found);
        }
        if changes.is_empty() {
            return Ok(None);
        }
        for change in &changes {
            warn!(change = %change, "price table reloaded: compatible change");
        }
        if let Ok(mut shared) = self.shared_engine.lock() {
            *shared = engine.clone();
        }
        self.parts.set_engine(engine);
        let rules = Arc::new(Rules::of(new).with_rating_parser(from_source));
        self.job.rules = rules.clone();
        self.coord.set_rules(rules);
        Ok(Some(changes.len()))
    }
}
