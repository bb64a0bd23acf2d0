//! A region's cluster line read from the outside (`shmsched stat`): the
//! agent and its lease, through a read-only [`RegionView`].

use crate::region::registry::RegistryArea;
use crate::region::{ObjectKind, RegionView};

use super::{ClusterError, Lease, LeaseMode};

/// A region's link to a cluster budget, as its agent last recorded it.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct ClusterView {
    /// The lease words.
    #[serde(flatten)]
    pub lease: Lease,
    /// The lease's mode.
    pub mode: LeaseMode,
    /// The agent's pid, if a process holds the agent lock.
    pub agent_pid: Option<i32>,
    /// Whether that process is alive.
    pub agent_alive: bool,
    /// True if the deadline has passed while the mode still says leased
    /// (the agent is stuck or gone).
    pub expired: bool,
    /// True while a lease ceiling (or rate) is in force: the region holds
    /// the object above its safe level until `in_force_until_unix_ms`.
    pub in_force: bool,
    /// When the region itself lowers the object to its safe level (Unix ms,
    /// from the monotonic deadline word; 0: no lease armed).
    pub in_force_until_unix_ms: u64,
    /// The pid of the agent that armed the lease (the one whose lease it
    /// is; it may be dead).
    pub armed_by_pid: Option<u64>,
    /// The object's own level (ceiling or rate) that a leaving agent, or
    /// `shmsched cluster release`, restores; `None` if none is recorded.
    pub own_level: Option<u64>,
}

impl RegionView {
    /// The region's cluster line, or `None` if no agent ever ran on it
    /// (nor does now). A fair-share region has none.
    pub fn cluster(&self) -> Result<Option<ClusterView>, ClusterError> {
        if self.header().kind == ObjectKind::FairShare {
            return Ok(None);
        }
        let area = self.object_atomics::<RegistryArea>(0)?;
        let owner = area.agent_owner();
        let lease = area.lease().ok_or_else(|| {
            ClusterError::BadRegion("the lease kept changing while it was read".into())
        })?;
        if owner == 0 && lease == Lease::default() && !area.lease_guard().armed {
            return Ok(None);
        }
        let mode = LeaseMode::from_word(lease.mode)?;
        let mut agent_pid = None;
        let mut agent_alive = false;
        if owner != 0 {
            if let Some(p) = self.processes()?.into_iter().find(|p| p.owner == owner) {
                agent_pid = Some(p.pid);
                agent_alive = p.alive;
            }
        }
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_millis() as u64);
        let g = area.lease_guard();
        let mono = crate::sys::clock::monotonic_ns();
        let in_force = g.in_force(mono);
        let until = if g.armed && g.fall_ns != 0 {
            let left_ms = g.fall_ns.saturating_sub(mono) / 1_000_000;
            let past_ms = mono.saturating_sub(g.fall_ns) / 1_000_000;
            (now + left_ms).saturating_sub(past_ms)
        } else {
            0
        };
        // The mode in effect: a lease the region has lowered is lapsed,
        // whatever its (stuck or dead) agent last wrote.
        let mode = if mode.leased() && g.armed && !in_force {
            LeaseMode::Lapsed
        } else {
            mode
        };
        Ok(Some(ClusterView {
            expired: mode.leased() && lease.deadline_unix_ms <= now,
            lease,
            mode,
            agent_pid,
            agent_alive,
            in_force,
            in_force_until_unix_ms: until,
            armed_by_pid: (g.armed_by != 0).then_some(g.armed_by),
            own_level: g.own_level,
        }))
    }
}
