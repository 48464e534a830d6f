//! Block requests sampled at high rates. A data loader's direct reads (~18,000 a second in the
//! demo) each ran the block programs' whole work twice, at the bio's queueing and at the
//! request's completion: ~40% of what the probes cost such a thread, which no budget window
//! takes away (they are always on). Above [`ABOVE_PER_S`] traced requests a second, the
//! programs count 1 request in `2^shift` (picked by `tracer_common::wall::block_selected`),
//! each `2^shift` times, keeping at least [`KEEP_PER_S`] a second: the block I/O rows become
//! estimates, with the variance of their request counts (`BlkStat::var`), and the report says
//! so. `--max-overhead 100%` counts every request.

use tracer_common::wall::{mix64, BlockSample, BLOCK_SHIFT_MAX};

/// Traced requests a second from which they are sampled (1 in 4, from `KEEP_PER_S`): 4 times
/// the rate kept, whatever that is.
pub const ABOVE_PER_S: u64 = 4 * KEEP_PER_S;
/// Requests a second counted at the least while sampling: a latency histogram's buckets and a
/// rate's error bound want a few thousand in a few seconds.
pub const KEEP_PER_S: u64 = 1_000;
/// Taken back only once the rate falls this far under the one its shift was taken at, so that
/// the noise of a sampled rate does not move it back and forth.
const DOWN_MARGIN: f64 = 0.75;
/// Decided at most this often (ns): a rate over half a second of sampled requests is ~500 of
/// them at the least, within ~5%.
pub const EVERY_NS: u64 = 250_000_000;
/// A new salt (another draw of the sectors picked) this often while sampling (ns). The
/// completions try the last salt too, so a request is missed only if two new salts came
/// while it was in flight: one slower than this at the least.
pub const SALT_EVERY_NS: u64 = 2_000_000_000;

/// [`KEEP_PER_S`], or GPUTRACE_BLOCK_SAMPLE_KEEP (tests: a slow CI disk's reads sampled too);
/// requests are sampled from 4 times it.
pub fn keep_per_s() -> u64 {
    static SET: std::sync::OnceLock<u64> = std::sync::OnceLock::new();
    *SET.get_or_init(|| {
        std::env::var("GPUTRACE_BLOCK_SAMPLE_KEEP")
            .ok()
            .and_then(|v| v.parse().ok())
            .filter(|&n| n > 0)
            .unwrap_or(KEEP_PER_S)
    })
}

/// The shift for `rate` traced requests a second (their estimate) now that it is `current`,
/// keeping `keep` a second at the least.
pub fn next_shift(current: u32, rate: f64, keep: u64) -> u32 {
    let fit = |keep: f64| -> u32 {
        if rate < keep {
            return 0;
        }
        ((rate / keep).log2().floor() as u32).min(BLOCK_SHIFT_MAX)
    };
    let up = fit(keep as f64);
    let down = fit(keep as f64 * DOWN_MARGIN);
    let next = if up > current {
        up
    } else if down < current {
        down
    } else {
        current
    };
    // Under ABOVE_PER_S every request counts; once sampling, it holds down to the margin.
    let floor = (ABOVE_PER_S / KEEP_PER_S).ilog2();
    if next < floor && (current == 0 || down < floor) {
        0
    } else {
        next.max(if current == 0 { 0 } else { floor })
    }
}

/// The sampler's course over a trace: what it set and for how long.
#[derive(Debug, Default, Clone)]
pub struct BlockSampler {
    /// The map value last set (its `shift` the one in force), and when its salt was drawn
    /// (ns).
    value: BlockSample,
    salted: u64,
    /// SplitMix64's state, for the salts.
    seed: u64,
    /// Requests a second counted at the least ([`keep_per_s`]).
    pub keep: u64,
    /// The last look: its clock (ns) and the weighted count then.
    last: Option<(u64, u64)>,
    /// Since when the current shift holds, if not 0 (ns).
    since: Option<u64>,
    pub sampled_ns: u64,
    pub first_ns: Option<u64>,
    pub max_shift: u32,
}

impl BlockSampler {
    /// A sampler whose salts start from `seed`.
    pub fn new(seed: u64, keep: u64) -> BlockSampler {
        BlockSampler {
            seed,
            keep,
            ..Default::default()
        }
    }

    /// Looks at the weighted count `counted` at `now` (ns); the value to set when it changes
    /// (a new shift, or a new salt).
    pub fn look(&mut self, now: u64, counted: u64) -> Option<BlockSample> {
        let Some((then, before)) = self.last else {
            self.last = Some((now, counted));
            return None;
        };
        let dt = now.saturating_sub(then);
        if dt < EVERY_NS {
            return None;
        }
        self.last = Some((now, counted));
        let rate = counted.saturating_sub(before) as f64 * 1e9 / dt as f64;
        let shift = self.value.shift as u32;
        let next = next_shift(shift, rate, self.keep);
        let resalt = next != 0 && (shift == 0 || now.saturating_sub(self.salted) >= SALT_EVERY_NS);
        if next == shift && !resalt {
            // A look after a change: the requests in flight across it have completed.
            if self.value.prev_shift != self.value.shift {
                self.value.prev_shift = self.value.shift;
                return Some(self.value);
            }
            return None;
        }
        self.value.prev_shift = self.value.shift;
        if next != shift {
            self.set(now, next);
        }
        if resalt {
            let salt = self.draw();
            self.value.prev_salt = self.value.salt;
            self.value.salt = salt;
            self.salted = now;
        }
        self.value.shift = next as u64;
        Some(self.value)
    }

    /// SplitMix64: salts need only differ from each other.
    fn draw(&mut self) -> u64 {
        self.seed = self.seed.wrapping_add(0x9E37_79B9_7F4A_7C15);
        mix64(self.seed)
    }

    fn set(&mut self, now: u64, shift: u32) {
        if let Some(s) = self.since.take() {
            self.sampled_ns += now.saturating_sub(s);
        }
        if shift != 0 {
            self.since = Some(now);
            self.first_ns.get_or_insert(now);
        }
        self.max_shift = self.max_shift.max(shift);
    }

    /// Closes the course at `now`: the time sampled is complete.
    pub fn finish(&mut self, now: u64) {
        if let Some(s) = self.since.take() {
            self.sampled_ns += now.saturating_sub(s);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const K: u64 = KEEP_PER_S;

    #[test]
    fn every_request_counts_under_the_threshold() {
        assert_eq!(next_shift(0, 0.0, K), 0);
        assert_eq!(next_shift(0, 3_999.0, K), 0);
        assert_eq!(next_shift(0, 4_000.0, K), 2);
    }

    #[test]
    fn the_shift_keeps_at_least_its_share_a_second() {
        // The data demo's two loaders: ~18,500 a second, 1 in 16 (~1,160 a second counted).
        assert_eq!(next_shift(0, 18_500.0, K), 4);
        assert_eq!(next_shift(0, 1e9, K), BLOCK_SHIFT_MAX);
        for rate in [4_000.0, 9_000.0, 18_500.0, 40_000.0, 64_000.0] {
            let s = next_shift(0, rate, K);
            assert!(
                rate / (1u64 << s) as f64 >= KEEP_PER_S as f64,
                "{rate}: {s}"
            );
        }
    }

    #[test]
    fn a_lower_keep_samples_slower_rates() {
        assert_eq!(next_shift(0, 3_000.0, 200), 3);
        assert_eq!(next_shift(0, 700.0, 200), 0);
        assert_eq!(next_shift(0, 800.0, 200), 2);
    }

    #[test]
    fn a_noisy_rate_does_not_move_it_back_and_forth() {
        // At 1 in 16 from ~18,500 a second: a look at 15,000 keeps it.
        assert_eq!(next_shift(4, 15_000.0, K), 4);
        assert_eq!(next_shift(4, 11_000.0, K), 3);
        // Sampling holds down to the margin under the threshold, then stops.
        assert_eq!(next_shift(2, 3_500.0, K), 2);
        assert_eq!(next_shift(2, 2_900.0, K), 0);
        assert_eq!(next_shift(3, 100.0, K), 0);
    }

    #[test]
    fn the_sampler_times_its_course() {
        let mut s = BlockSampler::new(1, KEEP_PER_S);
        let ms = 1_000_000u64;
        assert_eq!(s.look(0, 0), None);
        // Too soon to judge.
        assert_eq!(s.look(100 * ms, 5_000), None);
        // 18,500 a second over 0.5 s.
        let on = s.look(500 * ms, 9_250).unwrap();
        assert_eq!((on.shift, on.prev_shift), (4, 0));
        assert_ne!(on.salt, 0);
        // The next look: the requests picked before the change have completed.
        let settled = s.look(1_000 * ms, 18_500).unwrap();
        assert_eq!(
            (settled.shift, settled.prev_shift, settled.salt),
            (4, 4, on.salt)
        );
        // A new salt 2 s after the first, the first kept for the requests in flight.
        assert_eq!(s.look(2_000 * ms, 46_250), None);
        let resalted = s.look(2_500 * ms, 55_500).unwrap();
        assert_eq!((resalted.shift, resalted.prev_salt), (4, on.salt));
        assert_ne!(resalted.salt, on.salt);
        // It stops.
        assert_eq!(s.look(3_000 * ms, 55_600).map(|v| v.shift), Some(0));
        s.finish(4_000 * ms);
        assert_eq!(s.sampled_ns, 2_500 * ms);
        assert_eq!(s.first_ns, Some(500 * ms));
        assert_eq!(s.max_shift, 4);
    }
}
