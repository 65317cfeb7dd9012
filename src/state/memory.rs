//! What the working copy (RocksDB) may hold in memory, whatever the state's
//! size: a fixed amount, part of a worker's documented overhead beside
//! `state.memory_budget` (docs/DESIGN.md §7.7, docs/operations/memory.md).
//!
//! - One LRU cache of `CACHE_BYTES` holds data blocks and every table's index
//!   and filter blocks (otherwise each open table keeps its own, outside any
//!   cache, so a store of many files — the cold dedup index is written as one
//!   file per move — grows with its files).
//! - Memtables are charged to that cache (a `WriteBufferManager` of
//!   `MEMTABLE_BYTES`): a flush starts once they hold that much, so blocks and
//!   memtables together stay near `CACHE_BYTES`.
//! - Writes come in commit batches and spills, never per event: small
//!   memtables do not slow them.

use rocksdb::{BlockBasedIndexType, BlockBasedOptions, Cache, Options, WriteBufferManager};

/// RocksDB's cache: blocks, index and filter blocks, and the memtables' charge.
pub(crate) const CACHE_BYTES: usize = 16 << 20;

/// The memtables' share of `CACHE_BYTES` (two of `MEMTABLE_BYTES / 2`).
pub(crate) const MEMTABLE_BYTES: usize = 8 << 20;

/// The size of an index partition.
pub(crate) const PARTITION_BYTES: usize = 4 << 10;

/// A compaction's read-ahead per input file.
pub(crate) const READAHEAD_BYTES: usize = 256 << 10;

/// Bounds `opts`'s memory as the module header says.
pub(crate) fn bound(opts: &mut Options) {
    let cache = Cache::new_lru_cache(CACHE_BYTES);
    let mut table = BlockBasedOptions::default();
    table.set_block_cache(&cache);
    table.set_cache_index_and_filter_blocks(true);
    // Index blocks partitioned (`PARTITION_BYTES` each) behind a small top-level
    // index pinned in the cache: a point read of a cold dedup id pages in one
    // partition, not the whole index of a file (one block per file, hundreds
    // of KiB for a move of a million ids, evicted by the next read).
    table.set_index_type(BlockBasedIndexType::TwoLevelIndexSearch);
    table.set_metadata_block_size(PARTITION_BYTES);
    table.set_pin_top_level_index_and_filter(true);
    table.set_cache_index_and_filter_blocks_with_high_priority(true);
    opts.set_block_based_table_factory(&table);
    let buffers =
        WriteBufferManager::new_write_buffer_manager_with_cache(MEMTABLE_BYTES, false, cache);
    opts.set_write_buffer_manager(&buffers);
    opts.set_write_buffer_size(MEMTABLE_BYTES / 2);
    opts.set_max_write_buffer_number(2);
    // A compaction reads each input file ahead by this much (2 MiB by default:
    // tens of MiB for a compaction of many files).
    opts.set_compaction_readahead_size(READAHEAD_BYTES);
}
