//! The poison-tolerant lock the crate's mutexes are taken with.

use std::sync::{Mutex, MutexGuard};

/// Locks `m`, taking the data of a lock a panicking thread poisoned: every critical section
/// of the crate leaves its data consistent between statements.
pub(crate) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}
