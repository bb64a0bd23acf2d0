//! sys (in progress)
pub mod robust_mutex;
