//! gputrace's kernel side. One module per program family; maps shared between families live in
//! `maps`. Everything here must pass the verifier of a 5.15+ kernel: bounded loops, no recursion.
//!
//! Functions declared `pub extern "C" fn gputrace_*` (with `#[no_mangle]`, `#[inline(never)]`)
//! are BPF global functions: the verifier walks each once, on its own. An inlined or static
//! function is walked again on every path that reaches it, and the scheduler program's many
//! paths made it 59-87% of the verifier's limit and ~1 s of every attach; with the Python walk
//! and the rare thread bookkeeping (`account::gputrace_flush`, `_born`, `_died`) global, it is
//! ~10%. A global function gets its arguments as unknown scalars and returns a scalar, so they
//! take ids and times, never pointers, and look their state up again. Exported (`no_mangle`,
//! `extern "C"`), they keep their global linkage through bpf-linker, which a unit test checks
//! (`bpf::tests::the_objects_global_functions_stay_global`).
#![no_std]
#![no_main]
#![allow(internal_features)]
#![feature(core_intrinsics)]

mod account;
mod block;
mod calibrate;
mod cuda;
mod kread;
mod maps;
mod proc;
mod python;
mod sampler;
mod sched;
mod syscalls;
mod timeline;

#[cfg(not(test))]
#[panic_handler]
fn panic(_info: &core::panic::PanicInfo) -> ! {
    loop {}
}
