//! scheduler (in progress)
