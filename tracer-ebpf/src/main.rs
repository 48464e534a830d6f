//! gputrace's kernel side. One module per program family; maps shared between families live in
//! `maps`. Everything here must pass the verifier of a 5.17+ kernel (`bpf_loop`): bounded
//! loops, no recursion.
//!
//! Functions declared `#[no_mangle] #[inline(never)] pub extern "C" fn gputrace_*` are BPF
//! global functions: the verifier walks each once, on its own. An inlined or static function
//! is walked again on every path that reaches it, and the scheduler program's many paths made
//! it 59-87% of the verifier's limit and ~1 s of every attach; with the Python walk and the
//! rare thread bookkeeping (`account::gputrace_flush`, `_born`, `_died`) global, it is ~9%.
//! - A global function gets its arguments as unknown scalars and returns a scalar: these take
//!   ids and times, never pointers, and look their state up again.
//! - `no_mangle` keeps them global through bpf-linker.
//! - Before Linux 6.13 the kernel sums the frames along each call chain and refuses a program
//!   past 512 bytes, where inlined code shared one frame: the functions call no other global
//!   function (a caller calls them one after another) and build nothing big on the stack.
//!
//! Unit tests check the embedded object for all of it (`bpf::tests`): each function global
//! and called, and every program's deepest call chain within 512 bytes.
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
