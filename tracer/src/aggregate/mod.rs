//! Pure aggregation: kernel-side counts, once symbolised, become profiles. No BPF here.

pub mod cpu;
