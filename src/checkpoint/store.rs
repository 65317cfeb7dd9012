//! The checkpoint store: listing, selecting, restoring, verifying and retaining
//! checkpoints over any `Objects` (layout and rules in the module header of
//! `checkpoint`).

use std::collections::{BTreeMap, BTreeSet};

use tracing::{error, info, warn};

use super::anchors::{anchors, AnchorRule};
use super::config::CheckpointConfig;
use super::evolution::Rules;
use super::format::{decode_manifest, encode_manifest, Unreadable, MAX_MANIFEST_BYTES};
use super::names::{checkpoint_name, is_one_dir_name, manifest_key, parse_id, part_key, PREFIX};
use super::objects::local::LocalObjects;
use super::objects::remote::{is_url, RemoteObjects};
use super::objects::{ObjectInfo, Objects};
use super::restore::StartPolicy;
use super::restore::{none_usable, plan, read_failure, Found, Try};
use super::{CheckpointError, CheckpointId, Manifest, OffsetLedger, PartitionEntry};
use crate::base::error::{Bug, Refusal};
use crate::model::NextOffset;
use crate::model::Partition;
use crate::state::{PartitionMeta, StateStore};

/// Incomplete checkpoints of other writers younger than this may still be uploading.
const ORPHAN_AGE_MS: i64 = 3_600_000;

/// Every key checkpoint `name` (with manifest `m`) references: its manifest and
/// the parts of every segment of its chains, in whichever checkpoint they lie.
pub fn referenced(name: &str, m: &Manifest) -> BTreeSet<String> {
    let mut keys = BTreeSet::from([manifest_key(name)]);
    for e in &m.partitions {
        for s in &e.segments {
            keys.extend((0..s.parts.len()).map(|i| part_key(&s.checkpoint, e.partition, i)));
        }
    }
    keys
}

/// A manifest as read: the object's size and modification time, and what it held.
type CachedManifest = (u64, i64, Result<Manifest, Unreadable>);

/// One checkpoint as found in the store.
/// What a listing holds for the restore decision (`restore::plan`).
pub(crate) fn found(listed: &[Listed]) -> Found<'_> {
    let mut found = Found {
        checkpoints: Vec::new(),
        unreadable: Vec::new(),
    };
    for l in listed {
        match &l.manifest {
            Some(Ok(m)) => found.checkpoints.push((l.name.as_str(), m)),
            Some(Err(e)) => found.unreadable.push(e.clone()),
            None => {}
        }
    }
    found
}

#[derive(Debug, Clone)]
pub struct Listed {
    /// `chk-<id>-<worker>`.
    pub name: String,
    /// The parsed manifest, or why it could not be read (`None`: not complete yet).
    pub manifest: Option<Result<Manifest, Unreadable>>,
    /// Its objects (manifest included).
    pub objects: Vec<ObjectInfo>,
}

/// What `restore_partition` did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Restored {
    /// The checkpoint's name.
    pub checkpoint: String,
    pub next_offset: NextOffset,
    /// The offset ledger at `next_offset`.
    pub offsets: OffsetLedger,
    /// Newer candidates skipped because their parts were damaged.
    pub skipped: usize,
    /// The restored partition's meta; its windows and dedup ids are in the
    /// state store (`state::bounded::restore_task` builds its task).
    pub meta: PartitionMeta,
}

pub struct CheckpointStore {
    objects: Box<dyn Objects>,
    worker: String,
    retain: usize,
    /// The anchors kept beyond `retain` (`None`: none; `anchors`).
    anchors: Option<AnchorRule>,
    /// Manifests read so far, by key, with the size and time of the object read:
    /// objects are created once, so the same key, size and time is the same
    /// manifest — a listing reads only the new ones (retention lists after every
    /// checkpoint).
    manifests: std::sync::Mutex<BTreeMap<String, CachedManifest>>,
    /// The listed bytes of the parts a restore holds at once (`load`).
    read_budget: u64,
}

fn check_group(cfg: &CheckpointConfig, group: &str) -> Result<(), CheckpointError> {
    if is_one_dir_name(group) {
        return Ok(());
    }
    Err(CheckpointError::Refused(Refusal::setup(format!(
        "consumer group id {group:?} cannot name a checkpoint store under {}: it must be one \
         directory name (no '/', not '.' or '..'); choose another `kafka.group_id`",
        cfg.dir.display()
    ))))
}

fn refused_option((key, msg): (String, String)) -> CheckpointError {
    CheckpointError::Refused(Refusal::setup(format!("{key}: {msg}")))
}

impl CheckpointStore {
    /// The store of consumer group `group` under `checkpoint.dir` (created if local).
    pub fn open(
        cfg: &CheckpointConfig,
        group: &str,
        worker: &str,
    ) -> Result<Self, CheckpointError> {
        Self::open_as(cfg, group, worker, false)
    }

    /// The existing store of `group`, for inspection (creates nothing).
    pub fn open_existing(cfg: &CheckpointConfig, group: &str) -> Result<Self, CheckpointError> {
        Self::open_as(cfg, group, "inspect", true)
    }

    fn open_as(
        cfg: &CheckpointConfig,
        group: &str,
        worker: &str,
        existing: bool,
    ) -> Result<Self, CheckpointError> {
        check_group(cfg, group)?;
        let dir = cfg.dir.to_string_lossy();
        let objects: Box<dyn Objects> = if is_url(&dir) {
            Box::new(RemoteObjects::open(&dir, &cfg.object_store, group).map_err(refused_option)?)
        } else if existing {
            Box::new(LocalObjects::existing(&cfg.dir.join(group))?)
        } else {
            Box::new(LocalObjects::create(&cfg.dir.join(group))?)
        };
        let anchors = cfg.anchor_every.0.map(|every| AnchorRule {
            every_ms: every.0,
            kept: cfg.anchors as usize,
        });
        Ok(Self::with_objects(objects, worker, cfg.retain as usize).with_anchors(anchors))
    }

    /// A store over `objects` (tests and benchmarks choose their own).
    pub fn with_objects(objects: Box<dyn Objects>, worker: &str, retain: usize) -> Self {
        Self {
            objects,
            worker: worker.to_string(),
            retain: retain.max(1),
            anchors: None,
            manifests: Default::default(),
            read_budget: load::READ_BUDGET,
        }
    }

    /// The same store, keeping the anchors of `rule` (`None`: none).
    pub(crate) fn with_anchors(mut self, rule: Option<AnchorRule>) -> Self {
        self.anchors = rule;
        self
    }

    #[cfg(test)]
    /// The same store, holding at most `bytes` of listed part sizes at once
    /// while it restores (tests choose a small one).
    pub(crate) fn with_read_budget(mut self, bytes: u64) -> Self {
        self.read_budget = bytes;
        self
    }

    pub fn objects(&self) -> &dyn Objects {
        self.objects.as_ref()
    }

    /// Where the store lives (a path or a URL), for people.
    pub fn location(&self) -> String {
        self.objects.location("").trim_end_matches('/').to_string()
    }

    /// One past the highest id in the store (ids only need to grow per worker name).
    pub(crate) fn next_id(&self) -> Result<CheckpointId, CheckpointError> {
        let max = self.groups()?.keys().filter_map(|n| parse_id(n)).max();
        Ok(CheckpointId(max.map_or(1, |m| m.saturating_add(1))))
    }

    /// This worker's name for checkpoint `id`.
    pub(crate) fn name_for(&self, id: CheckpointId) -> String {
        checkpoint_name(id, &self.worker)
    }

    /// Every object, by checkpoint name (objects outside `chk-*` are not ours).
    fn groups(&self) -> Result<BTreeMap<String, Vec<ObjectInfo>>, CheckpointError> {
        let mut out: BTreeMap<String, Vec<ObjectInfo>> = BTreeMap::new();
        for o in self.objects.list()? {
            if let Some((name, _)) = o.key.split_once('/') {
                if name.starts_with(PREFIX) {
                    out.entry(name.to_string()).or_default().push(o);
                }
            }
        }
        Ok(out)
    }

    /// Every checkpoint, oldest id first. `Err`: the store could not be listed,
    /// or a manifest could not be read (`restore::read_failure`) — never taken
    /// for damage or for a missing checkpoint.
    pub fn list(&self) -> Result<Vec<Listed>, CheckpointError> {
        let groups = self.groups()?;
        let mut cache = self.manifests.lock().unwrap_or_else(|e| e.into_inner());
        // Manifests gone from the store are forgotten.
        cache.retain(|key, _| {
            key.split_once('/')
                .is_some_and(|(name, _)| groups.contains_key(name))
        });
        let mut out = Vec::with_capacity(groups.len());
        for (name, objects) in groups {
            let key = manifest_key(&name);
            let manifest = match objects.iter().find(|o| o.key == key) {
                None => None,
                Some(o) => match cache.get(&key) {
                    Some((size, modified, m)) if (*size, *modified) == (o.size, o.modified_ms) => {
                        Some(m.clone())
                    }
                    _ => {
                        let m = self.read_manifest(&key)?.and_then(|m| {
                            // Part keys derive from names: a manifest copied or moved
                            // under another name would vouch for objects not its own.
                            let own = checkpoint_name(m.id, &m.worker);
                            if own == name {
                                Ok(m)
                            } else {
                                Err(Unreadable::Damaged(format!(
                                    "{}: the manifest is checkpoint {own}'s, not {name}'s",
                                    self.objects.location(&key)
                                )))
                            }
                        });
                        // Damage may be a transient state of the object: read it again next time.
                        if !matches!(m, Err(Unreadable::Damaged(_))) {
                            cache.insert(key.clone(), (o.size, o.modified_ms, m.clone()));
                        }
                        Some(m)
                    }
                },
            };
            out.push(Listed {
                name,
                manifest,
                objects,
            });
        }
        // By id, then name: names of different widths do not sort as numbers.
        out.sort_by(|a, b| (parse_id(&a.name), &a.name).cmp(&(parse_id(&b.name), &b.name)));
        Ok(out)
    }

    /// The manifest at `key`, or why it is unreadable; `Err`: the store could not
    /// be read.
    fn read_manifest(&self, key: &str) -> Result<Result<Manifest, Unreadable>, CheckpointError> {
        let bytes = match self.objects.get(key, MAX_MANIFEST_BYTES) {
            Ok(b) => b,
            Err(e) => return Ok(Err(read_failure(e)?)),
        };
        Ok(decode_manifest(&bytes).map_err(|e| e.of(&self.objects.location(key))))
    }

    /// Writes checkpoint `name`'s manifest: its commit point.
    pub(crate) fn write_manifest(&self, name: &str, m: &Manifest) -> Result<(), CheckpointError> {
        Ok(self
            .objects
            .put_new(&manifest_key(name), &encode_manifest(m))?)
    }

    /// Restores partition `p` into `state` from the best usable checkpoint.
    /// `Ok(None)`: no checkpoint holds `p`.
    pub fn restore_partition(
        &self,
        p: Partition,
        rules: &Rules,
        state: &StateStore,
    ) -> Result<Option<Restored>, CheckpointError> {
        self.restore_with(p, rules, StartPolicy::default(), state)
    }

    /// `restore_partition` under `policy`: the plan is `restore::plan`'s; this
    /// only loads its candidates in order, falling back on damage.
    pub(crate) fn restore_with(
        &self,
        p: Partition,
        rules: &Rules,
        policy: StartPolicy,
        state: &StateStore,
    ) -> Result<Option<Restored>, CheckpointError> {
        if policy.reset_state_earliest {
            return Ok(None);
        }
        let listed = self.list()?;
        self.restore_listed(p, None, &listed, rules, policy, state)
    }

    /// `restore_with` over `listed` (one listing serves every partition), from
    /// the complete checkpoints whose entry of `p` passes `usable` (given the
    /// manifest's format) only, for `p` whose log ends at `log_end`: `tally
    /// explain` starts a replay at the newest snapshot taken before a window's
    /// first record.
    pub(crate) fn restore_where(
        &self,
        (p, log_end): (Partition, i64),
        listed: &[Listed],
        usable: impl Fn(u16, &PartitionEntry) -> bool,
        rules: &Rules,
        state: &StateStore,
    ) -> Result<Option<Restored>, CheckpointError> {
        let mut listed = listed.to_vec();
        for l in &mut listed {
            if let Some(Ok(m)) = &mut l.manifest {
                let format = m.format;
                m.partitions
                    .retain(|e| e.partition != p || usable(format, e));
            }
        }
        let policy = StartPolicy::default();
        self.restore_listed(p, Some(log_end), &listed, rules, policy, state)
    }

    /// `restore_with` over a listing already taken (one listing serves every
    /// partition of an assignment), for `p` whose log ends at `log_end` (if known).
    /// Damage falls back to the next candidate; a failure to read (the store,
    /// the local state, a stop request) ends the restore with that error.
    fn restore_listed(
        &self,
        p: Partition,
        log_end: Option<i64>,
        listed: &[Listed],
        rules: &Rules,
        policy: StartPolicy,
        state: &StateStore,
    ) -> Result<Option<Restored>, CheckpointError> {
        let steps = plan(p, &found(listed), rules, policy, log_end);
        if steps.is_empty() {
            return Ok(None);
        }
        let mut problems = Vec::new();
        for step in steps {
            let (name, entry) = match step {
                Try::Load {
                    name,
                    entry,
                    changes,
                } => {
                    for change in &changes {
                        warn!(partition = p.0, checkpoint = %name, change = %change, "restoring across a compatible config change");
                    }
                    (name, entry)
                }
                Try::Skip { name, why } => {
                    error!(partition = p.0, checkpoint = %name, error = %why, "CHECKPOINT DAMAGED; falling back to an older checkpoint");
                    problems.push(why);
                    continue;
                }
                Try::Refuse(msg) => return Err(CheckpointError::Refused(msg)),
            };
            match self.load_snapshot(name, entry, state) {
                Ok(meta) => {
                    let skipped = problems.len();
                    if skipped > 0 {
                        error!(partition = p.0, checkpoint = %name, skipped, "RESTORED FROM AN OLDER CHECKPOINT: newer ones are damaged");
                    }
                    info!(partition = p.0, checkpoint = %name, next_offset = entry.next_offset.0, "restored");
                    return Ok(Some(Restored {
                        checkpoint: name.to_string(),
                        next_offset: entry.next_offset,
                        offsets: entry.offsets.clone(),
                        skipped,
                        meta,
                    }));
                }
                Err(e) if e.is_damage() => {
                    error!(error = %e, "CHECKPOINT DAMAGED; falling back to an older checkpoint");
                    problems.push(e.to_string());
                }
                Err(e) => return Err(e),
            }
        }
        Err(CheckpointError::Refused(none_usable(p, &problems)))
    }

    /// `restore_with` for several partitions at once, each with its log end if
    /// known: one listing of the store, then the partitions in parallel (reads,
    /// hashing, decoding and imports are independent). `Err`: the store could
    /// not be listed. Reads waiting on the store give up on a stop request
    /// (`Objects::interrupt_when`).
    pub(crate) fn restore_many(
        &self,
        partitions: &[(Partition, Option<i64>)],
        rules: &Rules,
        policy: StartPolicy,
        state: &StateStore,
    ) -> Result<Vec<Result<Option<Restored>, CheckpointError>>, CheckpointError> {
        if policy.reset_state_earliest {
            return Ok(partitions.iter().map(|_| Ok(None)).collect());
        }
        self.objects
            .interrupt_when(Some(crate::base::shutdown::requested));
        let restored = self.restore_all(partitions, rules, policy, state);
        self.objects.interrupt_when(None);
        restored
    }

    fn restore_all(
        &self,
        partitions: &[(Partition, Option<i64>)],
        rules: &Rules,
        policy: StartPolicy,
        state: &StateStore,
    ) -> Result<Vec<Result<Option<Restored>, CheckpointError>>, CheckpointError> {
        let listed = self.list()?;
        for l in &listed {
            if let Some(Err(e)) = &l.manifest {
                warn!(checkpoint = %l.name, error = %e, "unreadable manifest; ignored");
            }
        }
        let listed = &listed;
        // `RESTORERS` at a time: each holds a share of the read budget (`load`).
        let mut restored = Vec::with_capacity(partitions.len());
        for group in partitions.chunks(load::RESTORERS) {
            restored.extend(std::thread::scope(|scope| {
                joined(
                    group
                        .iter()
                        .map(|(p, end)| {
                            scope.spawn(move || {
                                self.restore_listed(*p, *end, listed, rules, policy, state)
                            })
                        })
                        .collect(),
                )
            }));
        }
        Ok(restored)
    }

    /// Re-reads and re-hashes every part of every complete checkpoint; returns
    /// the problems found, each naming its object.
    pub fn verify(&self) -> Result<Vec<String>, CheckpointError> {
        let mut problems = Vec::new();
        let mut checked = BTreeSet::new();
        for l in self.list()? {
            match l.manifest {
                // Being written, or cut short by a crash: never restored, not damage.
                None => {}
                Some(Err(e)) => problems.push(format!("{}: {e}", l.name)),
                Some(Ok(m)) => {
                    for e in &m.partitions {
                        for seg in &e.segments {
                            for i in 0..seg.parts.len() {
                                // A segment shared by several chains is read once.
                                if !checked.insert(part_key(&seg.checkpoint, e.partition, i)) {
                                    continue;
                                }
                                match self.read_part(seg, e.partition, i) {
                                    Ok(_) => {}
                                    Err(err) if err.is_damage() => problems.push(err.to_string()),
                                    // The store failed: that is not damage to report.
                                    Err(err) => return Err(err),
                                }
                            }
                        }
                    }
                }
            }
        }
        Ok(problems)
    }

    /// Deletes what the retention rule allows (see the module header).
    pub fn retain(&self, newest_own: CheckpointId) -> Result<(), CheckpointError> {
        let listed = self.list()?;
        let complete: Vec<(&str, &Manifest)> = listed
            .iter()
            .filter_map(|l| Some((l.name.as_str(), l.manifest.as_ref()?.as_ref().ok()?)))
            .collect();
        let superseded = |m: &Manifest| {
            if m.worker == self.worker && m.id == newest_own {
                return false; // the parent of this worker's next checkpoint
            }
            m.partitions.iter().all(|e| {
                let newer = complete
                    .iter()
                    .filter(|(_, o)| {
                        o.entry(e.partition)
                            .is_some_and(|oe| (oe.next_offset, o.id) > (e.next_offset, m.id))
                    })
                    .count();
                newer >= self.retain
            })
        };
        let anchors = self
            .anchors
            .map(|rule| anchors(&complete, rule))
            .unwrap_or_default();
        let removed: BTreeSet<&str> = complete
            .iter()
            .filter(|(name, m)| !anchors.contains(name) && superseded(m))
            .map(|(name, _)| *name)
            .collect();
        // Everything a kept manifest references, in whichever directory it lies.
        let live: BTreeSet<String> = complete
            .iter()
            .filter(|(name, _)| !removed.contains(name))
            .flat_map(|(name, m)| referenced(name, m))
            .collect();
        let now = crate::base::clock::now_ms();
        for l in &listed {
            let remove = match &l.manifest {
                Some(Ok(_)) => removed.contains(l.name.as_str()),
                Some(Err(_)) => false, // kept for inspection; `verify` reports it
                None => {
                    let own_and_superseded = l.name.ends_with(&format!("-{}", self.worker))
                        && parse_id(&l.name).is_some_and(|id| id < newest_own.0);
                    let old = l
                        .objects
                        .iter()
                        .all(|o| now - o.modified_ms > ORPHAN_AGE_MS);
                    own_and_superseded || old
                }
            };
            if remove {
                self.delete_checkpoint(l, &live);
            } else if let Some(Ok(_)) = &l.manifest {
                self.delete_unreferenced(l, &live, now);
            }
        }
        Ok(())
    }

    /// Deletes a checkpoint: its manifest first (it is no longer complete), then
    /// every object of it no kept manifest references. A failure is logged; the
    /// next retention tries again.
    fn delete_checkpoint(&self, l: &Listed, live: &BTreeSet<String>) {
        let manifest = manifest_key(&l.name);
        let mut keys: Vec<&str> = l
            .objects
            .iter()
            .map(|o| o.key.as_str())
            .filter(|k| !live.contains(*k))
            .collect();
        keys.sort_by_key(|k| *k != manifest);
        for k in keys {
            if let Err(e) = self.objects.delete(k) {
                warn!(object = %self.objects.location(k), error = %e, "cannot delete an old checkpoint object");
                return;
            }
        }
    }

    /// Objects inside a kept complete checkpoint that no kept manifest
    /// references (leftovers of an interrupted write), once old enough.
    fn delete_unreferenced(&self, l: &Listed, live: &BTreeSet<String>, now: i64) {
        for o in &l.objects {
            if !live.contains(&o.key) && now - o.modified_ms > ORPHAN_AGE_MS {
                if let Err(e) = self.objects.delete(&o.key) {
                    warn!(object = %self.objects.location(&o.key), error = %e, "cannot delete a leftover object");
                }
            }
        }
    }
}

#[cfg(test)]
mod fault_tests;
mod load;
/// Joins a restore's scoped threads, in order; a thread that panicked is an
/// error (not damage: nothing is fallen back from on a bug).
fn joined<T>(
    handles: Vec<std::thread::ScopedJoinHandle<'_, Result<T, CheckpointError>>>,
) -> Vec<Result<T, CheckpointError>> {
    handles
        .into_iter()
        .map(|h| {
            h.join().unwrap_or_else(|_| {
                Err(CheckpointError::Bug(
                    Bug("a restore thread panicked".into()),
                ))
            })
        })
        .collect()
}

#[cfg(test)]
mod tests;
