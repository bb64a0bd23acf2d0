//! region (in progress)
