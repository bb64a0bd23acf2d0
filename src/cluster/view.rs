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
        if owner == 0 && lease == Lease::default() {
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
        Ok(Some(ClusterView {
            expired: mode.leased() && lease.deadline_unix_ms <= now,
            lease,
            mode,
            agent_pid,
            agent_alive,
        }))
    }
}
