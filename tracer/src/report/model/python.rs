//! Python-level answers (issue 7): where in the Python code threads waited and made CUDA calls,
//! and who held the GIL while others waited for it.

use serde::{Deserialize, Serialize};

/// Time a thread spent off CPU or inside CUDA calls under one Python line: the innermost Python
/// frame of the stack it was in (the line that made the call or is waiting).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct PySite {
    /// A time category (`lock`, `io`, `gil`, `cuda_sync`, ...).
    pub category: String,
    /// `qualname (file.py:line)`.
    pub frame: String,
    /// The CUDA function called there, for CUDA categories.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub call: Option<String>,
    pub ns: u64,
    /// Share of the thread's traced life.
    pub percent: f64,
}

/// Waits for a process's GIL: who waited, and who held it while they did.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct GilReport {
    pub wait_ns: u64,
    /// Waiting threads, most waiting first.
    pub waiters: Vec<GilThread>,
    /// Holders at the moment each wait began, weighted by the wait, most first; a wait that
    /// began while the GIL was being handed over has no holder (`tid` null).
    pub holders: Vec<GilThread>,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct GilThread {
    pub tid: Option<u32>,
    pub comm: String,
    pub ns: u64,
    /// Share of `wait_ns`.
    pub percent: f64,
}
