//! The folded stacks of the off-CPU and wall-clock flame graphs, and their exporters. (The
//! time section of the terminal summary is rendered by report::terminal.)

use std::{
    collections::{BTreeMap, HashMap as StdHashMap},
    io::Write,
};

use tracer_common::{
    time::Category,
    wall::{WallKey, KSTACK_SEEDED},
};

use super::{aggregate::Row, Folded};
use crate::{
    collect::Stacks,
    probes::FinishCtx,
    report::{
        flamegraph,
        folded::{frame_label, thread_label},
        Exporter, ReportData,
    },
    symbolize::{Frame, Symbolizer},
};

/// The kernel frames of row `k`, innermost first: those the kernel walked at the switch-out,
/// or, for a wait under way at the attach, those /proc gave at seeding.
pub(super) fn kernel_frames(
    k: &WallKey,
    seeded: &super::SeededStacks,
    stacks: &mut Stacks<'_>,
    sym: &mut Symbolizer,
) -> Vec<Frame> {
    if k.kstack == KSTACK_SEEDED {
        let names = seeded.get(&k.tid).into_iter().flatten();
        return names
            .map(|name| Frame::kernel(name.clone(), None))
            .collect();
    }
    let mut frames = stacks
        .kernel(k.kstack)
        .map(<[u64]>::to_vec)
        .map(|ips| sym.kernel(&ips))
        .unwrap_or_default();
    // Walked from inside gputrace's own switch program: its frames and the tracepoint's
    // (`bpf_prog_*`, `bpf_trace_run4`, `__traceiter_sched_switch`) sat at the tip of every
    // off-CPU stack, where offcputime's stacks end at `__schedule`.
    let ours = frames
        .iter()
        .take_while(|f| is_tracing_frame(&f.name))
        .count();
    frames.drain(..ours);
    frames
}

/// A frame of the kernel's tracing machinery or of a BPF program.
fn is_tracing_frame(name: &str) -> bool {
    ["bpf_prog_", "bpf_trace_run", "__bpf_trace_", "__traceiter_"]
        .iter()
        .any(|p| name.starts_with(p))
}

/// The category frame under each thread in the flame graphs.
fn category_frame(c: Category) -> String {
    format!("[{}]", c.name())
}

/// Folded lines weighted in µs: off-CPU time by stack, and the wall graph where the on-CPU
/// samples (converted to µs at the sampling period) sit beside the off-CPU stacks.
pub fn folded(
    rows: &[Row],
    verdicts: &StdHashMap<WallKey, Category>,
    ctx: &mut FinishCtx<'_>,
    data: &ReportData,
    comms: &BTreeMap<u32, (u32, String)>,
    seeded: &super::SeededStacks,
    stacks: &mut Stacks<'_>,
) -> Folded {
    let mut off: BTreeMap<String, u64> = BTreeMap::new();
    for r in rows {
        let Some(&cat) = verdicts.get(&r.key) else {
            continue;
        };
        if cat == Category::Cpu || r.val.ns < 1000 {
            continue;
        }
        let k = &r.key;
        let comm = if k.tid == super::aggregate::FOLDED_TID {
            super::aggregate::FOLDED_COMM
        } else {
            comms.get(&k.tid).map(|c| c.1.as_str()).unwrap_or("?")
        };
        let mut line = thread_label(comm, k.tgid, k.tid);
        line.push(';');
        line.push_str(&category_frame(cat));
        for f in &user_frames(k, cat, ctx, stacks) {
            line.push(';');
            line.push_str(&frame_label(f));
        }
        for f in kernel_frames(k, seeded, stacks, ctx.symbolizer)
            .iter()
            .rev()
        {
            line.push(';');
            line.push_str(&frame_label(f));
        }
        *off.entry(line).or_default() += r.val.ns / 1000;
    }
    let mut wall = off.clone();
    let period_us = 1_000_000 / data.report.sampling.frequency_hz.max(1);
    for s in &data.cpu.samples {
        let mut line = thread_label(&s.comm, s.pid, s.tid);
        line.push(';');
        line.push_str(&category_frame(Category::Cpu));
        for f in &s.frames {
            line.push(';');
            line.push_str(&frame_label(f));
        }
        *wall.entry(line).or_default() += s.count * period_us;
    }
    let fmt = |m: BTreeMap<String, u64>| -> Vec<String> {
        m.into_iter()
            .filter(|(_, n)| *n > 0)
            .map(|(l, n)| format!("{l} {n}"))
            .collect()
    };
    Folded {
        offcpu: fmt(off),
        wall: fmt(wall),
    }
}

/// The user-space frames of a row, root first: native frames with the Python frames spliced in,
/// and for a CUDA row the called function as the leaf (a launch has no native stack walked, and
/// an uprobe's stack may stop short of the function itself).
fn user_frames(
    k: &WallKey,
    cat: Category,
    ctx: &mut FinishCtx<'_>,
    stacks: &mut Stacks<'_>,
) -> Vec<Frame> {
    let mut frames = Vec::new();
    if let Some(ips) = stacks.user(k.ustack).map(<[u64]>::to_vec) {
        let (maps, alive) = match ctx.tracker.procs.get(&k.tgid) {
            Some(t) => (t.maps.as_slice(), !t.info.exited),
            None => (&[][..], false),
        };
        frames = ctx.symbolizer.user(k.tgid, maps, alive, &ips);
        frames.reverse();
    }
    let mut frames = ctx.python.merge(k.tgid, k.pystack, frames);
    if let Some(name) = cuda_call(k, cat) {
        if frames.last().map(|l| l.name.as_str()) != Some(name) {
            frames.push(Frame::native(name, None));
        }
    }
    frames
}

/// The CUDA function a row of CUDA time was charged to (its `sys_nr` holds the function id).
pub fn cuda_call(k: &WallKey, cat: Category) -> Option<&'static str> {
    if !cat.is_cuda() || k.sys_nr < 0 {
        return None;
    }
    crate::cuda::table::func(k.sys_nr as u32).map(|f| f.name)
}

pub struct OffcpuFolded;
impl Exporter for OffcpuFolded {
    fn file_name(&self) -> &'static str {
        "offcpu.folded"
    }
    fn write(&self, data: &ReportData, out: &mut dyn Write) -> anyhow::Result<()> {
        for l in &data.time.offcpu {
            writeln!(out, "{l}")?;
        }
        Ok(())
    }
}

pub struct OffcpuSvg;
impl Exporter for OffcpuSvg {
    fn file_name(&self) -> &'static str {
        "offcpu.svg"
    }
    fn write(&self, data: &ReportData, out: &mut dyn Write) -> anyhow::Result<()> {
        flamegraph::write_svg(
            "gputrace: off-CPU time by category and stack",
            "us",
            &data.time.offcpu,
            out,
        )
    }
}

pub struct WallSvg;
impl Exporter for WallSvg {
    fn file_name(&self) -> &'static str {
        "wall.svg"
    }
    fn write(&self, data: &ReportData, out: &mut dyn Write) -> anyhow::Result<()> {
        flamegraph::write_svg(
            "gputrace: wall time (on- and off-CPU) by category and stack",
            "us",
            &data.time.wall,
            out,
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tracing_frames_are_told() {
        for n in [
            "bpf_prog_00c02ab7060b6013_sched_switch_btf",
            "bpf_trace_run4",
            "__traceiter_sched_switch",
            "__bpf_trace_sched_switch",
        ] {
            assert!(is_tracing_frame(n), "{n}");
        }
        assert!(!is_tracing_frame("__schedule"));
        assert!(!is_tracing_frame("bpf_map_lookup_elem"));
    }
}
