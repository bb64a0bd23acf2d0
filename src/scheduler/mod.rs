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
mod pool;
mod shared;
mod stats;
mod view;
mod waiter;

use std::sync::Arc;
use std::time::{Duration, Instant};

pub use caps::{Concurrency, MAX_CONCURRENCY};
pub use future::Acquire;
pub use lottery::LOTTERY_ODDS;
pub use stats::{QueueStats, SchedulerStats, SharedStats};

use crate::error::{Error, Result};
use crate::priority::Priority;
use crate::region::Region;
use node::{Node, Pool};
use pool::LocalSlots;
use shared::SharedSlots;
pub use shared::{MAX_SHARED_SLOTS, REAP_INTERVAL_MS};

/// A handle to a scheduler. Clones share the same scheduler; disposing one
/// disposes it for all.
#[derive(Debug, Clone)]
pub struct Scheduler {
    node: Arc<Node>,
}

/// The right to run one task. Releases its slot exactly once, on drop.
///
/// A permit inherited by a forked child belongs to the parent: dropping it
/// in the child does nothing.
#[must_use = "dropping a permit releases its slot at once"]
#[derive(Debug)]
pub struct Permit<'a> {
    sched: &'a Scheduler,
    ticket: u32,
    priority: Priority,
}

impl Permit<'_> {
    /// The priority this permit was acquired at.
    pub fn priority(&self) -> Priority {
        self.priority
    }
}

impl Drop for Permit<'_> {
    fn drop(&mut self) {
        let leaf = &self.sched.node;
        if leaf.forked() {
            return;
        }
        release_chain(leaf, self.ticket);
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
    ticket: u32,
    priority: Priority,
}

impl OwnedPermit {
    /// The priority this permit was acquired at.
    pub fn priority(&self) -> Priority {
        self.priority
    }

    /// The scheduler this permit belongs to.
    pub fn scheduler(&self) -> &Scheduler {
        &self.sched
    }
}

impl Drop for OwnedPermit {
    fn drop(&mut self) {
        let leaf = &self.sched.node;
        if leaf.forked() {
            return;
        }
        release_chain(leaf, self.ticket);
    }
}

impl Permit<'_> {
    /// Turns a borrowed permit into an owned one (the slot stays held).
    pub fn into_owned(self) -> OwnedPermit {
        let owned = OwnedPermit {
            sched: self.sched.clone(),
            ticket: self.ticket,
            priority: self.priority,
        };
        std::mem::forget(self);
        owned
    }
}

fn default_seed() -> u64 {
    let t = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64);
    t ^ (u64::from(std::process::id()) << 32)
}

/// Releases every level of the chain, root first (the global slot goes back
/// soonest).
fn release_chain(node: &Node, root_ticket: u32) {
    match node.parent() {
        None => node.release_level(root_ticket),
        Some(parent) => {
            release_chain(parent, root_ticket);
            node.release_level(0);
        }
    }
}

impl Scheduler {
    /// An in-process scheduler.
    pub fn new(concurrency: impl Into<Concurrency>) -> Result<Scheduler> {
        Scheduler::with_seed(concurrency, default_seed())
    }

    /// An in-process scheduler whose lottery is seeded, so that a test can
    /// replay its decisions.
    pub fn with_seed(concurrency: impl Into<Concurrency>, seed: u64) -> Result<Scheduler> {
        let c = concurrency.into();
        let caps = c.resolve()?;
        let node = Node::new(
            caps,
            c.overall(),
            Pool::Local(LocalSlots::new()),
            None,
            seed,
        );
        Ok(Scheduler {
            node: Arc::new(node),
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
        let slots = SharedSlots::bind(region, Some(max))?;
        Scheduler::from_slots(slots, c)
    }

    /// Joins the scheduler already initialised in `region`, whatever its max.
    pub fn attach(region: &Region) -> Result<Scheduler> {
        let slots = SharedSlots::bind(region, None)?;
        Scheduler::from_slots(slots, Concurrency::unlimited())
    }

    fn from_slots(slots: SharedSlots, c: Concurrency) -> Result<Scheduler> {
        let caps = c.with_max(Some(slots.max())).resolve()?;
        let seed = default_seed() ^ u64::from(slots.owner());
        let node = Node::new(caps, None, Pool::Shared(Box::new(slots)), None, seed);
        Ok(Scheduler {
            node: Arc::new(node),
        })
    }

    /// Returns now every slot held by dead processes sharing this
    /// scheduler's region (waiters also do this by themselves, at a bounded
    /// rate, when they find the budget full). Returns (processes reaped,
    /// slots reclaimed). In-process schedulers have nothing to reap.
    pub fn reap(&self) -> Result<(u32, u64)> {
        let mut root = &self.node;
        while let Some(p) = root.parent() {
            root = p;
        }
        match root.pool() {
            Pool::Shared(s) => s.reap(),
            Pool::Local(_) => Ok((0, 0)),
        }
    }

    /// Reseeds this level's lottery so that a test can replay its
    /// decisions. `enabled: false` switches the lottery off (strict priority
    /// within caps; starvation is then possible).
    pub fn set_lottery(&self, seed: Option<u64>, enabled: bool) {
        self.node.set_lottery(seed, enabled);
    }

    /// Blocks until a slot is free at `priority`.
    ///
    /// Errors: [`Error::Disposed`] if the scheduler is (or becomes) disposed,
    /// [`Error::ZeroConcurrency`] at once if nothing can ever be admitted.
    pub fn acquire(&self, priority: Priority) -> Result<Permit<'_>> {
        self.acquire_until(priority, None)
    }

    /// Like [`acquire`](Self::acquire), giving up with [`Error::Timeout`]
    /// after `timeout`. A timed-out wait leaves no count behind.
    pub fn acquire_timeout(&self, priority: Priority, timeout: Duration) -> Result<Permit<'_>> {
        self.acquire_until(priority, Some(Instant::now() + timeout))
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

    /// Takes a slot only if one is free at `priority` now and nothing is
    /// queued at that priority; never queues.
    pub fn try_acquire(&self, priority: Priority) -> Option<Permit<'_>> {
        let leaf = &self.node;
        if leaf.check_usable().is_err() {
            return None;
        }
        // Fast path for a root: one CAS.
        if leaf.parent().is_none() {
            let ticket = leaf.try_level(priority)?;
            return Some(Permit {
                sched: self,
                ticket,
                priority,
            });
        }
        let mut taken: Vec<&Node> = Vec::new();
        let mut cur = Some(&**leaf);
        while let Some(node) = cur {
            if node.check_usable().is_err() {
                break;
            }
            match node.try_level(priority) {
                Some(ticket) => {
                    if node.parent().is_none() {
                        return Some(Permit {
                            sched: self,
                            ticket,
                            priority,
                        });
                    }
                    taken.push(node);
                    cur = node.parent().map(|p| &**p);
                }
                None => break,
            }
        }
        for node in taken.iter().rev() {
            node.release_level(0);
        }
        None
    }

    fn acquire_until(&self, priority: Priority, deadline: Option<Instant>) -> Result<Permit<'_>> {
        let leaf = &self.node;
        if leaf.parent().is_none() {
            let ticket = leaf.acquire_level(priority, deadline, Vec::new())?;
            return Ok(Permit {
                sched: self,
                ticket,
                priority,
            });
        }
        // Check every level first: a zero max or a disposed ancestor fails
        // at once rather than after queueing below it.
        let mut chain: Vec<&Node> = Vec::new();
        let mut cur = Some(&**leaf);
        while let Some(node) = cur {
            node.check_usable()?;
            chain.push(node);
            cur = node.parent().map(|p| &**p);
        }
        let mut via = Vec::new();
        for (i, node) in chain.iter().enumerate() {
            match node.acquire_level(priority, deadline, via.clone()) {
                Ok(ticket) if i == chain.len() - 1 => {
                    return Ok(Permit {
                        sched: self,
                        ticket,
                        priority,
                    });
                }
                Ok(_) => via.push(node.id()),
                Err(e) => {
                    for taken in chain[..i].iter().rev() {
                        taken.release_level(0);
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
    /// to bound the wait.
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
        Acquire::new(self, priority)
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
        self.node.check_usable().or_else(|e| match e {
            Error::ZeroConcurrency => Ok(()),
            e => Err(e),
        })?;
        let c = concurrency.into();
        let caps = c.resolve()?;
        let node = Arc::new(Node::new(
            caps,
            c.overall(),
            Pool::Local(LocalSlots::new()),
            Some(self.node.clone()),
            default_seed() ^ self.node.id(),
        ));
        self.node.add_child(&node)?;
        Ok(Scheduler { node })
    }

    /// Disposes this scheduler and its children: queued waiters get
    /// [`Error::Disposed`], later calls fail at once. Permits still held
    /// keep their slots until they drop, so the cap is never exceeded; a
    /// child's slots then go back to its parent.
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

    /// Slots held right now across everyone sharing this scheduler's root
    /// (all processes, for a region). Cheap: no syscall, no allocation.
    pub fn global_running(&self) -> u32 {
        let mut root = &self.node;
        while let Some(p) = root.parent() {
            root = p;
        }
        root.pool_running()
    }

    /// A snapshot of gauges and counters.
    pub fn stats(&self) -> SchedulerStats {
        self.node.stats()
    }
}
