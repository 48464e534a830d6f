//! How programs read kernel structs, shared by the families that come on both raw and BTF
//! tracepoints: the same body, generic over [`Kernel`], reads through `bpf_probe_read_kernel`
//! ([`Probe`]) on a raw tracepoint, whose arguments are plain numbers, and with plain loads
//! ([`Direct`]) on a BTF tracepoint, whose arguments are typed pointers the verifier checks
//! each field access of. A helper call costs ~30-40 ns on the development VM; a load nothing.

use aya_ebpf::{helpers::bpf_probe_read_kernel, programs::BtfTracePointContext, EbpfContext};

/// `base` is a pointer argument of the tracepoint or a pointer read from one; `off` a field
/// offset from the kernel's BTF (a read-only global, so a constant to the verifier).
pub trait Kernel {
    fn read<T: Copy + Default>(base: u64, off: u32) -> T;
}

/// Through `bpf_probe_read_kernel`; 0s when it cannot.
pub struct Probe;

impl Kernel for Probe {
    #[inline(always)]
    fn read<T: Copy + Default>(base: u64, off: u32) -> T {
        unsafe { bpf_probe_read_kernel((base + off as u64) as *const T) }.unwrap_or_default()
    }
}

/// Plain loads (the verifier turns them into fault-safe ones: a stale pointer reads 0).
pub struct Direct;

impl Kernel for Direct {
    #[inline(always)]
    fn read<T: Copy + Default>(base: u64, off: u32) -> T {
        unsafe { core::ptr::read_volatile((base + off as u64) as *const T) }
    }
}

/// A BTF tracepoint's first argument as a number (a slot's hash, a map key): the verifier
/// allows no arithmetic on the typed pointer itself, which the field reads use.
#[inline(always)]
pub fn arg0_value(ctx: &BtfTracePointContext) -> u64 {
    unsafe { bpf_probe_read_kernel(ctx.as_ptr() as *const u64) }.unwrap_or(0)
}
