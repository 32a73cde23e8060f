//! Locking helpers shared by both transports.

use std::sync::{Mutex, MutexGuard, PoisonError};

/// Locks `m`, using the data of a poisoned lock as is.
///
/// Every critical section in this crate leaves its data consistent between statements that can
/// panic, so a lock poisoned by a panicking thread still guards valid data, and a transport
/// keeps working for the threads that are left.
pub(crate) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}
