//! The shared-memory home of the ledger (in progress).
