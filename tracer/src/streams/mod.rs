//! The timeline family: drains the `TIMELINE` ring buffer that the scheduler, syscall, block
//! and CUDA programs stream into (off-CPU intervals, long syscalls, CUDA calls, block I/O),
//! and turns it into `data.timeline` for `trace.json`.
//!
//! Records are kept raw while tracing (the window start is only known at the end) and
//! converted at finish; at most `--timeline-limit` of them, the rest counted as cut.

pub mod convert;

use std::collections::HashMap;

use anyhow::{Context, Result};
use aya::{
    maps::{MapData, PerCpuArray, RingBuf},
    Ebpf,
};
use tracer_common::timeline::{
    TlEvent, BLOCK_OPEN_MAP, BLOCK_OPEN_SLOTS, DEFAULT_CUDA_MIN_NS, GLOBAL_CUDA_MIN_NS,
    GLOBAL_ENABLED, GLOBAL_MIN_NS, RING_MAP, STATS_MAP, STAT_CUDA_SHORT, TL_BLOCK,
};

use crate::{
    cli::TraceArgs,
    collect::Stacks,
    probes::{AttachCtx, FinishCtx, ProbeFamily},
    report::ReportData,
    tracker::Tracker,
};

/// Bytes one record takes in the ring buffer (8-byte header, 8-byte aligned).
const RECORD_BYTES: usize = 8 + std::mem::size_of::<TlEvent>();

pub struct TimelineFamily {
    /// 0 without `--output`: nothing writes trace.json, so the programs send nothing.
    enabled: u32,
    min_ns: u64,
    cuda_min_ns: u64,
    ring_bytes: u32,
    limit: usize,
    ring: Option<RingBuf<MapData>>,
    raw: Vec<TlEvent>,
    cut: u64,
}

/// Ring buffer size for a timeline of at most `limit` events: room for a 100 ms tick's worth
/// of a busy trace, a power of two between 256 KiB and 16 MiB.
pub fn ring_bytes(limit: usize) -> u32 {
    let want = (limit / 4).saturating_mul(RECORD_BYTES).min(16 << 20);
    want.next_power_of_two().clamp(256 << 10, 16 << 20) as u32
}

impl TimelineFamily {
    pub fn new(args: &TraceArgs) -> Self {
        TimelineFamily {
            enabled: (args.output.is_some() && args.timeline_limit > 0) as u32,
            min_ns: args.timeline_threshold.as_nanos().min(u64::MAX as u128) as u64,
            cuda_min_ns: DEFAULT_CUDA_MIN_NS,
            ring_bytes: ring_bytes(args.timeline_limit),
            limit: args.timeline_limit,
            ring: None,
            raw: Vec::new(),
            cut: 0,
        }
    }

    fn drain(&mut self) {
        // Out of `self` while it is read, so that `keep` may borrow the rest.
        let Some(mut ring) = self.ring.take() else {
            return;
        };
        while let Some(item) = ring.next() {
            if item.len() < std::mem::size_of::<TlEvent>() {
                continue;
            }
            // SAFETY: the record is a TlEvent written by the kernel side; read unaligned.
            let ev = unsafe { std::ptr::read_unaligned(item.as_ptr() as *const TlEvent) };
            self.keep(ev);
        }
        self.ring = Some(ring);
    }

    /// Keeps `ev` while the timeline has room, else counts it as cut.
    fn keep(&mut self, ev: TlEvent) {
        if self.raw.len() >= self.limit {
            self.cut += 1;
        } else {
            self.raw.push(ev);
        }
    }

    /// The block bursts each CPU was still building (`TL_BLOCK_OPEN`).
    fn open_bursts(&mut self, ebpf: &Ebpf) {
        let Some(map) = ebpf.map(BLOCK_OPEN_MAP) else {
            return;
        };
        let Ok(open) = PerCpuArray::<_, TlEvent>::try_from(map) else {
            return;
        };
        for slot in 0..BLOCK_OPEN_SLOTS {
            let Ok(per_cpu) = open.get(&slot, 0) else {
                return;
            };
            for ev in per_cpu.iter().filter(|e| e.kind == TL_BLOCK) {
                self.keep(*ev);
            }
        }
    }
}

impl ProbeFamily for TimelineFamily {
    fn name(&self) -> &'static str {
        "timeline"
    }

    fn configure<'a>(&'a self, loader: &mut aya::EbpfLoader<'a>) -> Result<()> {
        loader.override_global(GLOBAL_ENABLED, &self.enabled, true);
        loader.override_global(GLOBAL_MIN_NS, &self.min_ns, true);
        loader.override_global(GLOBAL_CUDA_MIN_NS, &self.cuda_min_ns, true);
        loader.map_max_entries(RING_MAP, self.ring_bytes);
        Ok(())
    }

    fn attach(&mut self, ebpf: &mut Ebpf, _ctx: &AttachCtx<'_>) -> Result<()> {
        let map = ebpf.take_map(RING_MAP).context("map TIMELINE missing")?;
        self.ring = Some(RingBuf::try_from(map).context("open the TIMELINE ring buffer")?);
        Ok(())
    }

    fn tick(&mut self, _ebpf: &mut Ebpf, _tracker: &Tracker) -> Result<()> {
        self.drain();
        Ok(())
    }

    fn finish(
        &mut self,
        ebpf: &mut Ebpf,
        ctx: &mut FinishCtx<'_>,
        data: &mut ReportData,
    ) -> Result<()> {
        self.drain();
        self.open_bursts(ebpf);
        if self.enabled != 0 {
            // Waits still under way as the window ended (the accounting stopped the states
            // then): a hung or stopped job's whole trace.
            let open = crate::accounting::States::open(ebpf)
                .and_then(|s| s.all(ebpf))
                .context("read the thread states for the waits under way")?;
            for (tid, st) in &open {
                if let Some(ev) = convert::open_wait(*tid, st, ctx.window_end_ktime, self.min_ns) {
                    self.keep(ev);
                }
            }
        }
        let t = &mut data.timeline;
        t.cut_events += self.cut;
        let mut stacks = Stacks::new(ebpf)?;
        let mut kframes: HashMap<i32, Vec<String>> = HashMap::new();
        for mut ev in self.raw.drain(..) {
            if ev.start_ns >= ctx.window_end_ktime {
                continue;
            }
            // What ran past the window's end (an open wait's record reaches it exactly).
            ev.dur_ns = ev.dur_ns.min(ctx.window_end_ktime - ev.start_ns);
            let id = convert::kernel_stack(&ev);
            let frames = kframes.entry(id).or_insert_with(|| {
                stacks
                    .kernel(id)
                    .map(<[u64]>::to_vec)
                    .map(|ips| {
                        ctx.symbolizer
                            .kernel(&ips)
                            .into_iter()
                            .map(|f| f.name)
                            .collect()
                    })
                    .unwrap_or_default()
            });
            let names: Vec<&str> = frames.iter().map(String::as_str).collect();
            if let Some(e) = convert::convert(&ev, ctx.window_start_ktime, &names) {
                t.push(e);
            }
        }
        let stats: PerCpuArray<&MapData, u64> =
            PerCpuArray::try_from(ebpf.map(STATS_MAP).context("map TL_STATS missing")?)?;
        let short = stats
            .get(&STAT_CUDA_SHORT, 0)
            .context("read TL_STATS")?
            .iter()
            .sum::<u64>();
        t.cuda_calls_below_threshold += short;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ring_is_a_bounded_power_of_two() {
        for limit in [0, 1, 1000, 200_000, usize::MAX / 2] {
            let b = ring_bytes(limit);
            assert!(
                b.is_power_of_two() && (256 << 10..=16 << 20).contains(&b),
                "{limit}: {b}"
            );
        }
        assert!(ring_bytes(200_000) > ring_bytes(1000));
    }
}
