//! Types shared by the eBPF programs (`tracer-ebpf`) and the user-space tracer (`tracer`).
//!
//! Every struct is `#[repr(C)]`, has no implicit padding and no `bool` so that both sides agree on
//! the layout byte for byte. Map names are at most 15 characters (the kernel truncates the rest).
#![no_std]

pub mod cpu;
pub mod cuda;
pub mod drops;
pub mod hits;
pub mod overhead;
pub mod proc;
pub mod python;
pub mod time;
pub mod timeline;
pub mod wall;

/// Implements `aya::Pod` for the user side only.
#[macro_export]
macro_rules! user_pod {
    ($($t:ty),* $(,)?) => {
        $(
            #[cfg(feature = "user")]
            unsafe impl aya::Pod for $t {}
        )*
    };
}
