//! What this build reads (`--version`), and how a region made by another
//! version of shmsched is named by `ls` and `stat`: the header's layout
//! version is checked by the library when the header is read; an object
//! area of another revision (same header layout, other object shape) is
//! checked here, before any figure is read from it.

use std::sync::OnceLock;

use shmsched::region::{HeaderInfo, ObjectKind};

/// `shmsched 0.1.0 (region layout version 2; object revisions: …)`.
pub fn version() -> &'static str {
    static V: OnceLock<String> = OnceLock::new();
    V.get_or_init(|| {
        format!(
            "{} (region layout version {}; object revisions: scheduler {}, limiter {}, fair share {})",
            env!("CARGO_PKG_VERSION"),
            shmsched::LAYOUT_VERSION,
            shmsched::object_revision(ObjectKind::Scheduler),
            shmsched::object_revision(ObjectKind::Limiter),
            shmsched::object_revision(ObjectKind::FairShare),
        )
    })
}

/// The sentence naming a region whose object area has another revision
/// than this build's, `None` when it is this build's.
pub fn other_layout(h: &HeaderInfo) -> Option<String> {
    let found = shmsched::region_object_revision(h);
    let mine = shmsched::object_revision(h.kind);
    (found != mine).then(|| {
        format!(
            "a region of another layout: its {} object is revision {found}, and this build \
             (region layout version {}) reads revision {mine}; it was made by another version of \
             shmsched: stop its processes and remove it",
            h.kind.name(),
            shmsched::LAYOUT_VERSION
        )
    })
}
