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
    fn a_noisy_difference_never_prices_a_path_below_zero() {
        let s = split(50.0, &paths(10, 20, 20 * 10, 980, 980 * 200)).unwrap();
        assert_eq!(s.traced, 0.0);
        assert!(s.early > 50.0);
    }
}
