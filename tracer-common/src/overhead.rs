//! Names of the do-nothing programs gputrace probes itself with at startup to measure what one
//! uprobe and one uretprobe hit cost on this machine (the trap outside any program).

pub const CALIB_ENTRY_PROG: &str = "trap_calib";
pub const CALIB_RET_PROG: &str = "trap_calib_ret";
