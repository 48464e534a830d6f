//! Empty programs for the startup calibration (`tracer/src/overhead/calibrate.rs`): attached to
//! a function in gputrace itself, they let it time the trap of a uprobe and a uretprobe hit,
//! which the kernel's BPF statistics do not see.

use aya_ebpf::{
    macros::{uprobe, uretprobe},
    programs::{ProbeContext, RetProbeContext},
};

#[uprobe]
pub fn trap_calib(_ctx: ProbeContext) -> u32 {
    0
}

#[uretprobe]
pub fn trap_calib_ret(_ctx: RetProbeContext) -> u32 {
    0
}
