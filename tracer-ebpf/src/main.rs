//! gputrace's kernel side. One module per program family; maps shared between families live in
//! `maps`. Everything here must pass the verifier of a 5.15+ kernel: bounded loops, no recursion.
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
