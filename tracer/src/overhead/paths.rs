//! A program's mean run time split by path: the traced work, and the early return for what
//! is not traced (`tracer_common::hits::Paths`).
//!
//! The kernel's statistics give one mean per program, over all its timed runs. On a busy
//! machine most runs of the scheduler, syscall and block programs are other tasks' early
//! returns (~20-40 ns of work), and the mean prices a traced thread's switch, which walks and
//! sums, at a fraction of what it costs. The programs time one run in
//! `PATH_SAMPLE_EVERY` themselves, by path; the difference of the two paths' means splits
//! the kernel's. Both sampled means carry the same clock reads, which cancel in the
//! difference, and the kernel's mean keeps what the self-timing cannot see (the program's
//! prologue, the statistics' own part inside the run).

use tracer_common::hits::Paths;

/// Self-timed runs of each path needed to split the mean: fewer give a difference that is
/// mostly noise, and the mean is used for both.
pub const MIN_TIMED: u64 = 16;

#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Split {
    /// Mean run time of a traced hit, and of an early return (ns).
    pub traced: f64,
    pub early: f64,
}

/// What the self-timing cannot see of a run and the kernel's statistics do (the program's
/// prologue and epilogue, the statistics' own clock reads inside the run): the kernel's mean
/// less the self-timed runs' was 25-111 ns for the syscall and scheduler programs over tens of
/// thousands of runs each on the development VM (2026-11-27).
pub const UNSEEN_MAX_NS: f64 = 150.0;

/// The kernel's `mean` (ns) of a program whose paths `p` timed a sample of the same runs, less
/// what runs the CPU was taken from added to it. The kernel times every run in full: one
/// of 2.3 ms among 387 put `sys_exit`'s mean at 6.2 us, where its self-timed runs averaged
/// 95 ns, and priced a dd storm's syscalls at 4-20x what they cost. The self-timing leaves
/// such runs out (`PATH_RUN_MAX_NS`). So the mean is held to twice the most the sample's
/// paths could average, plus what the self-timing cannot see: the share of traced runs at the
/// top of its interval (Wilson, three standard errors), and twice that mix for the runs of
/// each path the sample missed (a switch that walks a fresh stack costs ten that reuse one).
/// It takes gross stalls out, not noise. Without at least `MIN_TIMED` self-timed runs, and
/// some of each path, the sample cannot say, and the kernel's mean stands.
pub fn without_stalls(mean: f64, p: &Paths) -> f64 {
    let n = p.traced_timed + p.early_timed;
    if mean <= 0.0 || n < MIN_TIMED || p.traced_timed == 0 || p.early_timed == 0 {
        return mean;
    }
    let t = p.traced_ns as f64 / p.traced_timed as f64;
    let e = p.early_ns as f64 / p.early_timed as f64;
    let (lo, hi) = wilson(p.traced_timed, n, 3.0);
    let mix = |phi: f64| phi * t + (1.0 - phi) * e;
    mean.min(UNSEEN_MAX_NS + 2.0 * mix(lo).max(mix(hi)))
}

/// The Wilson score interval of a share `k / n`, `z` standard errors wide.
fn wilson(k: u64, n: u64, z: f64) -> (f64, f64) {
    let (n, p) = (n as f64, k as f64 / n as f64);
    let centre = (p + z * z / (2.0 * n)) / (1.0 + z * z / n);
    let half = z * (p * (1.0 - p) / n + z * z / (4.0 * n * n)).sqrt() / (1.0 + z * z / n);
    ((centre - half).max(0.0), (centre + half).min(1.0))
}

/// Splits `mean` (the kernel's mean per timed run, ns) of a program by its paths `p` (timed
/// in a sample of the same runs). Let φ be the share of traced runs in that sample and `d`
/// the difference of the two paths' self-timed means: the mean is `early + φ d`, so a traced
/// hit costs `mean + (1 - φ) d` and an early return `mean - φ d`. φ is the sample's, not the
/// whole trace's: the statistics' ticks may see another mix (a syscall gate that closed
/// mid-trace: 26% of `sys_exit`'s timed runs traced against 54% of all its runs).
pub fn split(mean: f64, p: &Paths) -> Option<Split> {
    if mean <= 0.0 || p.traced_timed < MIN_TIMED || p.early_timed < MIN_TIMED {
        return None;
    }
    let phi = p.traced_timed as f64 / (p.traced_timed + p.early_timed) as f64;
    let d = p.traced_ns as f64 / p.traced_timed as f64 - p.early_ns as f64 / p.early_timed as f64;
    Some(Split {
        traced: (mean + (1.0 - phi) * d).max(0.0),
        early: (mean - phi * d).max(0.0),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn paths(traced: u64, t_timed: u64, t_ns: u64, e_timed: u64, e_ns: u64) -> Paths {
        Paths {
            traced,
            traced_timed: t_timed,
            traced_ns: t_ns,
            early_timed: e_timed,
            early_ns: e_ns,
            ..Paths::default()
        }
    }

    #[test]
    fn a_mean_of_mostly_early_returns_prices_a_traced_hit_at_its_own_cost() {
        // A tenth of the timed runs traced: traced runs 400 ns, early 40 ns (self-timed, with
        // 20 ns of clock reads in each), prologue 30 ns: the kernel's mean is
        // 30 + 0.1 x 400 + 0.9 x 40. The trace's other runs (`traced`) do not weigh in.
        let mean = 30.0 + 0.1 * 400.0 + 0.9 * 40.0;
        let p = paths(900, 50, 50 * 420, 450, 450 * 60);
        let s = split(mean, &p).unwrap();
        assert!((s.traced - 430.0).abs() < 1e-9, "{s:?}");
        assert!((s.early - 70.0).abs() < 1e-9, "{s:?}");
        // The split keeps the mean: hits priced by path sum to what the kernel measured.
        assert!((0.1 * s.traced + 0.9 * s.early - mean).abs() < 1e-9);
    }

    #[test]
    fn too_few_timed_runs_of_a_path_leave_the_mean() {
        assert_eq!(split(100.0, &paths(1000, 40, 4000, 0, 0)), None);
        assert_eq!(split(100.0, &paths(10, 15, 1500, 40, 800)), None);
        // No kernel mean (its statistics off): nothing to split.
        assert_eq!(split(0.0, &paths(100, 40, 4000, 40, 800)), None);
    }

    #[test]
    fn a_run_the_cpu_was_taken_from_is_taken_out_of_the_kernels_mean() {
        // The dd storm's sys_exit: 387 runs timed by the kernel at 6,176 ns on average, 40
        // self-timed (3 traced at ~300 ns, 37 early returns at ~78 ns).
        // At most 29% of its runs traced (at 300 ns), the rest at 78 ns: held to 150 + 2 x 142.
        let p = paths(3, 3, 900, 37, 37 * 78);
        let m = without_stalls(6176.0, &p);
        assert!(m > 420.0 && m < 450.0, "{m}");
        // A fifth of the runs traced at 3.5 us, one of them in a sample of 40: 830 ns stands.
        let p = paths(1, 1, 3500, 39, 39 * 100);
        assert_eq!(without_stalls(830.0, &p), 830.0);
        // No traced run in the sample: it cannot say how much they cost.
        assert_eq!(without_stalls(6176.0, &paths(0, 0, 0, 40, 4000)), 6176.0);
        // A clean mean (pingpong's sys_exit: 82 ns over its 11,763 self-timed runs) stays.
        let p = paths(11431, 11431, 11431 * 320, 332, 332 * 100);
        assert_eq!(without_stalls(396.0, &p), 396.0);
        // Too few self-timed runs to say: the kernel's mean stands.
        assert_eq!(without_stalls(6176.0, &paths(3, 3, 900, 10, 780)), 6176.0);
        assert_eq!(without_stalls(0.0, &p), 0.0);
    }

    #[test]
    fn a_noisy_difference_never_prices_a_path_below_zero() {
        let s = split(50.0, &paths(10, 20, 20 * 10, 980, 980 * 200)).unwrap();
        assert_eq!(s.traced, 0.0);
        assert!(s.early > 50.0);
    }
}
