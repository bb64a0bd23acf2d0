//! sys (in progress)
