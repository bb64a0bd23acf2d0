//! A concurrency limit with seven priorities, per-priority caps, a
//! starvation lottery, child schedulers and stats — in one process, or shared
//! by many processes through a [`Region`].
//!
//! ```
//! use shmsched::scheduler::{Concurrency, Scheduler};
//! use shmsched::Priority;
//!
//! # fn main() -> shmsched::Result<()> {
//! // At most 4 at once; low-priority work at most 1.
//! let sched = Scheduler::new(Concurrency::max(4).low(1))?;
//! let permit = sched.acquire(Priority::High)?;      // blocks until admitted
//! assert_eq!(sched.stats().running, 1);
//! drop(permit);                                     // released exactly once
//!
//! let answer = sched.run(Priority::Normal, || 6 * 7)?;
//! assert_eq!(answer, 42);
//!
//! // A child adds a tighter local cap on top of its parent.
//! let reads = sched.child(2)?;
//! let _a = reads.try_acquire(Priority::Normal).expect("free");
//! let _b = reads.try_acquire(Priority::Normal).expect("free");
//! assert!(reads.try_acquire(Priority::Normal).is_none());
//! # Ok(()) }
//! ```

mod caps;
mod future;
mod inspect;
mod lottery;
mod node;
mod root;
mod shared;

/// The revision of this kind's object area that this build reads and
/// writes (see [`crate::object_revision`]).
pub const OBJECT_REVISION: u64 = shared::OBJECT_REV;
mod stats;
mod view;
mod waiter;

use std::num::NonZeroU32;
use std::sync::Arc;
use std::time::{Duration, Instant};

pub use caps::{Concurrency, MAX_CONCURRENCY};
pub use future::{Acquire, AcquireOwned};
pub use lottery::LOTTERY_ODDS;
pub use root::{BACKSTOP, FAIR_AFTER, PROBE_AFTER};
#[cfg(shuttle)]
#[doc(hidden)]
pub use shared::ModelState;
pub use shared::MAX_SHARED_SLOTS;
pub use stats::{QueueStats, SchedulerStats, SharedStats};

pub use crate::region::registry::REAP_INTERVAL_MS;

use crate::error::{Error, Result};
use crate::priority::Priority;
use crate::region::Region;
use node::{Level, Node};
use root::SharedRoot;
use waiter::Slots;

/// A handle to a scheduler. Clones share the same scheduler; disposing one
/// disposes it for all.
#[derive(Debug, Clone)]
pub struct Scheduler {
    node: Arc<Node>,
}

/// The right to run one task (or, from a weighted acquire, `n` units of the
/// budget). Releases exactly once, on drop.
///
/// A permit inherited by a forked child belongs to the parent: dropping it
/// in the child does nothing.
#[must_use = "dropping a permit releases its slot at once"]
#[derive(Debug)]
pub struct Permit<'a> {
    sched: &'a Scheduler,
    slots: Slots,
}

impl Permit<'_> {
    /// The priority this permit was acquired at.
    pub fn priority(&self) -> Priority {
        self.slots.priority()
    }

    /// How many units of the budget it holds (1 unless acquired with
    /// [`Scheduler::acquire_many`]).
    pub fn units(&self) -> u32 {
        self.slots.len()
    }

    /// Turns a borrowed permit into an owned one (the slot stays held).
    pub fn into_owned(self) -> OwnedPermit {
        let this = std::mem::ManuallyDrop::new(self);
        OwnedPermit {
            sched: this.sched.clone(),
            // SAFETY: `this` is never dropped (ManuallyDrop), so moving the
            // slots out of it leaves nothing to be dropped twice.
            slots: unsafe { std::ptr::read(&this.slots) },
        }
    }
}

impl<'a> Permit<'a> {
    /// Turns a one-cell permit of a shared root scheduler (made by
    /// [`Scheduler::shared`] or [`Scheduler::attach`], not a child, not
    /// weighted) into a [`RawPermit`]: plain data that
    /// [`Scheduler::release_raw`] gives back, once. The slot stays held.
    ///
    /// The permit's region cell records `tag` beside its owner (one plain
    /// store, no read-modify-write), so the release's give-back CAS is the
    /// check: a second release of the same raw permit, or one with another
    /// tag, changes nothing and fails with [`Error::AlreadyReleased`]. A
    /// stale raw permit can only be mistaken for a later one of this
    /// process on the same cell with the very same tag, so pick tags that
    /// do not repeat soon (a per-thread counter, say).
    ///
    /// Anything else (an in-process scheduler, a child, a weighted permit,
    /// a permit inherited across `fork`) comes back unchanged as `Err`.
    ///
    /// ```
    /// use shmsched::region::Region;
    /// use shmsched::scheduler::Scheduler;
    /// use shmsched::{Error, Priority};
    /// use std::num::NonZeroU32;
    /// # fn main() -> shmsched::Result<()> {
    /// let sched = Scheduler::shared(&Region::anonymous()?, 2)?;
    /// let tag = NonZeroU32::new(7).unwrap();
    /// let raw = sched.acquire(Priority::Normal)?.into_raw(tag).expect("one cell");
    /// assert_eq!(sched.global_running(), 1);
    /// sched.release_raw(raw)?;
    /// assert!(matches!(sched.release_raw(raw), Err(Error::AlreadyReleased { .. })));
    /// assert_eq!(sched.global_running(), 0);
    /// # Ok(()) }
    /// ```
    #[inline(always)]
    pub fn into_raw(self, tag: NonZeroU32) -> std::result::Result<RawPermit, Permit<'a>> {
        let node = &self.sched.node;
        // A shared level is always a root (see `Level::Shared`).
        let (Level::Shared(root), waiter::SlotsView::One(c)) = (node.level(), self.slots.view())
        else {
            return Err(self);
        };
        if node.forked() {
            return Err(self);
        }
        let raw = tag_one(root, c, tag);
        // The slots are now the raw permit's: nothing to drop (a one-cell
        // Slots owns no memory).
        std::mem::forget(self);
        Ok(raw)
    }
}

/// Makes the one cell `c` (with its counted bit) that this process holds
/// in `root` a raw permit tagged `tag`; the caller forgets its slots.
#[inline(always)]
fn tag_one(root: &SharedRoot, c: u32, tag: NonZeroU32) -> RawPermit {
    root.slots().tag_cell(c, tag.get());
    RawPermit { cell: c, tag }
}

/// A one-cell permit of a shared root scheduler as plain data (see
/// [`Permit::into_raw`]): its region cell and the tag the cell records.
/// Copy it freely; [`Scheduler::release_raw`] releases it once, and only
/// in the process that holds it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct RawPermit {
    /// The cell number, with the counted bit of the library's bookkeeping.
    cell: u32,
    tag: NonZeroU32,
}

impl RawPermit {
    /// The largest cell number ([`MAX_SHARED_SLOTS`] − 1).
    pub const MAX_CELL: u32 = MAX_SHARED_SLOTS - 1;

    /// The region cell it holds (0..=[`MAX_CELL`](Self::MAX_CELL)).
    pub fn cell(&self) -> u32 {
        self.cell & !shared::COUNTED
    }

    /// Whether its cell is counted in the process's running count (part of
    /// what a release needs back).
    pub fn counted(&self) -> bool {
        self.cell & shared::COUNTED != 0
    }

    /// The tag its cell records.
    pub fn tag(&self) -> NonZeroU32 {
        self.tag
    }

    /// A raw permit from its parts (as [`cell`](Self::cell),
    /// [`counted`](Self::counted) and [`tag`](Self::tag) gave them, say
    /// after a trip through a C token). Any parts are safe to release: parts
    /// that do not name a held raw permit fail with
    /// [`Error::AlreadyReleased`] and change nothing. `None` if `cell` is
    /// above [`MAX_CELL`](Self::MAX_CELL).
    pub fn from_parts(cell: u32, counted: bool, tag: NonZeroU32) -> Option<RawPermit> {
        (cell <= Self::MAX_CELL).then_some(RawPermit {
            cell: cell | if counted { shared::COUNTED } else { 0 },
            tag,
        })
    }
}

/// What [`Scheduler::release_raw_first_look`] did.
#[must_use = "a `Serve` serves the queue when dropped; forgetting it can leave a waiter asleep"]
#[derive(Debug)]
pub enum RawRelease<'a> {
    /// Released: the cell is free and nobody needs serving.
    Released,
    /// Released, and the queue (or a lowered ceiling) needs serving, which
    /// dropping the [`Serve`] does.
    Serve(Serve<'a>),
    /// Nothing released: the cell does not hold this raw permit (what
    /// [`Scheduler::release_raw`] answers with [`Error::AlreadyReleased`]).
    NotHeld,
    /// Nothing done: a case the first look leaves to
    /// [`Scheduler::release_raw`] (not a shared root, a forked child, a
    /// region above a lowered ceiling).
    Declined,
}

/// The rest of a raw release ([`RawRelease::Serve`]): dropping it moves
/// the queue on (and serves a lowered ceiling) as a release does once its
/// cell is free. Drop it before anything else happens to the scheduler.
#[must_use = "dropping it serves the queue; forgetting it can leave a waiter asleep"]
#[derive(Debug)]
pub struct Serve<'a> {
    root: &'a SharedRoot,
}

impl Drop for Serve<'_> {
    fn drop(&mut self) {
        self.root.release_slow();
    }
}

/// What releasing a raw permit needs of a shared root scheduler, and
/// nothing more: this process's binding of the region, the one every
/// handle of this process made through clones of one [`Region`] shares
/// (see [`Scheduler::raw_releaser`]). A raw permit taken through any of
/// those handles can be released through it, also once they are all
/// dropped.
///
/// It is not a scheduler handle: no acquire, no caps, no dispose. It
/// keeps the binding (and so the region's mapping and this process's
/// entry in its process table) alive while it lives, as a handle would:
/// meanwhile [`Scheduler::detach`] refuses, since the binding is shared.
/// For a caller that hands raw permits out past the handle that took them
/// (the C face's cell tokens, released after their handle is closed).
///
/// ```
/// use shmsched::region::Region;
/// use shmsched::scheduler::Scheduler;
/// use shmsched::{Error, Priority};
/// # fn main() -> shmsched::Result<()> {
/// let region = Region::anonymous()?;
/// let sched = Scheduler::shared(&region, 2)?;
/// let releaser = sched.raw_releaser().expect("a shared root");
/// let raw = sched.acquire_raw_fast(Priority::Normal).expect("a free cell");
/// let other = Scheduler::attach(&region)?;
/// assert!(releaser.same_root(&other), "one binding of the region");
/// drop(sched);
/// assert_eq!(releaser.raw_permits_held(), 1);
/// releaser.release_raw(raw)?;
/// assert!(matches!(releaser.release_raw(raw), Err(Error::AlreadyReleased { .. })));
/// assert_eq!(other.global_running(), 0);
/// # Ok(()) }
/// ```
#[derive(Debug, Clone)]
pub struct RawReleaser {
    root: Arc<SharedRoot>,
}

impl RawReleaser {
    /// Releases a raw permit of this binding, as [`Scheduler::release_raw`]
    /// does through any of its handles (the queue moves on, a lowered
    /// ceiling gets its cell; the cell's give-back CAS is the check).
    ///
    /// Errors: [`Error::AlreadyReleased`] (nothing changed);
    /// [`Error::Forked`] in a forked child (the binding is the parent's).
    #[inline(always)]
    pub fn release_raw(&self, raw: RawPermit) -> Result<()> {
        if self.root.forked() {
            return Err(raw_forked());
        }
        release_raw_in(&self.root, raw)
    }

    /// [`Scheduler::release_raw_first_look`] through this binding: the same
    /// answers ([`RawRelease::Declined`] in a forked child and above a
    /// lowered ceiling, where [`release_raw`](Self::release_raw) answers).
    #[inline(always)]
    pub fn release_raw_first_look(&self, raw: RawPermit) -> RawRelease<'_> {
        if self.root.forked() {
            return RawRelease::Declined;
        }
        self.root.release_raw_first_look(raw.cell, raw.tag.get())
    }

    /// How many raw permits this process holds in the region through this
    /// binding now, as [`Scheduler::raw_permits_held`] of any of its
    /// handles. O(max): it reads every cell.
    pub fn raw_permits_held(&self) -> u32 {
        self.root.slots().raw_held()
    }

    /// Whether `sched` is a shared root handle of this binding (its raw
    /// permits are this releaser's to release): false for a child, an
    /// in-process scheduler, another region or another binding of the same
    /// region (through a `Region` opened again, or made in a forked child).
    pub fn same_root(&self, sched: &Scheduler) -> bool {
        matches!(sched.node.level(), Level::Shared(r) if Arc::ptr_eq(r, &self.root))
    }
}

/// [`Error::Forked`] for a raw release in a forked child.
#[cold]
fn raw_forked() -> Error {
    Error::Forked(
        "a raw permit belongs to the process that made it; a forked child cannot release it".into(),
    )
}

/// The give-back of `raw` in `root`, a shared root of this process.
#[inline(always)]
fn release_raw_in(root: &SharedRoot, raw: RawPermit) -> Result<()> {
    if root.release_raw(raw.cell, raw.tag.get()) {
        Ok(())
    } else {
        Err(Error::AlreadyReleased { cell: raw.cell() })
    }
}

impl Drop for Permit<'_> {
    #[inline(always)]
    fn drop(&mut self) {
        if !self.sched.node.release_fast(&self.slots) {
            release_chain(&self.sched.node, &self.slots);
        }
    }
}

/// A permit that owns a handle to its scheduler: `Send + 'static`, so it can
/// move into a spawned thread or task. Releases its slot exactly once, on
/// drop, like [`Permit`].
///
/// ```
/// use shmsched::scheduler::Scheduler;
/// use shmsched::Priority;
/// # fn main() -> shmsched::Result<()> {
/// let sched = Scheduler::new(2)?;
/// let permit = sched.acquire_owned(Priority::Normal)?;
/// let worker = std::thread::spawn(move || {
///     // ... work while holding the slot ...
///     drop(permit); // released here, on another thread
/// });
/// worker.join().unwrap();
/// assert_eq!(sched.stats().running, 0);
/// # Ok(()) }
/// ```
#[must_use = "dropping a permit releases its slot at once"]
#[derive(Debug)]
pub struct OwnedPermit {
    sched: Scheduler,
    slots: Slots,
}

impl OwnedPermit {
    /// A permit for `slots` (already marked with their priority) of `sched`.
    pub(super) fn new(sched: Scheduler, slots: Slots) -> OwnedPermit {
        OwnedPermit { sched, slots }
    }

    /// The priority this permit was acquired at.
    pub fn priority(&self) -> Priority {
        self.slots.priority()
    }

    /// How many units of the budget it holds.
    pub fn units(&self) -> u32 {
        self.slots.len()
    }

    /// The scheduler this permit belongs to.
    pub fn scheduler(&self) -> &Scheduler {
        &self.sched
    }
}

impl Drop for OwnedPermit {
    #[inline]
    fn drop(&mut self) {
        if !self.sched.node.release_fast(&self.slots) {
            release_chain(&self.sched.node, &self.slots);
        }
    }
}

fn default_seed() -> u64 {
    let t = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64);
    t ^ (u64::from(std::process::id()) << 32)
}

/// A deadline `timeout` from now; `None` (no deadline) if it lies beyond
/// what `Instant` can represent (e.g. `Duration::MAX`).
pub(crate) fn deadline_after(timeout: Duration) -> Option<Instant> {
    Instant::now().checked_add(timeout)
}

/// Releases every level of the chain, leaf first (a waiter of a child gets
/// the child's unit at once and then queues for the root, which follows).
/// Nothing in a forked child: the units are the parent's.
///
/// The levels that give their units straight back to an in-process pool
/// (nobody queued there) are released in a loop that calls nothing, so it
/// needs no stack frame; the first level below the root that needs more
/// (a waiter to serve) hands the rest to [`release_levels_from`], and the
/// root itself goes to [`Node::release_queued`].
#[inline(never)]
fn release_chain(leaf: &Node, root_slots: &Slots) {
    if leaf.forked() {
        return;
    }
    let n = root_slots.len();
    let mut node = leaf;
    while let Some(parent) = node.parent() {
        if !node.release_uncontended(n) {
            return release_levels_from(node, root_slots);
        }
        node = parent;
    }
    if !node.release_uncontended(n) {
        node.release_queued(root_slots);
    }
}

/// Releases `node` and every level above it (the general case of
/// [`release_chain`]).
#[inline(never)]
fn release_levels_from(mut node: &Node, root_slots: &Slots) {
    let n = root_slots.len();
    while let Some(parent) = node.parent() {
        node.release_level(&Slots::counted(n));
        node = parent;
    }
    node.release_level(root_slots);
}

impl Scheduler {
    /// Releases a raw permit of this scheduler (see [`Permit::into_raw`]),
    /// exactly as dropping the permit would have (the queue moves on, a
    /// lowered ceiling gets its cell). Its cell's give-back CAS is the
    /// check: if the cell does not hold this raw permit (released already,
    /// another tag, another cell, a raw permit of another scheduler),
    /// nothing changes and the answer is [`Error::AlreadyReleased`].
    ///
    /// Errors: [`Error::AlreadyReleased`]; [`Error::InvalidArgument`] on a
    /// scheduler that is not a shared root; [`Error::Forked`] in a forked
    /// child (the raw permit is the parent's).
    #[inline(always)]
    pub fn release_raw(&self, raw: RawPermit) -> Result<()> {
        let node = &self.node;
        // A shared level is always a root (see `Level::Shared`).
        let Level::Shared(root) = node.level() else {
            return Err(Error::InvalidArgument(
                "a raw permit belongs to a shared root scheduler (Scheduler::shared or Scheduler::attach), not to a child or an in-process one"
                    .into(),
            ));
        };
        if node.forked() {
            return Err(raw_forked());
        }
        release_raw_in(root, raw)
    }

    /// One unit at `priority` if [`acquire`](Self::acquire) admits it at
    /// once on its fast path, handed out as a raw permit: what
    /// `acquire(priority)?.into_raw(tag)` gives then, in one step (no
    /// [`Permit`] is made, so nothing re-checks what the take just checked).
    ///
    /// The tag is the scheduler's: the last one it gave on the same cell in
    /// this process plus one (never 0), from a random start per binding of
    /// the region. So a stale raw permit tagged here can match a later raw
    /// permit on its cell only after 2^32 − 1 more takes of that cell here,
    /// or by chance (one in 2^32 per take) against a tag chosen otherwise
    /// (by an [`into_raw`](Permit::into_raw) caller, or an earlier binding
    /// of this process to the region). No thread-local state is used.
    ///
    /// `None` takes nothing: the scheduler is not a shared root (a child,
    /// an in-process one), it was inherited across `fork`, it is disposed,
    /// or the fast path does not admit at once (no free cell, waiters at or
    /// above `priority`, a cap, a hand-off in progress, …). Then
    /// [`acquire`](Self::acquire) gives the answer (it waits, or fails).
    ///
    /// ```
    /// use shmsched::region::Region;
    /// use shmsched::scheduler::Scheduler;
    /// use shmsched::Priority;
    /// # fn main() -> shmsched::Result<()> {
    /// let sched = Scheduler::shared(&Region::anonymous()?, 1)?;
    /// let raw = sched.acquire_raw_fast(Priority::Normal).expect("a free cell");
    /// assert!(sched.acquire_raw_fast(Priority::Normal).is_none(), "full");
    /// sched.release_raw(raw)?;
    /// assert!(sched.release_raw(raw).is_err(), "released once");
    /// let again = sched.acquire_raw_fast(Priority::Normal).expect("free again");
    /// assert_ne!(again.tag(), raw.tag(), "the cell's next tag");
    /// sched.release_raw(again)?;
    /// # Ok(()) }
    /// ```
    #[inline(always)]
    pub fn acquire_raw_fast(&self, priority: Priority) -> Option<RawPermit> {
        let (root, slots) = self.node.shared_fast_one::<false>(priority)?;
        self.raw_of_one(root, slots, priority)
    }

    /// [`acquire_raw_fast`](Self::acquire_raw_fast)'s first look: one cell,
    /// at this process's hint, when the region's gate shows no waiter above
    /// `priority`, no hand-off and no lease, and `priority` has no cap
    /// below the max, in code that calls nothing out of line. `None` takes nothing, and
    /// also where `acquire_raw_fast` would look further (then ask it).
    ///
    /// For a caller that counts instructions (the C face): whatever of its
    /// own is live across a call the library makes costs it saved
    /// registers, stores that the take's locked instruction waits for.
    ///
    /// ```
    /// use shmsched::region::Region;
    /// use shmsched::scheduler::Scheduler;
    /// use shmsched::Priority;
    /// # fn main() -> shmsched::Result<()> {
    /// let sched = Scheduler::shared(&Region::anonymous()?, 2)?;
    /// let raw = sched.acquire_raw_first_look(Priority::Normal).expect("the hint's cell");
    /// // The hint's cell is taken now: the first look declines, the fast
    /// // path scans.
    /// assert!(sched.acquire_raw_first_look(Priority::Normal).is_none());
    /// let other = sched.acquire_raw_fast(Priority::Normal).expect("the other cell");
    /// sched.release_raw(raw)?;
    /// sched.release_raw(other)?;
    /// # Ok(()) }
    /// ```
    #[inline(always)]
    pub fn acquire_raw_first_look(&self, priority: Priority) -> Option<RawPermit> {
        let (root, slots) = self.node.shared_fast_one::<true>(priority)?;
        self.raw_of_one(root, slots, priority)
    }

    /// The raw permit of `slots`, one cell just taken from `root`, tagged
    /// with the cell's next tag.
    #[inline(always)]
    fn raw_of_one(&self, root: &SharedRoot, slots: Slots, priority: Priority) -> Option<RawPermit> {
        if let waiter::SlotsView::One(c) = slots.view() {
            let raw = tag_one(root, c, root.slots().next_tag(c));
            // A one-cell Slots owns no memory: nothing to drop.
            std::mem::forget(slots);
            return Some(raw);
        }
        // Never (a one-unit take is one cell); given back as a permit would.
        drop(self.permit(slots, priority));
        None
    }

    /// [`release_raw`](Self::release_raw) but for what calls out of line,
    /// for a caller that counts instructions (the C face: whatever of its
    /// own is live across a call the library makes costs it saved
    /// registers, stores the give-back's locked instruction waits for).
    /// Above a lowered ceiling, on a scheduler that is not a shared root
    /// or in a forked child it does nothing ([`RawRelease::Declined`]:
    /// `release_raw` gives the answer); otherwise the give-back CAS is the
    /// check, as for `release_raw` ([`RawRelease::NotHeld`] when the cell
    /// does not hold this raw permit), and when the freed cell must serve
    /// the queue, that is left to the [`Serve`] it hands back, which does
    /// it when dropped.
    ///
    /// ```
    /// use shmsched::region::Region;
    /// use shmsched::scheduler::{RawRelease, Scheduler};
    /// use shmsched::Priority;
    /// # fn main() -> shmsched::Result<()> {
    /// let sched = Scheduler::shared(&Region::anonymous()?, 1)?;
    /// let raw = sched.acquire_raw_fast(Priority::Normal).expect("a free cell");
    /// assert!(matches!(sched.release_raw_first_look(raw), RawRelease::Released));
    /// assert!(matches!(sched.release_raw_first_look(raw), RawRelease::NotHeld));
    /// assert_eq!(sched.global_running(), 0);
    /// # Ok(()) }
    /// ```
    #[inline(always)]
    pub fn release_raw_first_look(&self, raw: RawPermit) -> RawRelease<'_> {
        let node = &self.node;
        // A shared level is always a root (see `Level::Shared`).
        let Level::Shared(root) = node.level() else {
            return RawRelease::Declined;
        };
        if node.forked() {
            return RawRelease::Declined;
        }
        root.release_raw_first_look(raw.cell, raw.tag.get())
    }

    /// How many raw permits ([`Permit::into_raw`]) this process holds in
    /// this scheduler's region now, through any handle (0 for a scheduler
    /// that is not a shared root). O(max): it reads every cell.
    pub fn raw_permits_held(&self) -> u32 {
        match self.node.level() {
            Level::Shared(root) => root.slots().raw_held(),
            _ => 0,
        }
    }

    /// This handle's binding of its region as a [`RawReleaser`]: what
    /// releasing its raw permits needs, kept past the handle (and shared
    /// by every handle of this process on the same binding). `None` for a
    /// scheduler that is not a shared root (a child, an in-process one) or
    /// that was inherited across `fork`.
    pub fn raw_releaser(&self) -> Option<RawReleaser> {
        match self.node.level() {
            Level::Shared(root) if !self.node.forked() => Some(RawReleaser { root: root.clone() }),
            _ => None,
        }
    }

    /// An in-process scheduler.
    pub fn new(concurrency: impl Into<Concurrency>) -> Result<Scheduler> {
        Scheduler::with_seed(concurrency, default_seed())
    }

    /// An in-process scheduler whose lottery is seeded, so that a test can
    /// replay its decisions.
    pub fn with_seed(concurrency: impl Into<Concurrency>, seed: u64) -> Result<Scheduler> {
        let c = concurrency.into();
        let caps = c.resolve()?;
        Ok(Scheduler {
            node: Arc::new(Node::local(caps, c.overall(), None, seed)),
        })
    }

    /// A scheduler shared through `region`: the region's max is the global
    /// ceiling across every process; `concurrency`'s per-priority caps apply
    /// to this handle's tasks and compare against the global running count.
    ///
    /// A new region is initialised with `concurrency`'s max (required, at
    /// most [`MAX_SHARED_SLOTS`]); an existing one must have the same max
    /// (else [`Error::Mismatch`]). Use [`attach`](Self::attach) to join
    /// whatever max a region has.
    ///
    /// ```no_run
    /// use shmsched::region::Region;
    /// use shmsched::scheduler::{Concurrency, Scheduler};
    /// use shmsched::Priority;
    /// # fn main() -> shmsched::Result<()> {
    /// let region = Region::open_or_create("pool")?;
    /// let sched = Scheduler::shared(&region, Concurrency::max(8).low(2))?;
    /// sched.run(Priority::High, || { /* at most 8 at once, across processes */ })?;
    /// # Ok(()) }
    /// ```
    pub fn shared(region: &Region, concurrency: impl Into<Concurrency>) -> Result<Scheduler> {
        let c = concurrency.into();
        let Some(max) = c.overall() else {
            return Err(Error::InvalidArgument(format!(
                "a shared scheduler needs a finite max (0..={MAX_SHARED_SLOTS}); \
                 use Scheduler::attach to join an existing region"
            )));
        };
        c.validate()?;
        let root = SharedRoot::bind(region, Some(max))?;
        Scheduler::from_root(root, c)
    }

    /// Joins the scheduler already initialised in `region`, whatever its max.
    pub fn attach(region: &Region) -> Result<Scheduler> {
        let root = SharedRoot::bind(region, None)?;
        Scheduler::from_root(root, Concurrency::unlimited())
    }

    fn from_root(root: Arc<SharedRoot>, c: Concurrency) -> Result<Scheduler> {
        let caps = c.with_max(Some(root.slots().max())).resolve()?;
        let seed = default_seed() ^ u64::from(root.slots().owner());
        Ok(Scheduler {
            node: Arc::new(Node::shared(root, caps, seed)),
        })
    }

    fn root(&self) -> &Node {
        let mut root = &*self.node;
        while let Some(p) = root.parent() {
            root = p;
        }
        root
    }

    /// Returns now every slot held by dead processes sharing this
    /// scheduler's region (waiters also do this by themselves, at a bounded
    /// rate, when they find the budget full). Returns (processes reaped,
    /// slots reclaimed). In-process schedulers have nothing to reap.
    pub fn reap(&self) -> Result<(u32, u64)> {
        match self.root().level() {
            Level::Shared(r) => {
                if r.forked() {
                    return Err(Error::Forked(
                        "reap through a handle of the parent process; attach anew in the child"
                            .into(),
                    ));
                }
                let n = r.slots().reap()?;
                r.serve_now(false);
                Ok(n)
            }
            Level::Local(_) => Ok((0, 0)),
        }
    }

    /// Moves the effective ceiling of a shared scheduler to `target` (at
    /// most the region's max), for every process: at most `target` slots are
    /// held at once from now on. Lowering it revokes nothing: holders keep
    /// their slots, and releases go to the ceiling until it is reached
    /// (returns whether it is reached now). Raising it serves waiters at
    /// once. The fast path is unchanged (cells above the ceiling are taken
    /// out of service). For an in-process scheduler this is an error
    /// (create it with the max you want).
    ///
    /// ```
    /// use shmsched::region::Region;
    /// use shmsched::scheduler::Scheduler;
    /// use shmsched::Priority;
    /// # fn main() -> shmsched::Result<()> {
    /// let region = Region::anonymous()?;
    /// let sched = Scheduler::shared(&region, 8)?;
    /// assert!(sched.set_ceiling(2)?);
    /// let _a = sched.acquire(Priority::Normal)?;
    /// let _b = sched.acquire(Priority::Normal)?;
    /// assert!(sched.try_acquire(Priority::Normal).is_none());
    /// assert_eq!(sched.ceiling(), 2);
    /// # Ok(()) }
    /// ```
    pub fn set_ceiling(&self, target: u32) -> Result<bool> {
        match self.root().level() {
            Level::Shared(r) if !r.forked() => r.set_ceiling(target),
            Level::Shared(_) => Err(Error::Forked(
                "set_ceiling through a handle of the parent process; attach anew in the child"
                    .into(),
            )),
            Level::Local(_) => Err(Error::InvalidArgument(
                "set_ceiling needs a scheduler shared through a region".into(),
            )),
        }
    }

    /// Ends a cluster lease's hold on the region and, with `restore`,
    /// moves the ceiling there, atomically against every process's lapse
    /// (for the cluster module): whether the ceiling is reached, or `None`
    /// if this is not a shared root of this process (nothing to end).
    pub(crate) fn end_lease(&self, restore: Option<u32>) -> Option<bool> {
        match self.root().level() {
            Level::Shared(r) if !r.forked() => Some(r.end_lease(restore)),
            _ => None,
        }
    }

    /// The wait registry of the region this scheduler's root is shared
    /// through (for crate modules that work on the region: the cluster
    /// agent).
    #[allow(dead_code)]
    pub(crate) fn shared_registry(&self) -> Option<&crate::region::registry::Registry> {
        match self.root().level() {
            Level::Shared(r) if !r.forked() => Some(r.slots().reg()),
            _ => None,
        }
    }

    /// The effective ceiling: the region's for a shared scheduler (see
    /// [`set_ceiling`](Self::set_ceiling)), else this level's max (`u32::MAX`
    /// when unlimited).
    pub fn ceiling(&self) -> u32 {
        match self.root().level() {
            Level::Shared(r) => r.slots().ceiling(),
            Level::Local(_) => self.root().max(),
        }
    }

    /// Reseeds the lottery so that a test can replay its decisions, or
    /// switches it off (`enabled: false`: strict priority within caps;
    /// starvation is then possible). For a shared root this is the region's
    /// lottery: it applies to every process.
    pub fn set_lottery(&self, seed: Option<u64>, enabled: bool) {
        self.node.set_lottery(seed, enabled);
    }

    /// Blocks until a slot is free at `priority`.
    ///
    /// Errors: [`Error::Disposed`] if the scheduler is (or becomes) disposed,
    /// [`Error::ZeroConcurrency`] at once if nothing can ever be admitted,
    /// [`Error::Forked`] in a forked child.
    #[inline(always)]
    pub fn acquire(&self, priority: Priority) -> Result<Permit<'_>> {
        if let Some(slots) = self.node.fast_root(priority) {
            return Ok(self.permit(slots, priority));
        }
        self.acquire_slow(priority)
    }

    #[inline(never)]
    fn acquire_slow(&self, priority: Priority) -> Result<Permit<'_>> {
        if self.node.parent().is_some() {
            if let Some(slots) = self.fast_chain(priority, 1) {
                return Ok(self.permit(slots, priority));
            }
        }
        self.acquire_chain(priority, 1, None)
    }

    /// Every level's fast path, leaf to root, without a lock or an
    /// allocation; on the first refusal the levels taken are given back and
    /// `None` sends the caller to the slow path.
    ///
    /// The levels below the root are in-process counters (a child is never
    /// shared), taken by a loop that calls nothing; only the root's take
    /// yields slots.
    #[inline(always)]
    fn fast_chain(&self, priority: Priority, n: u32) -> Option<Slots> {
        let mut node = &*self.node;
        let mut taken = 0usize;
        while let Some(parent) = node.parent() {
            if node.forked() || !node.take_uncontended(priority, n) {
                return self.undo_levels(taken, n);
            }
            taken += 1;
            node = parent;
        }
        if node.forked() {
            return self.undo_levels(taken, n);
        }
        match node.local_fast(priority, n) {
            Ok(Some(slots)) => Some(slots),
            Ok(None) => self.undo_levels(taken, n),
            Err(()) => self.fast_shared_root(node, taken, priority, n),
        }
    }

    /// The root's take of [`fast_chain`](Self::fast_chain) when the root is
    /// shared.
    #[inline(never)]
    fn fast_shared_root(
        &self,
        root: &Node,
        taken: usize,
        priority: Priority,
        n: u32,
    ) -> Option<Slots> {
        let got = root.fast(priority, n);
        if got.is_none() {
            self.undo_levels(taken, n);
        }
        got
    }

    /// Gives back the `taken` levels (leaf first) of a chain whose fast
    /// path was refused further up; always `None`.
    #[cold]
    #[inline(never)]
    fn undo_levels(&self, taken: usize, n: u32) -> Option<Slots> {
        let mut node = &*self.node;
        for _ in 0..taken {
            node.release_level(&Slots::counted(n));
            node = node.parent().expect("a taken level has a parent");
        }
        None
    }

    /// Like [`acquire`](Self::acquire), giving up with [`Error::Timeout`]
    /// after `timeout` (any `Duration`; one too long to represent waits
    /// forever). A timed-out wait leaves no count behind.
    pub fn acquire_timeout(&self, priority: Priority, timeout: Duration) -> Result<Permit<'_>> {
        self.acquire_chain(priority, 1, deadline_after(timeout))
    }

    /// A weighted acquire: blocks until `n` units of the budget are free at
    /// `priority`, and takes them all at once (never some of them; two
    /// weighted waiters cannot deadlock). `n` must be 1..=max, and at most
    /// `priority`'s cap when that cap is below the max (else
    /// [`Error::InvalidArgument`] naming both): more than the cap could only
    /// come in through a lottery pick, which bypasses caps.
    pub fn acquire_many(&self, priority: Priority, n: u32) -> Result<Permit<'_>> {
        self.check_n(priority, n)?;
        self.acquire_chain(priority, n, None)
    }

    /// Like [`acquire_many`](Self::acquire_many), giving up after `timeout`.
    pub fn acquire_many_timeout(
        &self,
        priority: Priority,
        n: u32,
        timeout: Duration,
    ) -> Result<Permit<'_>> {
        self.check_n(priority, n)?;
        self.acquire_chain(priority, n, deadline_after(timeout))
    }

    /// Takes `n` units only if they are free at `priority` now and nothing
    /// waits at that priority or above; never queues.
    pub fn try_acquire_many(&self, priority: Priority, n: u32) -> Option<Permit<'_>> {
        if n == 0 {
            return None;
        }
        self.try_chain(priority, n)
    }

    fn check_n(&self, priority: Priority, n: u32) -> Result<()> {
        if n == 0 {
            return Err(Error::InvalidArgument(
                "acquire of 0 slots: n must be at least 1".into(),
            ));
        }
        self.node.check_weight(priority, n)
    }

    /// Like [`acquire`](Self::acquire), but the permit owns a handle to the
    /// scheduler (`Send + 'static`): it can move into another thread or task.
    pub fn acquire_owned(&self, priority: Priority) -> Result<OwnedPermit> {
        self.acquire(priority).map(Permit::into_owned)
    }

    /// Like [`acquire_timeout`](Self::acquire_timeout), returning an
    /// [`OwnedPermit`].
    pub fn acquire_owned_timeout(
        &self,
        priority: Priority,
        timeout: Duration,
    ) -> Result<OwnedPermit> {
        self.acquire_timeout(priority, timeout)
            .map(Permit::into_owned)
    }

    /// Like [`try_acquire`](Self::try_acquire), returning an [`OwnedPermit`].
    pub fn try_acquire_owned(&self, priority: Priority) -> Option<OwnedPermit> {
        self.try_acquire(priority).map(Permit::into_owned)
    }

    /// Takes a slot only if one is free at `priority` now and nothing waits
    /// at that priority or above (in any process, for a shared root: dead
    /// waiters are reaped first); never queues.
    #[inline(always)]
    pub fn try_acquire(&self, priority: Priority) -> Option<Permit<'_>> {
        if let Some(s) = self.node.fast_root(priority) {
            return Some(self.permit(s, priority));
        }
        self.try_slow(priority)
    }

    #[inline(never)]
    fn try_slow(&self, priority: Priority) -> Option<Permit<'_>> {
        let leaf = &*self.node;
        if let (Level::Local(_), None) = (leaf.level(), leaf.parent()) {
            return None; // the fast path was the whole answer
        }
        self.try_chain(priority, 1)
    }

    #[inline]
    fn permit(&self, slots: Slots, priority: Priority) -> Permit<'_> {
        Permit {
            sched: self,
            slots: slots.at(priority),
        }
    }

    fn try_chain(&self, priority: Priority, n: u32) -> Option<Permit<'_>> {
        let mut taken: Vec<&Node> = Vec::new();
        let mut cur = Some(&*self.node);
        while let Some(node) = cur {
            match node.try_level(priority, n) {
                Some(slots) => {
                    if node.parent().is_none() {
                        return Some(self.permit(slots, priority));
                    }
                    taken.push(node);
                    cur = node.parent().map(|p| &**p);
                }
                None => break,
            }
        }
        for node in taken.iter().rev() {
            node.release_level(&Slots::counted(n));
        }
        None
    }

    #[inline(never)]
    fn acquire_chain(
        &self,
        priority: Priority,
        n: u32,
        deadline: Option<Instant>,
    ) -> Result<Permit<'_>> {
        if self.node.parent().is_none() {
            // A root alone: no chain to walk (nor to allocate).
            let slots = self
                .node
                .acquire_level(priority, n, deadline, Default::default())?;
            return Ok(self.permit(slots, priority));
        }
        // Check every level first: a zero max or a disposed ancestor fails
        // at once rather than after queueing below it.
        let mut chain: Vec<&Node> = Vec::new();
        let mut cur = Some(&*self.node);
        while let Some(node) = cur {
            node.check_usable(n)?;
            chain.push(node);
            cur = node.parent().map(|p| &**p);
        }
        let mut via = crate::few::Few::default();
        for (i, node) in chain.iter().enumerate() {
            match node.acquire_level(priority, n, deadline, via.clone()) {
                Ok(slots) if i == chain.len() - 1 => {
                    return Ok(self.permit(slots, priority));
                }
                Ok(_) => via.push(node.id()),
                Err(e) => {
                    for taken in chain[..i].iter().rev() {
                        taken.release_level(&Slots::counted(n));
                    }
                    return Err(e);
                }
            }
        }
        unreachable!("the chain ends at a root")
    }

    /// An async acquire that works with any executor (no runtime
    /// dependency). Dropping the future before it completes removes its
    /// queued place and leaves no count behind; use your runtime's timeout
    /// to bound the wait. `.await?.into_owned()` gives a `'static` permit.
    ///
    /// ```
    /// # use shmsched::scheduler::Scheduler;
    /// # use shmsched::Priority;
    /// # async fn demo(sched: Scheduler) -> shmsched::Result<()> {
    /// let permit = sched.acquire_async(Priority::High).await?;
    /// drop(permit);
    /// # Ok(()) }
    /// ```
    pub fn acquire_async(&self, priority: Priority) -> Acquire<'_> {
        Acquire::new(self, priority, 1)
    }

    /// The async form of [`acquire_many`](Self::acquire_many).
    pub fn acquire_many_async(&self, priority: Priority, n: u32) -> Acquire<'_> {
        Acquire::new(self, priority, n)
    }

    /// [`acquire_async`](Self::acquire_async) for a task that must own its
    /// permit (`'static`, e.g. to move it into a spawned task): the
    /// handle is moved into the future and from there into the permit,
    /// so a clone made for it is the only one (`.await?.into_owned()`
    /// on a borrowed acquire clones the handle once more). The same
    /// order, cancellation and errors as `acquire_async`.
    ///
    /// ```
    /// # use shmsched::scheduler::Scheduler;
    /// # use shmsched::Priority;
    /// # async fn demo(sched: Scheduler) -> shmsched::Result<()> {
    /// let permit = sched.clone().acquire_owned_async(Priority::Normal).await?;
    /// let work = async move {
    ///     // ... the work, holding the slot ...
    ///     drop(permit);
    /// };
    /// # work.await; Ok(()) }
    /// ```
    pub fn acquire_owned_async(self, priority: Priority) -> AcquireOwned {
        AcquireOwned::new(self, priority, 1)
    }

    /// The owned form of [`acquire_many_async`](Self::acquire_many_async)
    /// (see [`acquire_owned_async`](Self::acquire_owned_async)).
    pub fn acquire_many_owned_async(self, priority: Priority, n: u32) -> AcquireOwned {
        AcquireOwned::new(self, priority, n)
    }

    /// Acquires at `priority`, runs `f`, releases (also if `f` panics).
    pub fn run<T>(&self, priority: Priority, f: impl FnOnce() -> T) -> Result<T> {
        let _permit = self.acquire(priority)?;
        Ok(f())
    }

    /// A child scheduler: an extra local cap on top of this one. A task
    /// through the child runs only when both admit it; the tightest cap in
    /// the chain wins. Children nest. `Concurrency::unlimited()` adds no
    /// local cap.
    pub fn child(&self, concurrency: impl Into<Concurrency>) -> Result<Scheduler> {
        self.node.check_usable(1).or_else(|e| match e {
            Error::ZeroConcurrency => Ok(()),
            e => Err(e),
        })?;
        let c = concurrency.into();
        let caps = c.resolve()?;
        let node = Arc::new(Node::local(
            caps,
            c.overall(),
            Some(self.node.clone()),
            default_seed() ^ self.node.id(),
        ));
        self.node.add_child(&node)?;
        Ok(Scheduler { node })
    }

    /// Disposes this scheduler and its children: queued waiters get
    /// [`Error::Disposed`], later calls fail at once. Permits still held
    /// keep their slots until they drop, so the cap is never exceeded; a
    /// child's slots then go back to its parent. Disposing a handle on a
    /// shared region affects this handle only, not other processes.
    pub fn dispose(&self) {
        self.node.dispose();
    }

    /// True once disposed (directly or through a parent).
    pub fn is_disposed(&self) -> bool {
        let mut cur = Some(&self.node);
        while let Some(n) = cur {
            if n.is_disposed() {
                return true;
            }
            cur = n.parent();
        }
        false
    }

    /// The overall ceiling of this level (`None` when unlimited).
    pub fn concurrency(&self) -> Option<u32> {
        match self.node.max() {
            u32::MAX => None,
            m => Some(m),
        }
    }

    /// Units held right now across everyone sharing this scheduler's root
    /// (all processes, for a region; counted from the slot table there).
    pub fn global_running(&self) -> u32 {
        let root = self.root();
        match root.level() {
            Level::Shared(r) => r.slots().occupied(),
            Level::Local(_) => root.running().min(u64::from(u32::MAX)) as u32,
        }
    }

    /// A snapshot of gauges and counters.
    pub fn stats(&self) -> SchedulerStats {
        self.node.stats()
    }
}
