//! Read-only views of a shared scheduler's region, for tools such as the
//! `shmsched` CLI: which processes are registered and how many slots each
//! holds, and a clean way for a short-lived inspector to leave the process
//! table as it found it.
//!
//! Attaching to a region (even only to read its stats) registers the
//! process in the region's process table. A tool that exits without
//! [`Scheduler::detach`] leaves a dead entry behind, which the next reaper
//! frees (and counts among `reaped_processes`). `detach` frees the entry at
//! once instead, so an inspector leaves no trace.

use std::sync::Arc;

use super::node::Level;
use super::shared::SharedSlots;
use super::Scheduler;
use crate::error::{Error, Result};
use crate::region::ProcSummary;

impl Scheduler {
    /// The shared slot table of this scheduler's root, if it lives in a
    /// region.
    fn shared_root(&self) -> Option<&SharedSlots> {
        match self.root().level() {
            Level::Shared(r) => Some(r.slots()),
            Level::Local(_) => None,
        }
    }

    /// Every non-free entry of the region's process table with the number
    /// of global slots its owner holds right now, in table order. Dead
    /// entries not yet reaped are included (`alive == false`), with the
    /// slots they still hold. Empty for an in-process scheduler.
    ///
    /// Read-only: reaps nothing. Slot counts are read one cell at a time, so
    /// under churn they are a snapshot, not an atomic view.
    pub fn processes(&self) -> Result<Vec<(ProcSummary, u32)>> {
        let Some(s) = self.shared_root() else {
            return Ok(Vec::new());
        };
        let procs = s.mapping().live_processes()?;
        Ok(procs
            .into_iter()
            .map(|p| {
                let held = s.held_by(p.owner);
                (p, held)
            })
            .collect())
    }

    /// This process's owner id in the region's process table (as in
    /// [`ProcSummary::owner`]), `None` for an in-process scheduler.
    pub fn owner_id(&self) -> Option<u32> {
        self.shared_root().map(|s| s.owner())
    }

    /// Leaves the region cleanly: frees this process's process-table entry
    /// now (instead of leaving a dead entry to be reaped after exit) and
    /// drops the handle. For an in-process scheduler this just drops it.
    ///
    /// Refused with [`Error::InvalidArgument`] (and the handle dropped
    /// without deregistering) if anything else in this process still uses
    /// the registration: a clone or a child of this handle, another object
    /// bound through the same [`Region`](crate::region::Region) (a
    /// [`RawReleaser`](super::RawReleaser) of this binding among them), or
    /// a slot this process still holds. A later attach registers afresh.
    pub fn detach(self) -> Result<()> {
        if Arc::strong_count(&self.node) > 1 {
            return Err(Error::InvalidArgument(
                "cannot detach: other handles (clones or children) of this scheduler are alive"
                    .into(),
            ));
        }
        let Level::Shared(root) = self.node.level() else {
            return Ok(());
        };
        if Arc::strong_count(root) > 1 {
            return Err(Error::InvalidArgument(
                "cannot detach: another scheduler handle (or raw releaser) of this process shares \
                 the region"
                    .into(),
            ));
        }
        let s = root.slots();
        if Arc::strong_count(s.mapping()) > 1 {
            return Err(Error::InvalidArgument(
                "cannot detach: another object of this process is bound to the same region".into(),
            ));
        }
        let held = s.held_by(s.owner());
        if held > 0 {
            return Err(Error::InvalidArgument(format!(
                "cannot detach: this process still holds {held} slot(s)"
            )));
        }
        s.reg().leave();
        s.mapping().deregister()
    }
}

#[cfg(shuttle)]
impl Scheduler {
    /// The shared region's raw state, for the model checker's tests
    /// (`--cfg shuttle`); `None` for an in-process scheduler.
    #[doc(hidden)]
    pub fn model_state(&self) -> Option<super::shared::ModelState> {
        self.shared_root().map(SharedSlots::model_state)
    }

    /// The id of the waiter that keeps this process's backstop timer (0:
    /// none; always 0 for an in-process scheduler), for the model
    /// checker's tests.
    #[doc(hidden)]
    pub fn model_keeper(&self) -> u64 {
        match self.root().level() {
            Level::Shared(r) => r.model_keeper(),
            Level::Local(_) => 0,
        }
    }
}
