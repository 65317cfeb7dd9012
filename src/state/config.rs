//! `[state]`: where the working copy lives and the memory budget of window
//! state and dedup ids (docs/reference/configuration.md, docs/DESIGN.md §7.7).
//! The section is this module's; the config tree (`config`) holds it.

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use crate::base::size::Budget;

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct StateConfig {
    pub dir: PathBuf,
    /// Memory for window state and dedup ids per worker; windows beyond it are
    /// evicted to RocksDB after a commit (read back when touched), and dedup ids
    /// move there behind filters (docs/operations/memory.md). `"off"`: unlimited.
    pub memory_budget: Budget,
}

impl Default for StateConfig {
    fn default() -> Self {
        Self {
            dir: "./data/state".into(),
            memory_budget: Budget(Some(512 << 20)),
        }
    }
}

impl StateConfig {
    /// The bytes of windows a worker may hold in memory (`memory_budget`), as
    /// `engine::window_bytes` counts them.
    pub(crate) fn memory_budget_bytes(&self) -> Option<usize> {
        self.memory_budget
            .0
            .map(|b| usize::try_from(b).unwrap_or(usize::MAX))
    }
}
