//! `PartitionTask`: the per-partition state machine of docs/DESIGN.md §2.
//!
//! Rules, in the order they are applied to each record:
//! 1. size, parse, time-source and timestamp guards, pricing → dead letter on failure
//!    (a dead letter never touches the watermark);
//! 2. dedup by `request_id` → duplicate;
//! 3. lateness against the watermark *before* this event: `W >= end-1+lateness` is too
//!    late; `W >= end-1` folds into a fired (or new) window and emits a late pane at
//!    once; otherwise the event folds into an open window;
//! 4. the event advances the watermark; open windows with `end-1 <= W` emit their
//!    on-time pane (in `(window_end, tenant_id)` order), and windows with
//!    `end-1+lateness <= W` are purged.
//!
//! Invariants: `version` = events folded into the window, so equal versions mean equal
//! content; `pane_index` counts the panes a window has emitted. Open and fired windows
//! are disjoint, and every fired window satisfies `W < end-1+lateness`. Windows may be
//! evicted to the state store under a memory budget (`spill.rs`); every rule above
//! applies to them unchanged. An end with many evicted windows fires in steps
//! (`firing`): until it is done, no record is routed.

mod firing;

use std::collections::{BTreeMap, HashMap};
use std::ops::Range;
use std::sync::Arc;

use serde::{Deserialize, Serialize};

use super::acc::{WindowAcc, LINE_BYTES};
use super::dedup::{Dedup, DedupDelta, Fingerprint};
use super::prepared::Prepared;
use super::result::{PaneKind, ResultKind, ResultRecord};
use super::spill::{change_bytes, filter_bytes, SpillStore, Spilled, WINDOW_BYTES};
use super::spill_error::SpillError;
use super::step1::{check, Checked, Folding};
use super::{Counters, EngineConfig, RecordIn, Route, TimeSource};
use crate::base::histogram::Histogram;
use crate::model::{DeadLetterReason, Partition};
use crate::time::EventTime;
use crate::time::Watermark;

/// `(window_end, tenant_id)`: the identity of a window within a partition.
pub type WindowKey = (i64, Box<str>);

/// What one window in memory costs, for `state.memory_budget`: the measured
/// `spill::WINDOW_BYTES` (which includes a tenant id of up to 16 bytes) plus the
/// bytes of a longer tenant id — so the budget holds whatever the ids' length.
pub fn window_bytes(tenant: &str) -> usize {
    WINDOW_BYTES + tenant.len().saturating_sub(16)
}

/// `window_bytes` plus the window's line items beyond the first.
fn acc_bytes(tenant: &str, acc: &WindowAcc) -> usize {
    window_bytes(tenant) + acc.lines_bytes()
}

/// Whether a window's on-time pane has fired (stored as `open: bool`, `state::stored`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum WindowPhase {
    Fired,
    Open,
}

/// Tenant → accumulator of one window end (foldhash: tenant ids are hashed once
/// per event; a keyed fast hash, seeded per process).
type Tenants = HashMap<Box<str>, WindowAcc, foldhash::fast::RandomState>;
type Windows = BTreeMap<i64, Tenants>;

/// A restorable image of a task.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TaskSnapshot {
    /// With its lead state; the lead limit is the config's.
    pub watermark: Option<Watermark>,
    pub counters: Counters,
    /// The greatest `completed_ts` priced; the outer `None`: not known (restored
    /// from checkpoint format 4, see `restore`).
    pub high_water: Option<Option<i64>>,
    /// Open (not yet fired) windows.
    pub open: Vec<(WindowKey, WindowAcc)>,
    /// Fired windows retained for allowed lateness.
    pub fired: Vec<(WindowKey, WindowAcc)>,
    /// Live dedup entries (fingerprints, see `dedup`), sorted.
    pub dedup: Vec<(Fingerprint, i64)>,
}

/// The fewest dedup ids moved out of memory at once: a tiny budget must not
/// turn every commit into a file of a few ids. (Unit tests move any number, so
/// their short inputs reach the cold tier.)
#[cfg(not(test))]
const MIN_COLD_MOVE: usize = 1024;
#[cfg(test)]
const MIN_COLD_MOVE: usize = 1;

pub struct PartitionTask {
    partition: Partition,
    cfg: Arc<EngineConfig>,
    watermark: Watermark,
    /// The greatest `completed_ts` of a record priced (folded, too late, duplicate).
    high_water: Option<i64>,
    open: Windows,
    fired: Windows,
    dedup: Dedup,
    counters: Counters,
    /// Windows ending at or below this were purged since the last `drain_changes`.
    purged_through: Option<i64>,
    /// The windows that turned dirty since the last `drain_changes` (each once;
    /// some may be gone since): what it writes, without scanning every window.
    dirty: Vec<WindowKey>,
    /// `change_bytes` summed over `dirty`.
    dirty_bytes: usize,
    /// Windows evicted to the state store.
    spilled: Spilled,
    /// `window_bytes` summed over the windows in memory (`open` and `fired`).
    held_bytes: usize,
    /// Wall clock at ingest minus event time (observability only; not state).
    delay: Histogram,
    /// Partition max event time minus event time, before the event (not state).
    disorder: Histogram,
    /// The greatest window end at or below which every window is purged, by the
    /// watermark (`final_through`); derived from the watermark, not state.
    final_through: Option<i64>,
    /// Where `final_through` moved since `take_progress`; `None`: not tracked.
    progress: Option<Vec<Progress>>,
    /// A window end firing in steps (`firing`): records wait until it is done.
    firing: Option<Box<firing::Firing>>,
    /// Stored windows a firing step reads at most (`firing::RUN`).
    fire_run: usize,
}

/// A move of a partition's progress (`PartitionTask::take_progress`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Progress {
    /// Before the `at`-th pane appended to the caller's `out` since the last
    /// `take_progress` (after the last, if there are `at`).
    pub at: usize,
    /// Every window ending at or before it is final here.
    pub final_through: i64,
    /// The watermark that made it.
    pub watermark: i64,
}

/// The greatest window end `E` the watermark `w` has purged: `E - 1 + lateness <=
/// w`, on the window grid (`None` before any event time).
pub(crate) fn final_through(cfg: &EngineConfig, w: i64) -> Option<i64> {
    if w == i64::MIN {
        return None;
    }
    let x = w.saturating_add(1).saturating_sub(cfg.allowed_lateness_ms);
    cfg.window.assign(x).map(|win| win.start)
}

impl PartitionTask {
    pub(crate) fn new(partition: Partition, cfg: Arc<EngineConfig>) -> Self {
        Self::restore(partition, cfg, TaskSnapshot::default())
    }

    pub(crate) fn restore(
        partition: Partition,
        cfg: Arc<EngineConfig>,
        snap: TaskSnapshot,
    ) -> Self {
        let collect = |list: Vec<(WindowKey, WindowAcc)>| {
            let mut m = Windows::new();
            for ((end, tenant), acc) in list {
                m.entry(end).or_default().insert(tenant, acc);
            }
            m
        };
        let open = collect(snap.open);
        let fired = collect(snap.fired);
        let held_bytes = [&open, &fired]
            .iter()
            .flat_map(|m| m.values())
            .flat_map(|t| t.iter())
            .map(|(k, a)| acc_bytes(k, a))
            .sum();
        let watermark = snap
            .watermark
            .unwrap_or(Watermark::new(cfg.max_out_of_orderness_ms, None))
            .with_max_lead(cfg.max_lead_ms);
        // Format 4 stored no high-water time: its watermark followed every folded
        // record, and no too-late or duplicate record is ahead of that, so with
        // `completed_ts` as the time source it is the confirmed max; otherwise it is
        // unknown, and taken as "everything" (no price change comes after it).
        let high_water =
            snap.high_water
                .unwrap_or_else(|| match (snap.counters.consumed, cfg.time_source) {
                    (0, _) => None,
                    (_, TimeSource::CompletedTs) => watermark.max_ts(),
                    _ => Some(i64::MAX),
                });
        let watermark_now = watermark.current();
        Self {
            partition,
            held_bytes,
            high_water,
            open,
            fired,
            dedup: Dedup::restore(snap.dedup, watermark.current()),
            watermark,
            counters: snap.counters,
            purged_through: None,
            dirty: Vec::new(),
            dirty_bytes: 0,
            spilled: Spilled::default(),
            delay: Histogram::default(),
            disorder: Histogram::default(),
            final_through: final_through(&cfg, watermark_now),
            progress: None,
            firing: None,
            fire_run: firing::RUN,
            cfg,
        }
    }

    /// `restore` of the windows in memory, with `stored` windows — `(phase,
    /// end, count)` — left in `store`, as an eviction leaves them (`state::bounded`).
    pub(crate) fn restore_stored(
        partition: Partition,
        cfg: Arc<EngineConfig>,
        snap: TaskSnapshot,
        stored: &[(WindowPhase, i64, u64)],
        store: Arc<dyn SpillStore>,
    ) -> Self {
        let mut task = Self::restore(partition, cfg, snap);
        task.attach_spill(store);
        for &(phase, end, n) in stored {
            task.spilled.add(phase, end, n);
        }
        task
    }

    /// Moves restored dedup ids (live, sorted, one per fingerprint; their
    /// chunks in the store) to the cold tier, with filters sized as an
    /// eviction to `keep_bytes` sizes them.
    pub(crate) fn restore_cold_ids(
        &mut self,
        ids: Vec<(Fingerprint, i64)>,
        keep_bytes: usize,
    ) -> Result<(), String> {
        self.dedup.restore_cold(ids, filter_bytes(keep_bytes))
    }

    pub fn partition(&self) -> Partition {
        self.partition
    }

    /// Runs on `cfg` from the next record on (a price reload: the caller checked
    /// that only prices effective after `high_water` differ).
    pub(crate) fn set_config(&mut self, cfg: Arc<EngineConfig>) {
        self.cfg = cfg;
    }

    /// The configuration the task runs (`Prepared` batches must come from it).
    pub(crate) fn config(&self) -> &Arc<EngineConfig> {
        &self.cfg
    }

    pub(crate) fn watermark(&self) -> EventTime {
        EventTime(self.watermark.current())
    }

    pub(crate) fn watermark_state(&self) -> &Watermark {
        &self.watermark
    }

    /// The greatest `completed_ts` this partition has priced (a price change
    /// effective later cannot change anything it produced).
    pub(crate) fn high_water(&self) -> Option<EventTime> {
        self.high_water.map(EventTime)
    }

    /// Records held by the watermark's lead limit (`time::watermark`).
    pub(crate) fn held(&self) -> u64 {
        self.watermark.held()
    }

    pub(crate) fn counters(&self) -> Counters {
        self.counters
    }

    pub(crate) fn max_ts(&self) -> Option<EventTime> {
        self.watermark.max_ts().map(EventTime)
    }

    pub(crate) fn dedup_ids(&self) -> usize {
        self.dedup.len()
    }

    pub(crate) fn delay(&self) -> &Histogram {
        &self.delay
    }

    pub(crate) fn disorder(&self) -> &Histogram {
        &self.disorder
    }

    /// Idleness: advances the watermark to `to` without data (wall-clock driven),
    /// firing and purging as if an event had moved it. Returns whether it moved.
    /// An end with many evicted windows may be left firing (`resume_firing`).
    pub(crate) fn force_watermark(
        &mut self,
        to: EventTime,
        out: &mut Vec<ResultRecord>,
    ) -> Result<bool, SpillError> {
        self.finish_firing(out);
        if !self.watermark.force(to.0) {
            return Ok(false);
        }
        self.counters.idle_advances += 1;
        self.advance(out);
        self.spill_result(true)
    }

    /// The lowest watermark at which something would fire or purge, if any.
    pub(crate) fn next_deadline(&self) -> Option<EventTime> {
        let first = |a: &Windows, b: &BTreeMap<i64, u64>| {
            a.keys()
                .next()
                .into_iter()
                .chain(b.keys().next())
                .min()
                .copied()
        };
        let fire = first(&self.open, &self.spilled.open).map(|end| end - 1);
        let purge = first(&self.fired, &self.spilled.fired)
            .map(|end| (end - 1).saturating_add(self.cfg.allowed_lateness_ms));
        fire.into_iter().chain(purge).min().map(EventTime)
    }

    /// Windows held, in memory or evicted to the state store.
    pub(crate) fn open_windows(&self) -> usize {
        self.windows_in_memory() + self.spilled.total() as usize
    }

    /// Memory the windows in memory take, by `window_bytes` (what
    /// `state.memory_budget` bounds).
    pub(crate) fn memory_bytes(&self) -> usize {
        self.held_bytes
    }

    /// `memory_bytes` computed from scratch (tests check the running sum).
    #[cfg(test)]
    pub(crate) fn recount_bytes(&self) -> usize {
        [&self.open, &self.fired]
            .iter()
            .flat_map(|m| m.values())
            .flat_map(|t| t.iter())
            .map(|(k, a)| acc_bytes(k, a))
            .sum()
    }

    /// Windows held in memory.
    pub(crate) fn windows_in_memory(&self) -> usize {
        self.open.values().map(Tenants::len).sum::<usize>()
            + self.fired.values().map(Tenants::len).sum::<usize>()
    }

    /// Lets this task evict windows to `store` (which must hold every window as
    /// of the last `drain_changes`, like the state store after a commit).
    pub(crate) fn attach_spill(&mut self, store: Arc<dyn SpillStore>) {
        // Dedup ids move in buckets of a quarter of their horizon.
        let cfg = &self.cfg;
        let horizon = cfg
            .window
            .size_ms
            .saturating_add(cfg.allowed_lateness_ms)
            .saturating_add(cfg.dedup_extra_ms);
        self.dedup
            .attach_cold(store.clone(), self.partition, (horizon / 4).max(1));
        self.spilled.attach(store);
    }

    /// `v`, or the failure to read an evicted window or a cold dedup id back
    /// (or to move ids out) during the call that returns it: the task's output
    /// since is void. Every call that may read or move returns through here, so
    /// the failure travels with the output it voids.
    fn spill_result<T>(&mut self, v: T) -> Result<T, SpillError> {
        match self
            .spilled
            .take_error()
            .or_else(|| self.dedup.take_error())
        {
            Some(e) => Err(e),
            None => Ok(v),
        }
    }

    /// Memory the dedup ids take (hot table and cold filters), which
    /// `state.memory_budget` bounds together with `memory_bytes`.
    pub(crate) fn dedup_bytes(&self) -> usize {
        self.dedup.memory_bytes()
    }

    /// Everything `state.memory_budget` bounds: the windows in memory, the
    /// dedup ids, and the changed windows' copies until a commit
    /// (`spill::CHANGE_BYTES`). The memory check compares it with the budget.
    pub(crate) fn budgeted_bytes(&self) -> usize {
        self.held_bytes + self.dedup.memory_bytes() + self.dirty_bytes
    }

    /// Dedup ids moved out of memory so far, and the store reads that caused.
    pub(crate) fn dedup_cold_stats(&self) -> (u64, u64) {
        self.dedup.cold_stats()
    }

    /// Keeps the task within `keep_bytes`: first, when the dedup table takes
    /// more than a quarter of it (and holds `MIN_COLD_MOVE` ids), its ids move to
    /// the cold tier (filters of a twentieth of the share each, `filter_bytes`); then clean windows are evicted until at most what is left
    /// of `keep_bytes` holds them (`memory_bytes`): fired windows oldest end
    /// first, then open windows latest end first. Call right after
    /// `drain_changes` has been committed (the evicted windows and the moved ids'
    /// chunks must be in the store). Returns how many windows were evicted.
    pub(crate) fn evict(&mut self, keep_bytes: usize) -> Result<usize, SpillError> {
        if !self.spilled.can_evict() {
            return Ok(0);
        }
        if self.dedup.hot_bytes() >= keep_bytes / 4 && self.dedup.len() >= MIN_COLD_MOVE {
            // A failure is remembered by the cold tier (`spill_result`).
            let _ = self.dedup.spill_cold(filter_bytes(keep_bytes));
            self.spill_result(())?;
        }
        let keep_bytes = keep_bytes.saturating_sub(self.dedup.memory_bytes());
        let mut excess = self.held_bytes.saturating_sub(keep_bytes);
        let mut evicted = 0;
        let ends: Vec<(WindowPhase, i64)> = self
            .fired
            .keys()
            .map(|e| (WindowPhase::Fired, *e))
            .chain(self.open.keys().rev().map(|e| (WindowPhase::Open, *e)))
            .collect();
        for (phase, end) in ends {
            if excess == 0 {
                break;
            }
            if phase == WindowPhase::Open && self.firing.as_ref().is_some_and(|f| f.end() == end) {
                continue; // the cursor's memory list names them
            }
            let map = match phase {
                WindowPhase::Fired => &mut self.fired,
                WindowPhase::Open => &mut self.open,
            };
            let Some(tenants) = map.get_mut(&end) else {
                continue;
            };
            let before = tenants.len();
            let mut freed = 0;
            tenants.retain(|tenant, acc| {
                let go = freed < excess && !acc.dirty;
                if go {
                    freed += acc_bytes(tenant, acc);
                }
                !go
            });
            let gone = before - tenants.len();
            self.held_bytes -= freed;
            if tenants.is_empty() {
                map.remove(&end);
            } else if gone > 0 {
                // The table's capacity would outlive its windows.
                tenants.shrink_to_fit();
            }
            self.spilled.add(phase, end, gone as u64);
            excess = excess.saturating_sub(freed);
            evicted += gone;
        }
        Ok(evicted)
    }

    /// Routes one record; panes it causes are appended to `out` (all of them:
    /// an end it fires is fired to the end).
    pub(crate) fn process(
        &mut self,
        rec: RecordIn<'_>,
        out: &mut Vec<ResultRecord>,
    ) -> Result<Route, SpillError> {
        let route = self.process_step(rec, out)?;
        self.finish_firing(out);
        self.spill_result(route)
    }

    /// `process`, but an end with many evicted windows may be left firing
    /// (`firing`): the caller resumes it (`resume_firing`) before the next record.
    pub(crate) fn process_step(
        &mut self,
        rec: RecordIn<'_>,
        out: &mut Vec<ResultRecord>,
    ) -> Result<Route, SpillError> {
        self.finish_firing(out);
        let checked = self.check(rec);
        let route = self.count(rec, &checked, out);
        self.spill_result(route)
    }

    /// Routes a batch of records, in order, exactly as `process` on each would (the
    /// same routes, panes and state); `routes` gets one entry per record. Faster:
    /// every record is validated and fingerprinted first and the dedup table slots
    /// of the whole batch are prefetched, so their cache misses overlap with each
    /// other and with the parsing instead of stalling one record each.
    pub(crate) fn process_batch(
        &mut self,
        recs: &[RecordIn<'_>],
        out: &mut Vec<ResultRecord>,
        routes: &mut Vec<Route>,
    ) -> Result<usize, SpillError> {
        self.finish_firing(out);
        let checked: Vec<_> = recs
            .iter()
            .map(|r| {
                let c = self.check(*r);
                if let Ok(c) = &c {
                    self.dedup.prefetch(c.fp);
                }
                c
            })
            .collect();
        let mut n = 0;
        for (rec, c) in recs.iter().zip(&checked) {
            let route = self.count(*rec, c, out);
            routes.push(route);
            n += 1;
            if self.firing.is_some() {
                break;
            }
        }
        self.spill_result(n)
    }

    /// Routes the records `range` of a batch that went through step 1 ahead
    /// (`Prepared`, under this task's configuration), in order, exactly as
    /// `process_batch` would route them; `routes` gets one entry per record. Each
    /// record's dedup slot is prefetched `AHEAD` records before it is routed.
    pub(crate) fn process_prepared(
        &mut self,
        batch: &Prepared,
        range: Range<usize>,
        now_ms: i64,
        out: &mut Vec<ResultRecord>,
        routes: &mut Vec<Route>,
    ) -> Result<usize, SpillError> {
        const AHEAD: usize = 16;
        self.finish_firing(out);
        let (start, end) = (range.start, range.end);
        for fp in (range.start..end.min(range.start + AHEAD)).filter_map(|i| batch.fingerprint(i)) {
            self.dedup.prefetch(fp);
        }
        for i in range {
            if let Some(fp) = (i + AHEAD < end)
                .then(|| batch.fingerprint(i + AHEAD))
                .flatten()
            {
                self.dedup.prefetch(fp);
            }
            let route = match batch.folding(i) {
                Ok(f) => self.count_valid(now_ms, &f, out),
                Err(reason) => self.count_route(Route::DeadLetter(reason.clone())),
            };
            routes.push(route);
            if self.firing.is_some() {
                return self.spill_result(i + 1 - start);
            }
        }
        self.spill_result(end - start)
    }

    /// Step 1 of the rules, and the request id's dedup fingerprint.
    fn check<'a>(&self, rec: RecordIn<'a>) -> Result<Checked<'a>, DeadLetterReason> {
        check(&self.cfg, rec)
    }

    fn count(
        &mut self,
        rec: RecordIn<'_>,
        checked: &Result<Checked<'_>, DeadLetterReason>,
        out: &mut Vec<ResultRecord>,
    ) -> Route {
        match checked {
            Ok(c) => self.count_valid(rec.now_ms, &c.folding(), out),
            Err(reason) => self.count_route(Route::DeadLetter(reason.clone())),
        }
    }

    fn count_valid(&mut self, now_ms: i64, f: &Folding<'_>, out: &mut Vec<ResultRecord>) -> Route {
        let t = f.completed_ts;
        self.high_water = Some(self.high_water.map_or(t, |h| h.max(t)));
        let route = self.route(now_ms, f, out);
        self.count_route(route)
    }

    /// Counts a record (consumed, and by its route).
    fn count_route(&mut self, route: Route) -> Route {
        self.counters.consumed += 1;
        match route {
            Route::Window => self.counters.folded += 1,
            Route::TooLate { .. } => self.counters.too_late += 1,
            Route::DeadLetter(_) => self.counters.dead_letter += 1,
            Route::Duplicate => self.counters.duplicate += 1,
        }
        route
    }

    fn route(&mut self, now_ms: i64, f: &Folding<'_>, out: &mut Vec<ResultRecord>) -> Route {
        let (ts, window, cost, fp) = (f.ts, f.window, f.cost, f.fp);
        self.delay.record(now_ms.saturating_sub(ts));
        self.disorder
            .record(self.watermark.max_ts().map_or(0, |m| m.saturating_sub(ts)));
        let cfg = &self.cfg;
        let expiry = (window.end - 1)
            .saturating_add(cfg.allowed_lateness_ms)
            .saturating_add(cfg.dedup_extra_ms);
        // The order of the checks (docs/DESIGN.md §2, "order of the checks"): a record routed to
        // the dead-letter topic never enters the dedup set, so its corrected
        // re-send is billed. Validation (every content reason, and an
        // unrepresentable window) came first; here: duplicate, too late, then the
        // fold, whose overflow is the last dead-letter reason — and only a record
        // that is folded or too late is remembered.
        let w = self.watermark.current();
        if self.dedup.is_duplicate(fp, w) {
            return Route::Duplicate;
        }
        let lateness = cfg.allowed_lateness_ms;
        if w >= (window.end - 1).saturating_add(lateness) {
            self.dedup.check_and_insert(fp, f.request_id, expiry, w);
            return Route::TooLate {
                window_end: window.end,
                watermark: w,
            };
        }
        let phase = if w >= window.end - 1 {
            WindowPhase::Fired
        } else {
            WindowPhase::Open
        };
        let map = match phase {
            WindowPhase::Fired => &mut self.fired,
            WindowPhase::Open => &mut self.open,
        };
        let tenants = map.entry(window.end).or_default();
        let acc = match tenants.get_mut(f.tenant_id) {
            Some(acc) => acc,
            None => {
                let stored = self
                    .spilled
                    .take_one(self.partition, phase, window.end, f.tenant_id)
                    .unwrap_or_default();
                self.held_bytes += acc_bytes(f.tenant_id, &stored);
                tenants.entry(f.tenant_id.into()).or_insert(stored)
            }
        };
        let was_dirty = acc.dirty;
        let tokens = (f.prompt_tokens, f.completion_tokens);
        let grew = match f.rated {
            Some(r) => acc.fold_rated(r, tokens),
            None => acc
                .fold(cfg.prices.model_at(f.model_index), tokens, cost)
                .map(|added| if added { LINE_BYTES } else { 0 }),
        };
        match grew {
            None => return Route::DeadLetter(DeadLetterReason::Overflow),
            Some(bytes) => self.held_bytes += bytes,
        }
        self.dedup.check_and_insert(fp, f.request_id, expiry, w);
        if !was_dirty {
            self.dirty_bytes += change_bytes(f.tenant_id);
            self.dirty.push((window.end, f.tenant_id.into()));
        }
        if phase == WindowPhase::Fired {
            let pane = Self::pane(
                self.partition,
                cfg,
                window.end,
                f.tenant_id,
                acc,
                PaneKind::Late,
            );
            out.push(pane);
            self.counters.panes += 1;
        }
        if self.watermark.observe(ts) {
            self.advance(out);
        }
        Route::Window
    }

    /// Step 4: fire on-time panes and purge, after the watermark moved. An end
    /// with many evicted windows may be left firing in steps (`firing`); the rest
    /// waits for it (`after_firing`).
    fn advance(&mut self, out: &mut Vec<ResultRecord>) {
        if self.fire_due(out) {
            self.after_firing(out);
        }
    }

    /// The rest of step 4 once every due end fired: purges, dedup expiry, the
    /// progress mark.
    fn after_firing(&mut self, out: &[ResultRecord]) {
        let w = self.watermark.current();
        let lateness = self.cfg.allowed_lateness_ms;
        while let Some(entry) = self.fired.first_entry() {
            let end = *entry.key();
            if (end - 1).saturating_add(lateness) > w {
                break;
            }
            let freed: usize = entry.remove().iter().map(|(k, a)| acc_bytes(k, a)).sum();
            self.held_bytes -= freed;
            self.purge_through(end);
        }
        // Evicted fired windows purge by their counts alone (the store drops them
        // with the range delete).
        if let Some(&end) = self.spilled.fired.keys().next() {
            if (end - 1).saturating_add(lateness) <= w {
                let through = w.saturating_sub(lateness).saturating_add(1);
                self.spilled.purge_through(through);
                self.purge_through(through);
            }
        }
        self.dedup.expire(w);
        let f = final_through(&self.cfg, w);
        if f > self.final_through {
            self.final_through = f;
            if let (Some(marks), Some(f)) = (&mut self.progress, f) {
                marks.push(Progress {
                    at: out.len(),
                    final_through: f,
                    watermark: w,
                });
            }
        }
    }

    /// Records the partition's progress from now on (`take_progress`).
    pub(crate) fn track_progress(&mut self) {
        self.progress.get_or_insert_with(Vec::new);
    }

    /// Where the partition's progress moved since the last call. A pure function
    /// of the records, like the panes: a replay makes the same progress at the
    /// same places.
    pub(crate) fn take_progress(&mut self) -> Vec<Progress> {
        self.progress
            .as_mut()
            .map(std::mem::take)
            .unwrap_or_default()
    }

    /// The end of the last window this partition has made final (DESIGN §6.1).
    pub(crate) fn final_through(&self) -> Option<i64> {
        self.final_through
    }

    /// The progress the watermark `to` would make (idleness forces it for this
    /// alone: a silent partition must not hold back finality).
    pub(crate) fn progress_at(&self, to: EventTime) -> bool {
        final_through(&self.cfg, to.0) > self.final_through
    }

    fn purge_through(&mut self, end: i64) {
        self.purged_through = Some(self.purged_through.map_or(end, |p| p.max(end)));
    }

    fn pane(
        partition: Partition,
        cfg: &EngineConfig,
        end: i64,
        tenant: &str,
        acc: &mut WindowAcc,
        kind: PaneKind,
    ) -> ResultRecord {
        let pane_index = acc.panes;
        acc.panes += 1;
        acc.dirty = true;
        ResultRecord {
            kind: ResultKind::Window,
            tenant_id: tenant.to_string(),
            window_start: cfg.window.ending_at(end).start,
            window_end: end,
            cost_pico: acc.cost,
            usd: acc.cost.usd_string(),
            requests: acc.version,
            prompt_tokens: acc.prompt_tokens,
            completion_tokens: acc.completion_tokens,
            source_partition: partition.0,
            version: acc.version,
            pane: kind,
            pane_index,
            generation: cfg.generation,
            lines: acc.line_items(),
        }
    }

    /// Emits the on-time pane of every open window, as if the input ended here.
    /// Used at the end of a bounded run (file input, `--until-end`); the task must
    /// not be persisted afterwards, so a later live run restores the state from
    /// before and re-emits the same panes (same versions) when data closes them.
    /// Drivers call `end_of_input_step` instead, sending each step's panes: an
    /// end with many evicted windows is read back a run at a time (`firing`).
    #[cfg(test)]
    pub(crate) fn end_of_input(&mut self, out: &mut Vec<ResultRecord>) -> Result<(), SpillError> {
        while !self.end_of_input_step(out)? {}
        Ok(())
    }

    /// Windows changed since the last call (clearing their dirty flag), the
    /// windows purged since then, and the dedup changes — what the state store
    /// must write to catch up with this task.
    pub(crate) fn drain_changes(&mut self) -> StateDelta {
        let mut changed = Vec::with_capacity(self.dirty.len());
        self.dirty_bytes = 0;
        for (end, tenant) in std::mem::take(&mut self.dirty) {
            // A window is open or fired, never both; gone if purged since.
            let found = [
                (WindowPhase::Open, &mut self.open),
                (WindowPhase::Fired, &mut self.fired),
            ]
            .into_iter()
            .find_map(|(phase, map)| Some((phase, map.get_mut(&end)?.get_mut(&tenant)?)));
            if let Some((phase, acc)) = found {
                if acc.dirty {
                    acc.dirty = false;
                    changed.push(((end, tenant), acc.clone(), phase));
                }
            }
        }
        debug_assert!(
            [&self.open, &self.fired]
                .iter()
                .all(|m| m.values().flat_map(|t| t.values()).all(|a| !a.dirty)),
            "every dirty window is in the dirty list"
        );
        StateDelta {
            changed,
            purged_through: self.purged_through.take(),
            dedup: self.dedup.drain_changes(),
            watermark: self.watermark.clone(),
            counters: self.counters,
            high_water: self.high_water,
        }
    }

    /// A full image of the task (for tests and full snapshots).
    pub fn snapshot(&self) -> TaskSnapshot {
        let list = |m: &Windows| {
            let mut v: Vec<(WindowKey, WindowAcc)> = m
                .iter()
                .flat_map(|(e, ts)| {
                    ts.iter().map(move |(t, a)| {
                        let acc = WindowAcc {
                            dirty: false,
                            ..a.clone()
                        };
                        ((*e, t.clone()), acc)
                    })
                })
                .collect();
            v.sort_by(|a, b| a.0.cmp(&b.0));
            v
        };
        let mut dedup: Vec<(Fingerprint, i64)> = self.dedup.entries().collect();
        dedup.sort();
        TaskSnapshot {
            watermark: Some(self.watermark.clone().with_max_lead(None)),
            counters: self.counters,
            high_water: Some(self.high_water),
            open: list(&self.open),
            fired: list(&self.fired),
            dedup,
        }
    }
}

/// What changed in a task since the state store last caught up.
#[derive(Debug)]
pub struct StateDelta {
    pub changed: Vec<(WindowKey, WindowAcc, WindowPhase)>,
    /// Every window ending at or below this is purged (one range delete).
    pub purged_through: Option<i64>,
    pub dedup: DedupDelta,
    pub watermark: Watermark,
    pub counters: Counters,
    pub high_water: Option<i64>,
}
