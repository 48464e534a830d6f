//! Hit counts and run times of gputrace's programs.
//!
//! Every program counts its runs in `PROG_HITS` (`tracer_common::hits`), always. The kernel's
//! BPF statistics (`kernel.bpf_stats_enabled`: run counts and run times) cost every BPF program
//! on the machine, not only gputrace's, two clock reads per run: measured on the development VM,
//! bpftrace's counting uprobe went from 930-1060 to 1100-1240 ns per hit with them on. So they
//! are on only while something is timed: the first 100 ms tick, one tick in ten after it for
//! the first 10 s and one in fifty after that, any tick while a program with 100 or more hits
//! has none timed, a launch-probe window until its programs are timed (or while no CUDA call
//! comes), and the trap calibration. A program's
//! time per run is what the kernel measured then; its hits are its own counts. The report
//! charges the statistics' own cost to the hits they timed (`calibrate::StatsCost`).

use std::{
    os::fd::{AsFd, OwnedFd},
    sync::Mutex,
};

use anyhow::{Context, Result};
use aya::{
    maps::{Array, Map, MapData, PerCpuArray},
    Ebpf,
};
use tracer_common::hits::{slot, Paths, HITS_MAP, PATHS_MAP, PATHS_ON_MAP};

/// A handle on `PROG_HITS` of its own (a thread can read it without the `Ebpf`), and on
/// `PROG_PATHS`.
pub struct Hits {
    map: PerCpuArray<MapData, u64>,
    paths: Option<PerCpuArray<MapData, Paths>>,
}

/// A descriptor of its own on map `name` (an array, a per-CPU array or a ring), for a thread
/// that reads it without the `Ebpf`, or a handle kept beyond it.
pub(super) fn own_map(ebpf: &Ebpf, name: &str) -> Result<MapData> {
    let fd = match ebpf.map(name) {
        Some(Map::Array(d) | Map::PerCpuArray(d) | Map::RingBuf(d)) => {
            d.fd().as_fd().try_clone_to_owned()
        }
        _ => anyhow::bail!("map {name} missing"),
    }
    .with_context(|| format!("duplicate the {name} descriptor"))?;
    MapData::from_fd(fd).with_context(|| format!("open {name}"))
}

impl Hits {
    pub fn open(ebpf: &Ebpf) -> Result<Hits> {
        let data = own_map(ebpf, HITS_MAP)?;
        let map = PerCpuArray::try_from(Map::PerCpuArray(data))?;
        let paths = own_map(ebpf, PATHS_MAP)
            .ok()
            .and_then(|d| PerCpuArray::try_from(Map::PerCpuArray(d)).ok());
        Ok(Hits { map, paths })
    }

    /// Program `name`'s runs by path on all CPUs so far (zero for a program that does not
    /// split them: `tracer_common::hits::splits`); None when the map cannot be read.
    pub fn paths(&self, name: &str) -> Option<Paths> {
        let v = self.paths.as_ref()?.get(&(slot(name)? as u32), 0).ok()?;
        let mut sum = Paths::default();
        for p in v.iter() {
            sum.add(p);
        }
        Some(sum)
    }

    /// Runs of program `name` so far on each possible CPU (empty for a program without a
    /// counter).
    pub fn per_cpu(&self, name: &str) -> Vec<u64> {
        slot(name)
            .and_then(|s| self.map.get(&(s as u32), 0).ok())
            .map(|v| v.iter().copied().collect())
            .unwrap_or_default()
    }

    /// Runs of program `name` on all CPUs so far (0 for a program without a counter).
    pub fn get(&self, name: &str) -> u64 {
        self.per_cpu(name).iter().sum()
    }
}

/// The kernel's BPF statistics, on while this is held (the kernel keeps them on while any
/// holder's descriptor is open); `None` inside when they could not be turned on.
pub struct StatsOn(Option<OwnedFd>);

pub fn stats_on() -> StatsOn {
    let fd = aya::sys::enable_stats(aya::sys::Stats::RunTime).ok();
    if fd.is_some() {
        paths_timing(1);
    }
    StatsOn(fd)
}

impl StatsOn {
    pub fn is_on(&self) -> bool {
        self.0.is_some()
    }
}

impl Drop for StatsOn {
    fn drop(&mut self) {
        // Before the descriptor closes: the programs time their paths only in runs the
        // kernel times too.
        if self.0.is_some() {
            paths_timing(-1);
        }
    }
}

/// `PATHS_ON` (`tracer_common::hits::PATHS_ON_MAP`), and how many [`StatsOn`] hold the
/// statistics on: the programs time their paths (`tracer_common::hits::Paths`) while it is 1,
/// so that the split of a program's mean (`super::paths`) compares the same runs. Timed over
/// the whole trace instead, a trace whose costly runs fell in the statistics' ticks (a
/// syscall gate closing mid-trace: every switch then walks its stacks) split a 1.7 us mean
/// into 2.1 us traced and 0.66 us early returns, which take ~60 ns.
struct PathsTiming {
    holders: i64,
    map: Option<Array<MapData, u64>>,
}

static PATHS_TIMING: Mutex<PathsTiming> = Mutex::new(PathsTiming {
    holders: 0,
    map: None,
});

/// Counts a holder in (`delta` 1) or out (-1) and writes the flag as it changes.
fn paths_timing(delta: i64) {
    let Ok(mut t) = PATHS_TIMING.lock() else {
        return;
    };
    let was = t.holders > 0;
    t.holders = (t.holders + delta).max(0);
    let on = t.holders > 0;
    if on != was {
        if let Some(m) = t.map.as_mut() {
            // A failed write leaves the paths untimed (or timed a while longer): the split
            // then falls back to the mean, as for a program with too few timed runs.
            let _ = m.set(0, on as u64, 0);
        }
    }
}

/// Hands the loaded object's `PATHS_ON` to [`stats_on`], set to whether the statistics are
/// held on now.
pub fn register_paths_timing(ebpf: &Ebpf) -> Result<()> {
    let mut map = Array::try_from(Map::Array(own_map(ebpf, PATHS_ON_MAP)?))?;
    let mut t = PATHS_TIMING
        .lock()
        .map_err(|_| anyhow::anyhow!("paths timing lock poisoned"))?;
    map.set(0, (t.holders > 0) as u64, 0)
        .with_context(|| format!("write {PATHS_ON_MAP}"))?;
    t.map = Some(map);
    Ok(())
}

/// Whether the statistics are on in tick `n` of the trace (ticks of 100 ms): one tick in ten
/// for the first 10 s, one in fifty after (a hot program's run time per hit is steady, and
/// each timed tick times thousands of its runs: after 10 s the later ticks mostly cost), and
/// any tick while a program that has run often (`runs`: its own hits and the runs the kernel
/// timed, per program) has none timed yet. A rare one (an exec) would keep them on for the
/// rest of the trace, waiting for a second run; its few hits cost their traps only.
pub fn sampled_tick(n: u64, runs: impl IntoIterator<Item = (u64, u64)>) -> bool {
    const OFTEN: u64 = 100;
    const EARLY_TICKS: u64 = 100;
    let every = if n < EARLY_TICKS { 10 } else { 50 };
    n.is_multiple_of(every)
        || runs
            .into_iter()
            .any(|(hits, timed)| hits >= OFTEN && timed == 0)
}

#[cfg(test)]
mod tests {
    use super::sampled_tick;

    #[test]
    fn a_tenth_of_the_ticks_then_a_fiftieth_once_every_program_is_timed() {
        let timed = [(100, 10), (0, 0)];
        let on = (0..100).filter(|&n| sampled_tick(n, timed)).count();
        assert_eq!(on, 10);
        // One in fifty after the first 10 s.
        let later = (100..600).filter(|&n| sampled_tick(n, timed)).count();
        assert_eq!(later, 10);
        assert!(sampled_tick(0, timed) && !sampled_tick(11, timed) && sampled_tick(20, timed));
        // A program that ran unseen keeps them on.
        assert!(sampled_tick(11, [(100, 10), (500, 0)]));
        assert!(!sampled_tick(11, [(100, 10), (5, 0)]));
    }
}
