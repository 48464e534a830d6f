//! What each demo mode's synthetic job does per step: pure numbers, so what makes a mode
//! data-, launch-, transfer- or GPU-bound is written down in one place and unit-tested.

use clap::ValueEnum;

/// What the demo's training job is bound by.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Mode {
    /// Slow data-loader workers (direct disk reads); the trainer waits on their pipe.
    Data,
    /// Thousands of tiny kernel launches per step; the CPU cost of launching dominates.
    Launch,
    /// Big pageable host-to-device cudaMemcpy every step.
    Transfer,
    /// Long kernels; the trainer waits in cudaStreamSynchronize.
    Gpu,
}

impl Mode {
    pub fn name(self) -> &'static str {
        match self {
            Mode::Data => "data",
            Mode::Launch => "launch",
            Mode::Transfer => "transfer",
            Mode::Gpu => "gpu",
        }
    }

    /// The verdict rule (docs/verdicts.md) this mode is built to trigger first.
    pub fn expected_rule(self) -> &'static str {
        match self {
            Mode::Data => "data-loading-bound",
            Mode::Launch => "launch-bound",
            Mode::Transfer => "transfer-bound",
            Mode::Gpu => "gpu-bound",
        }
    }

    pub fn profile(self) -> Profile {
        const KIB: u64 = 1024;
        const MIB: u64 = 1024 * KIB;
        // Simulated kernel time is 2 us + 0.5 ns per thread (assets/fake_cudart.c).
        match self {
            // Each worker reads 8 MiB per batch in 32 KiB O_DIRECT reads (~20-40 ms on a
            // virtio disk, still > 5 ms on a fast NVMe); the trainer needs ~1.5 ms per step.
            Mode::Data => Profile {
                workers: 2,
                read_per_batch: 8 * MIB,
                read_chunk: 32 * KIB,
                direct_io: true,
                batch_bytes: 256 * KIB,
                h2d_bytes: 256 * KIB,
                h2d_sync: false,
                kernels: 30,
                kernel_threads: 64 * 1024,
            },
            // 2000 launches of 2 us kernels: ~5 us of CPU each in the runtime, so the GPU
            // idles while the CPU launches.
            Mode::Launch => Profile {
                workers: 1,
                read_per_batch: 256 * KIB,
                read_chunk: 256 * KIB,
                direct_io: false,
                batch_bytes: 64 * KIB,
                h2d_bytes: 64 * KIB,
                h2d_sync: false,
                kernels: 2000,
                kernel_threads: 32,
            },
            // 24 MiB pageable copy per step at 2 GB/s: ~13 ms, a third of it the CPU's staging
            // memcpy (less CPU than a faster copy would take, so the verdict survives a busy
            // machine), against ~1.4 ms of kernels.
            Mode::Transfer => Profile {
                workers: 1,
                read_per_batch: 256 * KIB,
                read_chunk: 256 * KIB,
                direct_io: false,
                batch_bytes: 64 * KIB,
                h2d_bytes: 24 * MIB,
                h2d_sync: true,
                kernels: 20,
                kernel_threads: 128 * 1024,
            },
            // 20 kernels of ~2 ms: ~40 ms of GPU work per step, the CPU waits in sync.
            Mode::Gpu => Profile {
                workers: 1,
                read_per_batch: 256 * KIB,
                read_chunk: 256 * KIB,
                direct_io: false,
                batch_bytes: 64 * KIB,
                h2d_bytes: 64 * KIB,
                h2d_sync: false,
                kernels: 20,
                kernel_threads: 4 * 1024 * 1024,
            },
        }
    }
}

impl Mode {
    /// The profile with the usual fix for what the mode is bound by applied (`--fixed`), for
    /// before/after comparisons (`gputrace diff`).
    pub fn fixed_profile(self) -> Profile {
        let p = self.profile();
        match self {
            // More workers reading pre-processed shards from the page cache: only the batch's
            // bytes, no direct I/O.
            Mode::Data => Profile {
                workers: 4,
                direct_io: false,
                read_per_batch: p.batch_bytes,
                read_chunk: p.batch_bytes,
                ..p
            },
            // The same GPU work fused into 20 kernels (what CUDA graphs / torch.compile give).
            Mode::Launch => Profile {
                kernels: 20,
                kernel_threads: (p.kernel_ns_per_step() / 20 - 2_000) * 2,
                ..p
            },
            // Pinned memory and non_blocking copies: queued on the stream, no CPU staging.
            Mode::Transfer => Profile {
                h2d_sync: false,
                ..p
            },
            // Mixed precision: the same kernels in half the time (still GPU-bound, faster).
            Mode::Gpu => Profile {
                kernel_threads: p.kernel_threads / 2,
                ..p
            },
        }
    }

    pub fn profile_with(self, fixed: bool) -> Profile {
        if fixed {
            self.fixed_profile()
        } else {
            self.profile()
        }
    }
}

/// One training step: read a batch from a worker, copy it to the "GPU", launch kernels, sync.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Profile {
    /// Data-loader worker processes (batches are taken from them in turn, as PyTorch does).
    pub workers: u32,
    /// Bytes a worker reads from disk to build one batch.
    pub read_per_batch: u64,
    /// Size of each read() of a worker.
    pub read_chunk: u64,
    /// O_DIRECT reads (real disk I/O every time) instead of the page cache.
    pub direct_io: bool,
    /// Bytes of one batch sent through the worker's pipe.
    pub batch_bytes: u64,
    /// Host-to-device bytes per step.
    pub h2d_bytes: u64,
    /// Synchronous (pageable) cudaMemcpy instead of cudaMemcpyAsync.
    pub h2d_sync: bool,
    /// Kernel launches per step.
    pub kernels: u32,
    /// Threads per kernel (grid x block); sets the simulated kernel time.
    pub kernel_threads: u64,
}

impl Profile {
    /// Files in the data set and the size of each: enough for a few batches per worker, so
    /// reads cycle over several files.
    pub fn dataset(&self) -> (u32, u64) {
        let size = self.read_per_batch.max(1024 * 1024);
        (4 * self.workers, size)
    }

    /// Simulated GPU time of one step's kernels (ns).
    pub fn kernel_ns_per_step(&self) -> u64 {
        self.kernels as u64 * (2_000 + self.kernel_threads / 2)
    }

    /// Grid and block dimensions whose product is `kernel_threads`.
    pub fn launch_dims(&self) -> ([u32; 3], [u32; 3]) {
        let threads = self.kernel_threads.max(1);
        // The largest power-of-two block up to 256 that divides the threads exactly.
        let block = (0..=8)
            .rev()
            .map(|s| 1u64 << s)
            .find(|b| threads.is_multiple_of(*b))
            .unwrap_or(1);
        let grid = threads / block;
        ([grid as u32, 1, 1], [block as u32, 1, 1])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const ALL: [Mode; 4] = [Mode::Data, Mode::Launch, Mode::Transfer, Mode::Gpu];

    #[test]
    fn each_mode_is_bound_by_what_it_says() {
        let launch_cpu_ns = 5_000u64;
        for m in ALL {
            let p = m.profile();
            let kernels = p.kernel_ns_per_step();
            let launches = p.kernels as u64 * launch_cpu_ns;
            let copy = if p.h2d_sync { p.h2d_bytes / 2 } else { 0 };
            match m {
                Mode::Launch => assert!(launches > 2 * kernels.max(copy), "{m:?}"),
                Mode::Transfer => assert!(copy > 3 * kernels.max(launches), "{m:?}"),
                Mode::Gpu => assert!(kernels > 10 * launches.max(copy), "{m:?}"),
                Mode::Data => {
                    assert!(p.direct_io);
                    // Even at 1 GB/s the workers together need longer per batch than a step.
                    let per_batch = p.read_per_batch / p.workers as u64;
                    assert!(per_batch > 2 * (kernels + launches), "{m:?}");
                }
            }
        }
    }

    #[test]
    fn fixes_remove_the_bottleneck() {
        for m in ALL {
            let (p, f) = (m.profile(), m.fixed_profile());
            assert_ne!(p, f, "{m:?}");
            match m {
                Mode::Data => assert!(f.workers > p.workers && !f.direct_io),
                Mode::Launch => {
                    assert!(f.kernels * 50 <= p.kernels);
                    assert_eq!(f.kernel_ns_per_step(), p.kernel_ns_per_step());
                }
                Mode::Transfer => assert!(p.h2d_sync && !f.h2d_sync),
                Mode::Gpu => assert!(f.kernel_ns_per_step() * 3 < p.kernel_ns_per_step() * 2),
            }
        }
    }

    #[test]
    fn launch_dims_cover_the_threads() {
        for p in ALL.iter().flat_map(|m| [m.profile(), m.fixed_profile()]) {
            let (g, b) = p.launch_dims();
            assert_eq!(g[0] as u64 * b[0] as u64, p.kernel_threads, "{p:?}");
        }
    }

    #[test]
    fn direct_reads_are_aligned() {
        for p in ALL.iter().flat_map(|m| [m.profile(), m.fixed_profile()]) {
            let (_, size) = p.dataset();
            assert_eq!(p.read_chunk % 4096, 0);
            assert_eq!(size % p.read_chunk, 0);
            assert!(p.batch_bytes <= p.read_per_batch);
        }
    }
}
