//! sys (placeholder in main until the region branch lands)
pub mod fork;
pub mod futex;
