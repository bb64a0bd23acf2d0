//! fair (in progress)
