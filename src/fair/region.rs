//! The ledger bound to a [`Region`]: [`SharedFairShare`].
//!
//! # Object area
//!
//! ```text
//! [ RegionObjHeader (128 B) | config JSON, padded to 128 | SharedLedger (see shared.rs) ]
//! ```
//!
//! The region header's eight parameters are
//! `[OBJECT_REV, fnv1a64(config JSON), tenants, lease slots,
//! MUTEX_LAYOUT_TAG, MUTEX_BYTES, libc flavour code, JSON length]`, so two
//! processes that bind with different configurations, capacities or
//! pthread layouts are told apart before either touches the ledger. The
//! canonical JSON of the configuration (the call-log `config` format, without
//! `op`) is stored in the object area, so [`FairShare::attach`] and the CLI
//! can read back what a region holds. Everything read back (JSON, hash,
//! sizes, the ledger's own header and parameters) is validated.
//!
//! # Processes
//!
//! Each lease records the owner id of the process that took it (from the
//! region's process table, [`Mapping::me`], looked up on every acquire, so a
//! handle inherited across `fork` acts as the child's own process). A lease
//! belongs to its process until the process exits, not to the handle: when
//! the last handle is dropped while the process holds leases, its
//! registration is kept alive (see [`Mapping::set_retain_check`]) and a
//! later handle in the same process takes it up again, with the same owner
//! id. When a process dies, its leases are released when its death is
//! noticed: on the
//! acquire path when an acquire would be refused or the lease table is full
//! (at most one scan per [`REAP_INTERVAL_MS`] region-wide), and by an
//! explicit [`SharedFairShare::reap`]. They are counted per tenant in
//! `reaped_leases`, apart from overruns (which are never freed). A dead
//! process whose leases could not be released (the ledger failed) keeps its
//! process-table entry, so a later reap tries again.
//!
//! Every call registers its process first (after `fork`, the child as a
//! process of its own): only a registered, live process ever holds the
//! ledger's lock, which is how a waiter tells a lock word naming some other
//! process for a corrupt one (see [`shared`](super::shared)).
//!
//! # Time
//!
//! Time in a region is monotonic by rule: an explicit `now` earlier than
//! the last accepted one is taken as the last accepted one (two processes
//! that read the clock and then race for the lock never fail, and a release
//! never fails for time). Every instant the ledger records and answers
//! (`granted_at_ms`, `deadline_ms`, `Stats::now_ms`) is the one taken, so a
//! log of the calls with those instants replays exactly in-process. The
//! `*_now` calls read `CLOCK_MONOTONIC` in milliseconds while holding the
//! ledger's lock, which every process of the host shares. Do not mix them
//! with explicit times on another scale in one region: a scale ahead of the
//! other makes every call of the other one be taken at the later time.
//!
//! # Inspecting
//!
//! [`RegionView::fair_share`](crate::region::RegionView::fair_share) reads
//! the configuration and the stats without the lock, without a process
//! entry and without writing (see [`shared`](super::shared)); `shmsched
//! stat`, `watch` and `serve` use it.

use std::mem::size_of;
use std::ptr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use super::shared::SharedLedger;
use super::{
    initial_state, AcquireResult, FairConfig, FairError, FairLedger, FairShare, FairnessReport,
    Plan, Stats, DEFAULT_LEASE_CAPACITY,
};
use crate::error::{Error, Result};
use crate::region::layout::fnv1a64;
use crate::region::{Mapping, ObjectKind, ObjectSpec, ProcId, Region, TryInit};
use crate::sys::clock::monotonic_ms;
use crate::sys::robust_mutex::{LIBC_FLAVOUR, MUTEX_BYTES, MUTEX_LAYOUT_TAG};

/// Revision of this object's layout, stored in the header params (2: the
/// ledger's layout version 2, see [`shared`](super::shared)).
pub(crate) const OBJECT_REV: u64 = 2;

/// The revision of the fair-share object area that this build reads and
/// writes (see [`crate::object_revision`]).
pub const OBJECT_REVISION: u64 = OBJECT_REV;

/// Magic at the start of the object area: `"FAIRREG1"`.
const OBJ_MAGIC: u64 = u64::from_le_bytes(*b"FAIRREG1");

/// Longest stored configuration JSON, in bytes.
pub const MAX_CONFIG_JSON: usize = 1 << 20;

/// Minimum time between two scans for dead processes, region-wide.
pub const REAP_INTERVAL_MS: u64 = 20;

/// The object's own header at the start of the object area.
#[repr(C, align(128))]
struct RegionObjHeader {
    /// [`OBJ_MAGIC`], written last by the initialiser.
    magic: AtomicU64,
    /// Length of the config JSON that follows the header.
    json_len: AtomicU64,
    /// `fnv1a64` of that JSON.
    json_hash: AtomicU64,
    /// Offset of the ledger in the object area.
    ledger_off: AtomicU64,
    /// Bytes of the ledger.
    ledger_len: AtomicU64,
    /// Monotonic ms of the last dead-process scan (rate limit).
    last_reap_ms: AtomicU64,
    /// Dead processes reaped by this object.
    reaped_processes: AtomicU64,
    /// Leases released on behalf of dead processes.
    reaped_leases: AtomicU64,
    _pad: [u64; 8],
}

const _: () = assert!(size_of::<RegionObjHeader>() == 128);

fn round128(n: usize) -> usize {
    n.div_ceil(128) * 128
}

fn flavour_code(f: &str) -> u64 {
    match f {
        "gnu" => 1,
        "musl" => 2,
        _ => 3,
    }
}

fn flavour_name(code: u64) -> &'static str {
    match code {
        1 => "gnu",
        2 => "musl",
        3 => "other",
        _ => "unknown",
    }
}

/// Layout of one configuration's object area.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Layout {
    json_len: usize,
    ledger_off: usize,
    ledger_len: usize,
    size: usize,
}

fn layout(json_len: usize, tenants: usize, leases: usize) -> Result<Layout, FairError> {
    let ledger_off = 128 + round128(json_len);
    let ledger_len = SharedLedger::size_for_counts(tenants, leases)?;
    Ok(Layout {
        json_len,
        ledger_off,
        ledger_len,
        size: ledger_off + round128(ledger_len),
    })
}

/// What a binder asks for: canonical JSON, its layout and the params.
struct Wanted {
    cfg: FairConfig,
    json: String,
    cap: usize,
    layout: Layout,
    params: [u64; 8],
}

fn wanted(cfg: &FairConfig, cap: usize) -> Result<Wanted, FairError> {
    // Validates the configuration and the capacity.
    initial_state(cfg, cap)?;
    let json = serde_json::to_string(cfg).map_err(|e| FairError::InvalidConfig(e.to_string()))?;
    if json.len() > MAX_CONFIG_JSON {
        return Err(FairError::InvalidConfig(format!(
            "the configuration is {} bytes of JSON, above the limit of {MAX_CONFIG_JSON}",
            json.len()
        )));
    }
    let n = cfg.tenants.len();
    let layout = layout(json.len(), n, cap)?;
    let params = [
        OBJECT_REV,
        fnv1a64(json.as_bytes()),
        n as u64,
        cap as u64,
        MUTEX_LAYOUT_TAG,
        MUTEX_BYTES as u64,
        flavour_code(LIBC_FLAVOUR),
        json.len() as u64,
    ];
    Ok(Wanted {
        cfg: cfg.clone(),
        json,
        cap,
        layout,
        params,
    })
}

/// Initialises a zeroed object area (runs under the region's init lock). A
/// failure leaves the region without its ready mark (the bind fails with
/// it, and the next binder initialises again).
fn init_object(w: &Wanted, bytes: &mut [u8]) -> Result<()> {
    let l = w.layout;
    if bytes.len() < l.size || (bytes.as_ptr() as usize) % 128 != 0 {
        return Err(Error::BadRegion(format!(
            "fair-share object area of {} bytes at {:p} is smaller than {} or not 128-byte aligned",
            bytes.len(),
            bytes.as_ptr(),
            l.size
        )));
    }
    bytes[128..128 + l.json_len].copy_from_slice(w.json.as_bytes());
    let ledger = &mut bytes[l.ledger_off..l.ledger_off + l.ledger_len];
    // SAFETY: `ledger` is an exclusive, zeroed, 128-aligned slice of the
    // right size; nobody else uses the region until it is marked ready.
    unsafe { SharedLedger::create(ledger.as_mut_ptr(), ledger.len(), &w.cfg, w.cap) }
        .map_err(|e| Error::BadRegion(format!("initialising the fair-share ledger: {e}")))?;
    // SAFETY: the area is at least 128 bytes and 128-aligned (checked), and
    // holds a RegionObjHeader made of atomics (zero is valid for each).
    let h = unsafe { &*(bytes.as_ptr() as *const RegionObjHeader) };
    h.json_len.store(l.json_len as u64, Ordering::Relaxed);
    h.json_hash.store(w.params[1], Ordering::Relaxed);
    h.ledger_off.store(l.ledger_off as u64, Ordering::Relaxed);
    h.ledger_len.store(l.ledger_len as u64, Ordering::Relaxed);
    h.magic.store(OBJ_MAGIC, Ordering::Release);
    Ok(())
}

/// Checks the pthread layout recorded in a region against this build's.
fn check_mutex_layout(params: &[u64; 8]) -> Result<()> {
    if params[4] != MUTEX_LAYOUT_TAG
        || params[5] != MUTEX_BYTES as u64
        || params[6] != flavour_code(LIBC_FLAVOUR)
    {
        return Err(Error::Mismatch(format!(
            "the region's fair-share mutex was laid out by libc \"{}\" with {}-byte pthread mutexes (tag {:#x}); \
             this build uses \"{LIBC_FLAVOUR}\" with {MUTEX_BYTES} bytes (tag {MUTEX_LAYOUT_TAG:#x}); \
             processes built against different libcs cannot share a ledger",
            flavour_name(params[6]),
            params[5],
            params[4]
        )));
    }
    Ok(())
}

/// What differs between the configuration stored in a region and the one
/// asked for, as a sentence naming the values.
fn describe_difference(
    have: &FairConfig,
    have_cap: u64,
    want: &FairConfig,
    want_cap: usize,
) -> String {
    let mut d = Vec::new();
    if have.ceiling != want.ceiling {
        d.push(format!("ceiling {} (asked {})", have.ceiling, want.ceiling));
    }
    if have.fairness_unit != want.fairness_unit {
        d.push(format!(
            "fairness_unit \"{}\" (asked \"{}\")",
            have.fairness_unit, want.fairness_unit
        ));
    }
    if have.tenants != want.tenants {
        let fmt = |t: &[(String, f64)]| {
            t.iter()
                .map(|(id, w)| format!("{id}:{w}"))
                .collect::<Vec<_>>()
                .join(", ")
        };
        d.push(format!(
            "tenants [{}] (asked [{}])",
            fmt(&have.tenants),
            fmt(&want.tenants)
        ));
    }
    if have.reclaim_horizon_ms != want.reclaim_horizon_ms {
        d.push(format!(
            "reclaim_horizon_ms {} (asked {})",
            have.reclaim_horizon_ms, want.reclaim_horizon_ms
        ));
    }
    if have.idle_after_ms != want.idle_after_ms {
        d.push(format!(
            "idle_after_ms {} (asked {})",
            have.idle_after_ms, want.idle_after_ms
        ));
    }
    if have.started_at_ms != want.started_at_ms {
        d.push(format!(
            "started_at_ms {} (asked {})",
            have.started_at_ms, want.started_at_ms
        ));
    }
    if have_cap != want_cap as u64 {
        d.push(format!("lease capacity {have_cap} (asked {want_cap})"));
    }
    if d.is_empty() {
        "the stored configuration differs in its encoding".into()
    } else {
        format!("the region's fair-share ledger has {}", d.join("; "))
    }
}

/// A fair-share ledger living in a [`Region`]: the same records and the same
/// admission code as the in-process [`FairShare`], crash-consistent under a
/// robust process-shared mutex (see [`shared`](super::shared)).
///
/// Obtain one with [`FairShare::shared`] (create or validate) or
/// [`FairShare::attach`] (join whatever is stored). Methods take `&mut self`;
/// make one handle per thread with [`SharedFairShare::handle`], or wrap it in
/// a `Mutex`.
#[derive(Debug)]
pub struct SharedFairShare {
    map: Arc<Mapping>,
    ledger: SharedLedger,
    cfg: FairConfig,
    cap: usize,
    /// This handle's recorded calls, if recording.
    log: Option<Vec<String>>,
}

// SAFETY: `ledger` points into the mapping owned by `map`, which lives as
// long as `self`; the ledger's shared state is only touched under the
// process-shared mutex or through atomics.
unsafe impl Send for SharedFairShare {}

impl FairShare {
    /// Binds `region` as a fair-share ledger with `cfg` and
    /// [`DEFAULT_LEASE_CAPACITY`] lease slots: initialises a new region, or
    /// validates an existing one. A region holding another configuration
    /// (or capacity, or a mutex laid out by another libc) is
    /// [`Error::Mismatch`] naming what differs.
    pub fn shared(region: &Region, cfg: &FairConfig) -> Result<SharedFairShare> {
        FairShare::shared_with_capacity(region, cfg, DEFAULT_LEASE_CAPACITY)
    }

    /// Like [`FairShare::shared`] with `lease_capacity` slots (fixed at
    /// creation, part of the configuration an opener must match).
    pub fn shared_with_capacity(
        region: &Region,
        cfg: &FairConfig,
        lease_capacity: usize,
    ) -> Result<SharedFairShare> {
        let w = wanted(cfg, lease_capacity)?;
        let init = TryInit(|b: &mut [u8]| init_object(&w, b));
        let spec = ObjectSpec {
            kind: ObjectKind::FairShare,
            params: w.params,
            object_size: w.layout.size,
            init: &init,
        };
        let map = match region.bind(ObjectKind::FairShare, Some(&spec)) {
            Ok(m) => m,
            Err(Error::Mismatch(generic)) => {
                // Say what differs: read what the region holds.
                let Ok(m) = region.bind(ObjectKind::FairShare, None) else {
                    return Err(Error::Mismatch(generic));
                };
                let params = m.header().params;
                check_mutex_layout(&params)?;
                let (have, _) = read_config(&m)?;
                return Err(Error::Mismatch(describe_difference(
                    &have,
                    params[3],
                    cfg,
                    lease_capacity,
                )));
            }
            Err(e) => return Err(e),
        };
        let s = SharedFairShare::from_mapping(map)?;
        if s.cfg != w.cfg || s.cap != lease_capacity {
            return Err(Error::Mismatch(describe_difference(
                &s.cfg,
                s.cap as u64,
                cfg,
                lease_capacity,
            )));
        }
        Ok(s)
    }

    /// Joins the fair-share ledger stored in `region`, whatever its
    /// configuration (read back from the region; see
    /// [`SharedFairShare::config`]). An uninitialised region is
    /// [`Error::BadRegion`].
    pub fn attach(region: &Region) -> Result<SharedFairShare> {
        let map = region.bind(ObjectKind::FairShare, None)?;
        SharedFairShare::from_mapping(map)
    }
}

/// Validates the object header and reads the stored configuration and the
/// ledger's offset.
fn read_config(map: &Mapping) -> Result<(FairConfig, Layout)> {
    read_config_at(&map.header().params, map.object_ptr(), map.object_len())
}

/// [`read_config`] for an object area at `base` of `len` bytes whose
/// region header holds `params` (reads only, so a read-only mapping does).
fn read_config_at(params: &[u64; 8], base: *const u8, len: usize) -> Result<(FairConfig, Layout)> {
    if params[0] != OBJECT_REV {
        return Err(Error::BadRegion(format!(
            "fair-share object revision {} is not the supported {OBJECT_REV} (a region of another \
             shmsched version)",
            params[0]
        )));
    }
    check_mutex_layout(params)?;
    if len < 128 || base as usize % 128 != 0 {
        return Err(Error::BadRegion(format!(
            "fair-share object area of {len} bytes at {base:p} is too small or not 128-byte aligned"
        )));
    }
    // SAFETY: the area is at least 128 bytes and 128-aligned (checked) and
    // starts with a RegionObjHeader of atomics, only loaded here; the
    // mapping outlives the reference (it is only used in this function).
    let h = unsafe { &*(base as *const RegionObjHeader) };
    let magic = h.magic.load(Ordering::Acquire);
    if magic != OBJ_MAGIC {
        return Err(Error::BadRegion(format!(
            "fair-share object magic {magic:#x} is not {OBJ_MAGIC:#x} (initialisation failed or the area was overwritten)"
        )));
    }
    let json_len = h.json_len.load(Ordering::Relaxed);
    let hash = h.json_hash.load(Ordering::Relaxed);
    if json_len != params[7] || json_len > MAX_CONFIG_JSON as u64 || hash != params[1] {
        return Err(Error::BadRegion(format!(
            "stored configuration of {json_len} bytes with hash {hash:#x}; the region header says {} bytes, hash {:#x}",
            params[7], params[1]
        )));
    }
    let (n, cap) = (params[2], params[3]);
    let l = layout(json_len as usize, n as usize, cap as usize)
        .map_err(|e| Error::BadRegion(format!("stored capacities: {e}")))?;
    let (off, llen) = (
        h.ledger_off.load(Ordering::Relaxed),
        h.ledger_len.load(Ordering::Relaxed),
    );
    if off != l.ledger_off as u64 || llen != l.ledger_len as u64 || l.size > len {
        return Err(Error::BadRegion(format!(
            "ledger at {off} ({llen} bytes) in an area of {len}; {n} tenants and {cap} leases need it at {} ({} bytes, area {})",
            l.ledger_off, l.ledger_len, l.size
        )));
    }
    let mut json = vec![0u8; l.json_len];
    // SAFETY: [128, 128 + json_len) lies inside the object area (json_len <
    // ledger_off <= size <= len, checked); the bytes are plain data written
    // once at initialisation. `u8` has no invalid bit patterns.
    unsafe { ptr::copy_nonoverlapping(base.add(128), json.as_mut_ptr(), l.json_len) };
    if fnv1a64(&json) != hash {
        return Err(Error::BadRegion(format!(
            "stored configuration JSON does not match its hash {hash:#x}"
        )));
    }
    let text = String::from_utf8(json)
        .map_err(|e| Error::BadRegion(format!("stored configuration is not UTF-8: {e}")))?;
    let cfg = FairConfig::from_json(&text)
        .map_err(|e| Error::BadRegion(format!("stored configuration: {e}")))?;
    if cfg.tenants.len() as u64 != n {
        return Err(Error::BadRegion(format!(
            "stored configuration has {} tenants; the region header says {n}",
            cfg.tenants.len()
        )));
    }
    Ok((cfg, l))
}

/// The object header of the fair-share area mapped by `map` (validated at
/// bind: size, alignment, magic).
fn obj_header(map: &Mapping) -> &RegionObjHeader {
    // SAFETY: validated at bind (size, alignment, magic); made of atomics;
    // the reference lives no longer than `map`.
    unsafe { &*(map.object_ptr() as *const RegionObjHeader) }
}

/// Whether a scan for dead processes is due (see [`REAP_INTERVAL_MS`]).
fn reap_due(map: &Mapping) -> bool {
    let last = obj_header(map).last_reap_ms.load(Ordering::Relaxed);
    monotonic_ms().saturating_sub(last) >= REAP_INTERVAL_MS
}

impl SharedFairShare {
    fn from_mapping(map: Arc<Mapping>) -> Result<SharedFairShare> {
        let (cfg, l) = read_config(&map)?;
        let cap = map.header().params[3] as usize;
        // SAFETY: [ledger_off, ledger_off + ledger_len) lies inside the
        // object area (validated by read_config), which `map` keeps mapped
        // for as long as the handle (stored beside it) lives.
        let mut ledger =
            unsafe { SharedLedger::attach(map.object_ptr().add(l.ledger_off), l.ledger_len) }?;
        ledger.set_region(map.clone());
        let (want_params, _, _) = initial_state(&cfg, cap)?;
        let mut have = ledger.params();
        have.flags = want_params.flags;
        if have != want_params || ledger.capacities() != (cfg.tenants.len(), cap) {
            return Err(Error::BadRegion(format!(
                "the ledger's parameters {have:?} do not match the stored configuration's {want_params:?}"
            )));
        }
        // A lease belongs to the process until it exits, not to this handle:
        // keep the registration past the last handle while leases are held.
        map.set_retain_check(holds_leases);
        let mut s = SharedFairShare {
            map,
            ledger,
            cfg,
            cap,
            log: None,
        };
        // Register now; a full table may hold dead processes: reap them
        // (returning their leases) and try once more. (`me` itself waits for
        // entries other processes are reaping.) A reap that fails for some
        // dead process keeps that entry; whether another one came free is
        // what `me` finds out.
        if let Err(Error::ProcessTableFull { .. }) = s.map.me() {
            let _ = s.reap();
            s.map.me()?;
        }
        Ok(s)
    }

    /// Another handle on the same ledger (for another thread).
    pub fn handle(&self) -> Result<SharedFairShare> {
        SharedFairShare::from_mapping(self.map.clone())
    }

    /// The configuration stored in the region.
    pub fn config(&self) -> &FairConfig {
        &self.cfg
    }

    /// Lease slots, fixed at creation.
    pub fn lease_capacity(&self) -> usize {
        self.cap
    }

    /// The region mapping this ledger lives in.
    pub fn mapping(&self) -> &Arc<Mapping> {
        &self.map
    }

    /// This process's owner id in the region (recorded in its leases),
    /// registering it if needed (after `fork`, as a new process). A full
    /// process table is reaped once and retried.
    #[inline]
    pub fn owner(&mut self) -> Result<u32, FairError> {
        // Registered in this fork generation: the id `me` would give.
        if let Some(owner) = self.map.me_registered() {
            return Ok(owner);
        }
        self.owner_slow()
    }

    /// [`owner`](Self::owner) when this process is not registered yet (or
    /// was forked since).
    #[cold]
    fn owner_slow(&mut self) -> Result<u32, FairError> {
        match self.map.me() {
            Ok(id) => Ok(id.owner),
            Err(Error::ProcessTableFull { .. }) => {
                let _ = self.reap();
                self.map
                    .me()
                    .map(|id| id.owner)
                    .map_err(|e| FairError::Region(e.to_string()))
            }
            Err(e) => Err(FairError::Region(e.to_string())),
        }
    }

    fn obj_header(&self) -> &RegionObjHeader {
        obj_header(&self.map)
    }

    /// Scans for dead processes unless another scan ran within
    /// [`REAP_INTERVAL_MS`]; returns leases released.
    fn maybe_reap(&mut self, at: u64) -> Result<u64, FairError> {
        let now = monotonic_ms();
        let slot = &self.obj_header().last_reap_ms;
        let last = slot.load(Ordering::Relaxed);
        if now.saturating_sub(last) < REAP_INTERVAL_MS
            || slot
                .compare_exchange(last, now, Ordering::AcqRel, Ordering::Relaxed)
                .is_err()
        {
            return Ok(0);
        }
        self.reap_at(at).map(|r| r.leases)
    }

    /// Releases the leases of every dead process now, and frees their
    /// process-table entries. Leases are released at the ledger's latest
    /// accepted `now` (reaping is not activity and does not move time).
    pub fn reap(&mut self) -> Result<ReapOutcome, FairError> {
        // Register if we can (a full table is what reaping is for; the
        // reaper then holds, and is named in, each entry it reaps).
        let _ = self.map.me();
        self.reap_at(0)
    }

    fn reap_at(&mut self, at: u64) -> Result<ReapOutcome, FairError> {
        let ledger = &mut self.ledger;
        let mut leases = 0u64;
        let mut procs = 0u32;
        let mut err = None;
        // An entry is freed only if its leases were released: otherwise it
        // stays for a later reap (its leases are never orphaned).
        let scan =
            self.map
                .reap_dead_checked(&mut |_idx, owner| match ledger.reap_owner(owner, at) {
                    Ok(n) => {
                        leases += n;
                        procs += 1;
                        Ok(())
                    }
                    Err(e) => {
                        let msg = format!("releasing the leases of dead owner {owner:#x}: {e}");
                        err.get_or_insert(e);
                        Err(Error::BadRegion(msg))
                    }
                });
        let h = self.obj_header();
        h.reaped_processes
            .fetch_add(u64::from(procs), Ordering::Relaxed);
        h.reaped_leases.fetch_add(leases, Ordering::Relaxed);
        match (err, scan) {
            (Some(e), _) => Err(e),
            (None, Err(e)) => Err(FairError::Region(e.to_string())),
            (None, Ok(_)) => Ok(ReapOutcome {
                processes: procs,
                leases,
            }),
        }
    }

    /// Region-wide counters of the reaper: `(dead processes reaped, leases
    /// released on their behalf)`.
    pub fn reaped(&self) -> (u64, u64) {
        let h = self.obj_header();
        (
            h.reaped_processes.load(Ordering::Relaxed),
            h.reaped_leases.load(Ordering::Relaxed),
        )
    }

    /// Times a process died holding the ledger's lock and a later caller
    /// recovered the last committed state.
    pub fn recoveries(&self) -> u64 {
        self.ledger.recoveries()
    }

    /// Times the ledger's mutex was found corrupt (a lock word naming no
    /// thread that could release it, a scribbled type word, a
    /// not-recoverable state) and re-initialised.
    pub fn lock_repairs(&self) -> u64 {
        self.ledger.repairs()
    }

    /// Test seam: `f` runs inside every call while the ledger's lock is
    /// held. Never use it outside tests.
    #[doc(hidden)]
    pub fn test_while_locked(&mut self, f: Option<fn()>) {
        self.ledger.test_while_locked(f);
    }

    /// Test seam: `f` runs at `point` of every call through this handle
    /// (see [`SharedLedger::test_hook_at`]). Never use it outside tests.
    #[doc(hidden)]
    pub fn test_hook_at(&mut self, point: super::shared::CrashPoint, f: Option<fn()>) {
        self.ledger.test_hook_at(point, f);
    }

    /// Committed updates of the ledger since creation.
    pub fn commits(&self) -> u64 {
        self.ledger.commits()
    }

    /// Test seam for trace T10 (see [`FairShare`]); local to this handle.
    #[doc(hidden)]
    pub fn set_refusal_counts_as_activity(&mut self, yes: bool) {
        self.ledger.set_refusal_counts_as_activity(yes);
    }

    /// The ledger's answer to an acquire; a grant is written to `out`.
    #[inline]
    fn acquire_at(
        &mut self,
        tenant: &str,
        cost: f64,
        hold_ms: u64,
        at: Option<u64>,
        out: &mut std::mem::MaybeUninit<super::Lease>,
    ) -> Result<super::admission::Answer, FairError> {
        let owner = self.owner()?;
        // A refusal or a full table defers (commits nothing) when a scan for
        // dead processes is due: their leases may be what is short.
        let (map, ledger) = (&self.map, &mut self.ledger);
        let first =
            ledger.acquire_as(owner, tenant, cost, hold_ms, at, &mut || reap_due(map), out)?;
        if !matches!(first, super::admission::Answer::Deferred) {
            return Ok(first);
        }
        self.maybe_reap(at.unwrap_or(0))?;
        self.ledger
            .acquire_as(owner, tenant, cost, hold_ms, at, &mut || false, out)
    }

    /// Starts recording this handle's calls in the call-log format
    /// ([`replay()`](super::replay())), from a `config` line on. Each line
    /// carries the `now` the ledger took (in a region a `now` earlier than
    /// the last accepted one is taken as that one, and a `*_now` call's
    /// clock reading is recorded as its time) and `"seq"`, the call's place
    /// in the ledger's order ([`SharedLedger::last_taken`]): the logs of
    /// several handles or processes merged by
    /// [`merge_call_logs`](super::replay::merge_call_logs) replay exactly
    /// in-process, as long as no process died (reaping a dead process's
    /// leases is not a call and is not in any log).
    pub fn record_calls(&mut self) -> Result<(), FairError> {
        let mut line =
            serde_json::to_value(&self.cfg).map_err(|e| FairError::InvalidConfig(e.to_string()))?;
        if let Some(o) = line.as_object_mut() {
            o.insert("op".into(), "config".into());
            o.insert("lease_capacity".into(), self.cap.into());
        }
        self.log = Some(vec![line.to_string()]);
        Ok(())
    }

    /// The recorded calls (config first), if [`record_calls`](Self::record_calls)
    /// was called.
    pub fn call_log(&self) -> Option<&[String]> {
        self.log.as_deref()
    }

    /// Appends a call-log line (only built when recording): `op` fields,
    /// the `now` taken and the call's place in the ledger's order.
    #[inline(always)]
    fn record(&mut self, v: impl FnOnce() -> serde_json::Value) {
        if self.log.is_some() {
            self.record_line(v);
        }
    }

    /// The recording part of [`record`](Self::record), out of the call's
    /// way (a call that does not record pays one test).
    #[cold]
    fn record_line(&mut self, v: impl FnOnce() -> serde_json::Value) {
        if let Some(log) = &mut self.log {
            let (now, seq) = self.ledger.last_taken();
            let mut line = v();
            if let Some(o) = line.as_object_mut() {
                o.insert("now_ms".into(), now.into());
                o.insert("seq".into(), seq.into());
            }
            log.push(line.to_string());
        }
    }

    #[inline]
    fn recorded_acquire(
        &mut self,
        tenant: &str,
        cost: f64,
        hold_ms: u64,
        at: Option<u64>,
    ) -> AcquireResult {
        let mut out = std::mem::MaybeUninit::uninit();
        let answer = self.acquire_at(tenant, cost, hold_ms, at, &mut out);
        self.record(|| serde_json::json!({"op":"acquire","tenant":tenant,"cost":super::num_value(cost),"hold_ms":hold_ms}));
        answer?.into_result(&out)
    }

    #[inline]
    fn recorded_release(&mut self, lease_id: &str, at: Option<u64>) -> Result<(), FairError> {
        let r = self
            .owner()
            .and_then(|_| self.ledger.release_at(lease_id, at));
        self.record(|| serde_json::json!({"op":"release","lease":lease_id}));
        r
    }

    /// Asks for `cost` held for `hold_ms` at `now_ms` (see
    /// [`FairShare::acquire`]); the lease records this process as owner. A
    /// `now_ms` earlier than the ledger's last accepted `now` is taken as
    /// that one (see the module docs, "Time").
    pub fn acquire(&mut self, tenant: &str, cost: f64, hold_ms: u64, now_ms: u64) -> AcquireResult {
        self.recorded_acquire(tenant, cost, hold_ms, Some(now_ms))
    }

    /// [`acquire`](Self::acquire) at `CLOCK_MONOTONIC` ms, read under the
    /// ledger's lock.
    pub fn acquire_now(&mut self, tenant: &str, cost: f64, hold_ms: u64) -> AcquireResult {
        self.recorded_acquire(tenant, cost, hold_ms, None)
    }

    /// Releases `lease_id` at `now_ms` (never fails for time). Any process
    /// may release any live lease by its id.
    pub fn release(&mut self, lease_id: &str, now_ms: u64) -> Result<(), FairError> {
        self.recorded_release(lease_id, Some(now_ms))
    }

    /// [`release`](Self::release) at the clock, read under the lock.
    pub fn release_now(&mut self, lease_id: &str) -> Result<(), FairError> {
        self.recorded_release(lease_id, None)
    }

    fn stats_at(&mut self, at: Option<u64>, out: &mut Stats) -> Result<(), FairError> {
        let r = self
            .owner()
            .and_then(|_| self.ledger.stats_into_at(at, out));
        self.record(|| serde_json::json!({"op":"stats"}));
        r
    }

    /// Stats at `now_ms`.
    pub fn stats(&mut self, now_ms: u64) -> Result<Stats, FairError> {
        let mut out = Stats::default();
        self.stats_at(Some(now_ms), &mut out)?;
        Ok(out)
    }

    /// Stats at the clock, read under the lock.
    pub fn stats_now(&mut self) -> Result<Stats, FairError> {
        let mut out = Stats::default();
        self.stats_at(None, &mut out)?;
        Ok(out)
    }

    /// [`stats`](Self::stats) into `out`, reusing its vectors (see
    /// [`FairShare::stats_into`]).
    pub fn stats_into(&mut self, now_ms: u64, out: &mut Stats) -> Result<(), FairError> {
        self.stats_at(Some(now_ms), out)
    }

    /// [`stats_into`](Self::stats_into) at the clock, read under the lock.
    pub fn stats_into_now(&mut self, out: &mut Stats) -> Result<(), FairError> {
        self.stats_at(None, out)
    }

    fn plan_at(&mut self, at: Option<u64>) -> Result<Plan, FairError> {
        let r = self.owner().and_then(|_| self.ledger.plan_at(at));
        self.record(|| serde_json::json!({"op":"plan"}));
        r
    }

    /// Plan at `now_ms`.
    pub fn plan(&mut self, now_ms: u64) -> Result<Plan, FairError> {
        self.plan_at(Some(now_ms))
    }

    /// Plan at the clock, read under the lock.
    pub fn plan_now(&mut self) -> Result<Plan, FairError> {
        self.plan_at(None)
    }

    fn report_at(&mut self, at: Option<u64>) -> Result<FairnessReport, FairError> {
        let r = self.owner().and_then(|_| self.ledger.report_at(at));
        self.record(|| serde_json::json!({"op":"report"}));
        r
    }

    /// Fairness report at `now_ms`.
    pub fn fairness_report(&mut self, now_ms: u64) -> Result<FairnessReport, FairError> {
        self.report_at(Some(now_ms))
    }

    /// Fairness report at the clock, read under the lock.
    pub fn fairness_report_now(&mut self) -> Result<FairnessReport, FairError> {
        self.report_at(None)
    }
}

/// What one [`SharedFairShare::reap`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct ReapOutcome {
    /// Dead processes whose entries were freed.
    pub processes: u32,
    /// Their leases released.
    pub leases: u64,
}

/// The retain check of a fair-share mapping: does the process registered as
/// `me` hold a live lease? Any failure to tell answers yes (keeping a dead
/// mapping's registration until exit costs one fd; dropping a live lease
/// holder's would let its leases be reaped).
fn holds_leases(map: &Mapping, me: ProcId) -> bool {
    let Ok((_, l)) = read_config(map) else {
        return true;
    };
    // SAFETY: as in `from_mapping`: the ledger lies inside the object area
    // (validated by read_config), which stays mapped during this call.
    let ledger = unsafe { SharedLedger::attach(map.object_ptr().add(l.ledger_off), l.ledger_len) };
    match ledger {
        // Read without the lock: a process stopped holding it does not
        // hold up this drop.
        Ok(ledger) => ledger.owner_holds(me.owner).unwrap_or(true),
        Err(_) => true,
    }
}

impl FairLedger for SharedFairShare {
    fn acquire(&mut self, tenant: &str, cost: f64, hold_ms: u64, now_ms: u64) -> AcquireResult {
        SharedFairShare::acquire(self, tenant, cost, hold_ms, now_ms)
    }
    fn release(&mut self, lease_id: &str, now_ms: u64) -> Result<(), FairError> {
        SharedFairShare::release(self, lease_id, now_ms)
    }
    fn stats(&mut self, now_ms: u64) -> Result<Stats, FairError> {
        SharedFairShare::stats(self, now_ms)
    }
    fn plan(&mut self, now_ms: u64) -> Result<Plan, FairError> {
        SharedFairShare::plan(self, now_ms)
    }
    fn fairness_report(&mut self, now_ms: u64) -> Result<FairnessReport, FairError> {
        SharedFairShare::fairness_report(self, now_ms)
    }
}

/// A fair-share region as an inspector sees it
/// ([`RegionView::fair_share`](crate::region::RegionView::fair_share)):
/// its configuration and its stats at a `now`, read without writing a byte.
#[derive(Debug, Clone, serde::Serialize)]
pub struct FairInspection {
    /// The configuration the region holds.
    pub config: FairConfig,
    /// The ledger's statistics at `stats.now_ms`: `CLOCK_MONOTONIC` ms, or
    /// the ledger's last accepted `now` if that is later. Computed on a
    /// copy: the ledger's time does not move.
    pub stats: Stats,
    /// The latest `now` the ledger accepted.
    pub ledger_now_ms: u64,
    /// Committed updates since creation.
    pub commits: u64,
    /// Processes reaped since creation.
    pub reaped_processes: u64,
    /// Leases those processes held.
    pub reaped_leases: u64,
    /// False when the ledger changed during every read attempt: the
    /// tenants' figures are still one committed state, but the overrun
    /// leases were read one at a time.
    pub leases_consistent: bool,
}

impl crate::region::RegionView {
    /// A fair-share region's configuration and stats, read without the
    /// ledger's lock, a process-table entry or a single write (see
    /// [`shared`](super::shared), "Reading without the lock"): a consistent
    /// copy of the last committed state, even beside an application stopped
    /// inside a ledger call. The stats are computed on the copy at the
    /// region's clock (`CLOCK_MONOTONIC` ms) or at the ledger's last
    /// accepted `now`, whichever is later.
    pub fn fair_share(&self) -> Result<FairInspection> {
        let h = self.header();
        if h.kind != ObjectKind::FairShare {
            return Err(Error::WrongKind {
                found: h.kind,
                expected: ObjectKind::FairShare,
            });
        }
        let (base, len) = (self.object_ptr(), self.object_len());
        let (config, l) = read_config_at(&h.params, base, len)?;
        let bad = |e: FairError| Error::BadRegion(format!("fair-share ledger: {e}"));
        // SAFETY: [ledger_off, ledger_off + ledger_len) lies inside the
        // object area (validated by read_config_at), which the view keeps
        // mapped while `self` lives; the snapshot only loads.
        let snap = unsafe {
            super::shared::read_snapshot(
                base.add(l.ledger_off),
                l.ledger_len,
                super::shared::SNAPSHOT_BUDGET,
            )
        }
        .map_err(bad)?;
        let (want, _, _) = initial_state(&config, h.params[3] as usize).map_err(bad)?;
        let mut have = snap.params;
        have.flags = want.flags;
        if have != want {
            return Err(Error::BadRegion(format!(
                "the ledger's parameters {have:?} do not match the stored configuration's {want:?}"
            )));
        }
        let ledger_now_ms = snap.meta.last_now_ms;
        let now = monotonic_ms().max(ledger_now_ms).max(config.started_at_ms);
        let mut tenants = Vec::with_capacity(snap.tenants.len());
        for t in &snap.tenants {
            tenants
                .push(super::admission::tenant_stats(t, config.idle_after_ms, now).map_err(bad)?);
        }
        let mut over: Vec<_> = snap.leases.iter().filter(|l| now > l.deadline_ms).collect();
        over.sort_by_key(|l| l.seq);
        let mut overrun_leases = Vec::with_capacity(over.len());
        for l in over {
            let t = snap
                .tenants
                .get(l.tenant as usize)
                .ok_or_else(|| bad(FairError::Corrupt(format!("lease of tenant {}", l.tenant))))?;
            overrun_leases.push(
                super::LeaseId::new(t.id_str(), l.no)
                    .ok_or_else(|| bad(FairError::Corrupt("a tenant id is too long".into())))?,
            );
        }
        // SAFETY: as in read_config_at: the validated object header, made of
        // atomics, only loaded.
        let oh = unsafe { &*(base as *const RegionObjHeader) };
        Ok(FairInspection {
            config,
            stats: Stats {
                now_ms: now,
                tenants,
                overrun_leases,
            },
            ledger_now_ms,
            commits: snap.commits,
            reaped_processes: oh.reaped_processes.load(Ordering::Relaxed),
            reaped_leases: oh.reaped_leases.load(Ordering::Relaxed),
            leases_consistent: snap.leases_consistent,
        })
    }
}
