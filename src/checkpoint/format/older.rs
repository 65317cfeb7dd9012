//! The manifest bodies of formats 3 and 4, still read (`super::decode_manifest`)
//! and upgraded in memory to the current body; never written. Their fields are
//! the durable format: they change only with a new format number.

use serde::{Deserialize, Serialize};

use super::{KindBody, LedgerBody, ManifestBody, PartBody, PartitionBody, SegmentBody};
use crate::checkpoint::CheckpointId;
use crate::state::stored::StoredCounters;

/// Format 4's manifest body: no semantics, no high-water times.
#[derive(Debug, Serialize, Deserialize)]
pub(super) struct ManifestBodyV4 {
    pub(super) id: u64,
    pub(super) worker: String,
    pub(super) created_at_ms: i64,
    pub(super) group: String,
    pub(super) topic: String,
    pub(super) fingerprint: String,
    pub(super) partitions: Vec<PartitionBodyV4>,
}

#[derive(Debug, Serialize, Deserialize)]
pub(super) struct PartitionBodyV4 {
    pub(super) partition: i32,
    pub(super) next_offset: i64,
    pub(super) watermark: Option<i64>,
    pub(super) counters: StoredCounters,
    pub(super) ledger: LedgerBody,
    pub(super) segments: Vec<SegmentBody>,
}

impl ManifestBodyV4 {
    /// The same manifest in format 5, with nothing known of its semantics.
    pub(super) fn upgrade(self) -> ManifestBody {
        ManifestBody {
            id: self.id,
            worker: self.worker,
            created_at_ms: self.created_at_ms,
            group: self.group,
            topic: self.topic,
            fingerprint: self.fingerprint,
            semantics: None,
            partitions: self
                .partitions
                .into_iter()
                .map(|p| PartitionBody {
                    partition: p.partition,
                    next_offset: p.next_offset,
                    watermark: p.watermark,
                    high_water: None,
                    counters: p.counters,
                    ledger: p.ledger,
                    segments: p.segments,
                })
                .collect(),
        }
    }
}

/// Format 3's manifest body: one run of parts per partition, in the checkpoint's
/// own directory.
#[derive(Debug, Serialize, Deserialize)]
pub(super) struct ManifestBodyV3 {
    pub(super) id: u64,
    pub(super) worker: String,
    pub(super) created_at_ms: i64,
    pub(super) group: String,
    pub(super) topic: String,
    pub(super) fingerprint: String,
    pub(super) partitions: Vec<PartitionBodyV3>,
}

#[derive(Debug, Serialize, Deserialize)]
pub(super) struct PartitionBodyV3 {
    pub(super) partition: i32,
    pub(super) next_offset: i64,
    pub(super) watermark: Option<i64>,
    pub(super) counters: StoredCounters,
    pub(super) ledger: LedgerBody,
    pub(super) parts: Vec<PartBody>,
}

impl ManifestBodyV3 {
    /// The same manifest in format 4: each partition a chain of one base.
    pub(super) fn upgrade(self) -> ManifestBodyV4 {
        let own = crate::checkpoint::names::checkpoint_name(CheckpointId(self.id), &self.worker);
        ManifestBodyV4 {
            id: self.id,
            worker: self.worker,
            created_at_ms: self.created_at_ms,
            group: self.group,
            topic: self.topic,
            fingerprint: self.fingerprint,
            partitions: self
                .partitions
                .into_iter()
                .map(|p| PartitionBodyV4 {
                    partition: p.partition,
                    next_offset: p.next_offset,
                    watermark: p.watermark,
                    counters: p.counters,
                    ledger: p.ledger,
                    segments: vec![SegmentBody {
                        checkpoint: own.clone(),
                        kind: KindBody::Base,
                        parts: p.parts,
                    }],
                })
                .collect(),
        }
    }
}
