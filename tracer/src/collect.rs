//! Reading what the kernel side aggregated: sample counts, stacks, drop counters.

use std::collections::HashMap as StdHashMap;

use anyhow::{Context, Result};
use aya::{
    maps::{HashMap, MapData, PerCpuArray, StackTraceMap},
    Ebpf,
};
use tracer_common::{
    cpu::{SampleKey, UserStack, CPU_COUNTS_MAP, KSTACKS_MAP, STACKS_MAP, YOUNG_STACKS_MAPS},
    drops::{Drop, DROPS_MAP},
};

/// One row of the in-kernel CPU sample counts.
#[derive(Debug, Clone)]
pub struct RawSample {
    pub key: SampleKey,
    pub count: u64,
}

pub fn cpu_counts(ebpf: &Ebpf) -> Result<Vec<RawSample>> {
    let map: HashMap<&MapData, SampleKey, u64> =
        HashMap::try_from(ebpf.map(CPU_COUNTS_MAP).context("map CPU_COUNTS missing")?)?;
    let mut out = Vec::new();
    for item in map.iter() {
        let (key, count) = item.context("read CPU_COUNTS")?;
        out.push(RawSample { key, count });
    }
    Ok(out)
}

/// Reads stacks by id (instruction pointers, leaf first), user stacks from `STACKS`, the young
/// processes' maps, or the copies of young stacks taken out of them (`UserStack::of` the id),
/// and kernel ones from `KSTACKS`: an id means nothing without its map. Missing ids are simply
/// absent.
pub struct Stacks<'a> {
    user: StackMap<'a>,
    young: [StackMap<'a>; 2],
    copies: Option<&'a crate::young::Copies>,
    kernel: StackMap<'a>,
}

struct StackMap<'a> {
    map: StackTraceMap<&'a MapData>,
    cache: StdHashMap<u32, Vec<u64>>,
}

impl<'a> StackMap<'a> {
    fn open(ebpf: &'a Ebpf, name: &str) -> Result<Self> {
        let map = ebpf
            .map(name)
            .with_context(|| format!("map {name} missing"))?;
        Ok(Self {
            map: StackTraceMap::try_from(map).with_context(|| format!("open map {name}"))?,
            cache: StdHashMap::new(),
        })
    }

    fn get(&mut self, id: i32) -> Option<&[u64]> {
        if id < 0 {
            return None;
        }
        let id = id as u32;
        if !self.cache.contains_key(&id) {
            let ips: Vec<u64> = self
                .map
                .get(&id, 0)
                .ok()?
                .frames()
                .iter()
                .map(|f| f.ip)
                .collect();
            self.cache.insert(id, ips);
        }
        self.cache.get(&id).map(Vec::as_slice)
    }
}

impl<'a> Stacks<'a> {
    pub fn new(ebpf: &'a Ebpf) -> Result<Self> {
        Ok(Self {
            user: StackMap::open(ebpf, STACKS_MAP)?,
            young: [
                StackMap::open(ebpf, YOUNG_STACKS_MAPS[0])?,
                StackMap::open(ebpf, YOUNG_STACKS_MAPS[1])?,
            ],
            copies: None,
            kernel: StackMap::open(ebpf, KSTACKS_MAP)?,
        })
    }

    /// Reads copied young stacks from `copies` (rows that left the maps hold their ids).
    pub fn with_copies(self, copies: &'a crate::young::Copies) -> Self {
        Self {
            copies: Some(copies),
            ..self
        }
    }

    /// The user stack `id` (a `*ustack` or `user_stack_id`).
    pub fn user(&mut self, id: i32) -> Option<&[u64]> {
        match UserStack::of(id) {
            UserStack::None(_) => None,
            UserStack::Old(slot) => self.user.get(slot as i32),
            UserStack::Young { map, slot } => self.young[map].get(slot as i32),
            UserStack::Copied(i) => self.copies?.get(i),
        }
    }

    /// The kernel stack `id` (a `*kstack` or `kernel_stack_id`).
    pub fn kernel(&mut self, id: i32) -> Option<&[u64]> {
        self.kernel.get(id)
    }
}

/// Non-zero drop counters: the total and each CPU's count.
pub fn drops(ebpf: &Ebpf) -> Result<Vec<(Drop, u64, Vec<u64>)>> {
    let map: PerCpuArray<&MapData, u64> =
        PerCpuArray::try_from(ebpf.map(DROPS_MAP).context("map DROPS missing")?)?;
    let mut out = Vec::new();
    for d in Drop::ALL {
        let per_cpu = map.get(&(d as u32), 0).context("read DROPS")?;
        let total: u64 = per_cpu.iter().sum();
        if total > 0 {
            out.push((d, total, per_cpu.iter().copied().collect()));
        }
    }
    Ok(out)
}

/// Drop counters as the report gives them: the read as the trace ended (`before`), but for the
/// reasons counted by what stays on for the report after it (`after`, read once the families
/// finished): the block completions through the end's drain (up to 250 ms) and the CUDA probes
/// until the report is out, whose losses then are in what the report counts. The rest keep
/// the first read: what counts them after the end (the CPU sampler's stacks, the process
/// events nothing reads any more, the timeline past its window, switch-ins seen only by the
/// sampler once the scheduler programs are off) is outside the report; `SwitchInUnseen` went
/// from 9-11 to 204 in a large target's stop.
pub fn settle_drops(
    before: Vec<(Drop, u64, Vec<u64>)>,
    after: Vec<(Drop, u64, Vec<u64>)>,
) -> Vec<(Drop, u64, Vec<u64>)> {
    let later = |d: Drop| {
        matches!(
            d,
            Drop::BlockMapFull
                | Drop::BlockNoCompletion
                | Drop::BlockIssueUnstamped
                | Drop::CudaFull
                | Drop::CudaEventsFull
        )
    };
    let mut out: Vec<_> = after.into_iter().filter(|(d, _, _)| later(*d)).collect();
    out.extend(before.into_iter().filter(|(d, _, _)| !later(*d)));
    // In the order `drops` reads them.
    out.sort_by_key(|(d, _, _)| Drop::ALL.iter().position(|a| a == d));
    out
}

/// Runs of each program that the kernel skipped, when any: `recursion_misses` from
/// `/proc/self/fdinfo` (aya's `ProgramInfo` does not carry it). A classic tracepoint or
/// perf-event program is skipped while another such program runs on the same CPU (a wakeup in
/// an interrupt that lands on a running program), a raw tracepoint program while itself runs
/// there. Nothing else says that those events are missing.
pub fn kernel_skips(ebpf: &Ebpf) -> Vec<(String, u64)> {
    let mut out = Vec::new();
    for (name, prog) in ebpf.programs() {
        let Some(text) = fdinfo(prog) else { continue };
        if let Some(n) = recursion_misses(&text).filter(|&n| n > 0) {
            out.push((name.to_string(), n));
        }
    }
    out.sort();
    out
}

fn recursion_misses(fdinfo: &str) -> Option<u64> {
    fdinfo_u64(fdinfo, "recursion_misses:")
}

/// Instructions the verifier walked to accept a loaded program (`verified_insns`, Linux 5.16):
/// a program's distance from the verifier's limit ([`VERIFIER_LIMIT`]), which another kernel's
/// verifier may walk differently.
pub fn verified_insns(prog: &aya::programs::Program) -> Option<u64> {
    fdinfo_u64(&fdinfo(prog)?, "verified_insns:")
}

/// A loaded program's `/proc/self/fdinfo` (what aya's `ProgramInfo` does not carry).
fn fdinfo(prog: &aya::programs::Program) -> Option<String> {
    use std::os::fd::{AsFd, AsRawFd};
    let raw = prog.fd().ok()?.as_fd().as_raw_fd();
    std::fs::read_to_string(format!("/proc/self/fdinfo/{raw}")).ok()
}

/// `BPF_COMPLEXITY_LIMIT_INSNS`: a program whose verification walks more is refused.
pub const VERIFIER_LIMIT: u64 = 1_000_000;

fn fdinfo_u64(fdinfo: &str, key: &str) -> Option<u64> {
    fdinfo
        .lines()
        .find_map(|l| l.strip_prefix(key))
        .and_then(|v| v.trim().parse().ok())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_losses_of_what_runs_for_the_report_are_read_after_the_end() {
        let before = vec![
            (Drop::StackCollision, 5, vec![5, 0]),
            (Drop::BlockNoCompletion, 1, vec![1, 0]),
            (Drop::SwitchInUnseen, 3, vec![2, 1]),
        ];
        let after = vec![
            (Drop::StackCollision, 9, vec![9, 0]),
            (Drop::CudaEventsFull, 2, vec![0, 2]),
            (Drop::BlockNoCompletion, 4, vec![1, 3]),
            (Drop::SwitchInUnseen, 200, vec![100, 100]),
            (Drop::ProcEventsFull, 7, vec![7, 0]),
        ];
        let mut want = vec![
            (Drop::StackCollision, 5, vec![5, 0]),
            (Drop::CudaEventsFull, 2, vec![0, 2]),
            (Drop::BlockNoCompletion, 4, vec![1, 3]),
            (Drop::SwitchInUnseen, 3, vec![2, 1]),
        ];
        // The order of `Drop::ALL`, as `drops` reads them.
        want.sort_by_key(|(d, _, _)| Drop::ALL.iter().position(|a| a == d));
        assert_eq!(settle_drops(before, after), want);
    }

    #[test]
    fn reads_recursion_misses_from_fdinfo() {
        let text = "pos:\t0\nflags:\t02000002\nprog_type:\t5\nrun_time_ns:\t0\nrun_cnt:\t0\n\
                    recursion_misses:\t7\nverified_insns:\t120\n";
        assert_eq!(recursion_misses(text), Some(7));
        assert_eq!(recursion_misses("prog_type:\t5\n"), None);
        assert_eq!(fdinfo_u64(text, "verified_insns:"), Some(120));
    }
}
