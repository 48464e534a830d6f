//! CUDA runtime and driver API tracing (issue 4): library discovery, uprobe attachment, kernel
//! names, and the per-process CUDA section of the report; NVML sampling alongside.
//!
//! - Discovery: every 0.5 s the maps of each live traced process are read; libcudart*/libcuda*
//!   files, and any other executable object that defines the runtime's launch functions (static
//!   cudart), are attached once per file (inode + path), opened through /proc/PID/map_files
//!   when the path no longer leads to the mapped file.
//! - Probes: one entry and one return program for all functions (tracer-ebpf/src/cuda.rs); the
//!   attach cookie carries the function id, argument shape, time category and copy direction
//!   (`table.rs`). Return probes are attached before entry probes. Per library and program one
//!   uprobe_multi link for the launch functions (the gate switches it) and one for the rest,
//!   or aya's perf links, one per function, on kernels without them (`crate::uprobes`).
//! - Scope: `UProbeScope::AllProcesses` with the traced-set filter in the kernel. Untraced
//!   processes that map the same library file pay the trap (~1 us per call) while gputrace runs.
//! - Cost on the development VM (`cargo xtask bench-cuda`, a launch = cudaLaunchKernel calling
//!   cuLaunchKernel, so two probed functions): untraced 10 ns; entry probes only +2.1 us;
//!   entry + return probes +4.5 us per launch. bpftrace's minimal programs cost the same there.

pub mod aggregate;
pub mod discover;
pub mod errors;
pub mod nvml;
pub mod table;
mod timeline_names;

use std::{
    collections::{BTreeMap, HashMap, HashSet},
    path::PathBuf,
};

use anyhow::{Context, Result};
use aya::{
    maps::{MapData, RingBuf},
    Ebpf,
};
use tracer_common::cuda::{
    ApiKey, ApiVal, Cookie, CopyKey, CopyVal, ErrKey, EventKind, LaunchKey, LaunchVal, RtText,
    API_MAP, COPY_MAP, ENTRY_PROG, ERRS_MAP, EVENTS_MAP, EVENT_HEADER_BYTES, GLOBAL_ENTRY_ONLY,
    LAUNCH_MAP, RET_PROG, RT_TEXT_MAP,
};

use self::{
    aggregate::{MemEvent, MemoryTracker},
    discover::Found,
    table::{Layer, FUNCS},
};
use crate::{
    cli::TraceArgs,
    probes::{AttachCtx, FinishCtx, ProbeFamily},
    procfs,
    report::{model::cuda::CudaLibrary, model::cuda::ProcessCuda, ReportData},
    tracker::Tracker,
    uprobes::{Link, Uprobes},
};

/// Libraries are looked for in every traced process this often (ticks of 100 ms), so one
/// loaded after attach (`import torch`) is probed within a second.
const SCAN_EVERY_TICKS: u64 = 5;
/// Every process's maps are read this often even when its executable mappings kept their
/// sizes (10 s): a library swapped for one of the same size.
const SCAN_ALL_EVERY_TICKS: u64 = 100;

pub struct CudaFamily {
    entry_only: u32,
    overrides: Vec<(PathBuf, Layer)>,
    nvml_interval: std::time::Duration,
    nvml: Option<nvml::Sampler>,
    /// Library files attached to, by (inode, path): attached once whoever maps them.
    libs: Vec<Lib>,
    /// Which processes map which library (indices into `libs`).
    users: BTreeMap<u32, HashSet<usize>>,
    events: Option<RingBuf<MapData>>,
    raw: RawEvents,
    ticks: u64,
    warnings: Vec<String>,
    /// Libraries found only once a process had mapped them: (library, pid, ms from the
    /// mapping to the probes), the longest per library. The calls made in between were not
    /// seen; the report says so.
    late: Vec<(String, u32, f64)>,
    /// Other mapped objects checked for an embedded CUDA runtime: (inode, path) -> verdict.
    checked: HashMap<(u64, String), bool>,
    /// Each process's executable mapping sizes at its last look (`procfs::exec_sizes`).
    exec_sizes: HashMap<u32, (u64, u64)>,
    /// Libraries named with --libcudart/--libcuda (indices into `libs`).
    named: Vec<usize>,
    /// Switches the launch probes on and off under `--max-overhead` (issue 6).
    gate: crate::overhead::LaunchGate,
    /// And the copy and sync probes, once their cost alone passes the budget.
    calls: crate::overhead::CallGate,
    /// Libraries whose copy and sync probes a window could not attach again.
    calls_lost: Vec<PathBuf>,
    uprobes: Option<Uprobes>,
    /// `-v`: say how soon a library mapped during the trace was probed.
    verbose: bool,
    /// The processes this family wrote an `RT_TEXT_MAP` entry for (the kernel drops one at
    /// an exec or exit; `forget_runtime_text` drops those it missed).
    rt_text: HashSet<u32>,
    /// A failure to write it was put in the warnings (said once).
    rt_text_warned: bool,
}

impl Drop for CudaFamily {
    /// After the report (the session drops the families last): the links go together, each
    /// close waits for the kernel.
    fn drop(&mut self) {
        crate::uprobes::close_all(
            self.libs
                .iter_mut()
                .flat_map(|l| l.links.drain(..))
                .collect(),
        );
    }
}

struct Lib {
    found: Found,
    attached: Vec<String>,
    failed: Vec<String>,
    /// The links of the probes the gate does not switch (it holds its own).
    links: Vec<Link>,
    /// A window could not attach its launch probes again (`LaunchGate::take_lost`).
    launches_lost: bool,
}

#[derive(Default)]
struct RawEvents {
    /// pid -> its allocations so far (live ones, counts, a bounded series).
    mem: BTreeMap<u32, MemoryTracker>,
    /// (pid, handle) -> name.
    names: HashMap<(u32, u64), String>,
    /// (pid, function handle) -> kernel handle.
    aliases: HashMap<(u32, u64), u64>,
}

impl CudaFamily {
    /// Launch probes of a library left for the budget's next window that the window could not
    /// attach: listed as not attached, as a library's first attach lists them. Returns the
    /// processes that map a runtime among them: its launches may now be seen at the driver
    /// only, and its code must no longer hide them (`set_runtime_text`).
    fn note_window_failures(&mut self) -> Vec<u32> {
        let mut pids = Vec::new();
        for f in self.gate.take_failures() {
            let Some(i) = self.libs.iter().position(|l| l.found.open_path == f.path) else {
                continue;
            };
            if self.libs[i].found.layer == Layer::Runtime {
                pids.extend(users_of(&self.users, i));
            }
            let l = &mut self.libs[i];
            let Some(func) = FUNCS.get(Cookie::unpack(f.cookie).fid as usize) else {
                continue;
            };
            l.attached.retain(|a| a != func.name);
            l.failed
                .push(format!("{} ({}): {}", func.name, f.prog, f.error));
        }
        pids.sort_unstable();
        pids.dedup();
        pids
    }

    pub fn new(args: &TraceArgs, trap: crate::overhead::SharedTrapCost) -> Self {
        let mut overrides = Vec::new();
        if let Some(p) = &args.libcudart {
            overrides.push((p.clone(), Layer::Runtime));
        }
        if let Some(p) = &args.libcuda {
            overrides.push((p.clone(), Layer::Driver));
        }
        Self {
            entry_only: args.cuda_entry_only.into(),
            overrides,
            nvml_interval: args.nvml_interval,
            nvml: None,
            libs: Vec::new(),
            users: BTreeMap::new(),
            events: None,
            raw: RawEvents::default(),
            ticks: 0,
            warnings: Vec::new(),
            late: Vec::new(),
            checked: HashMap::new(),
            exec_sizes: HashMap::new(),
            named: Vec::new(),
            gate: crate::overhead::LaunchGate::new(args.max_overhead, args.cuda_entry_only, trap),
            calls: crate::overhead::CallGate::new(args.max_overhead),
            calls_lost: Vec::new(),
            verbose: args.verbose,
            uprobes: None,
            rt_text: HashSet::new(),
            rt_text_warned: false,
        }
    }

    /// Attaches to `found` unless already done; returns its index.
    fn ensure(&mut self, ebpf: &mut Ebpf, found: Found) -> usize {
        if let Some(i) = self
            .libs
            .iter()
            .position(|l| l.found.inode == found.inode && l.found.path == found.path)
        {
            return i;
        }
        let (attached, failed, links) = match &self.uprobes {
            Some(u) => attach_library(
                ebpf,
                u,
                &found,
                self.entry_only != 0,
                (&mut self.gate, &mut self.calls),
            ),
            None => (vec![], vec!["uprobe programs not loaded".into()], vec![]),
        };
        if self.verbose && self.gate.waits_for_window(&found.open_path) {
            crate::note!(
                "gputrace: launch probes on {} wait for the budget's next window",
                found.path
            );
        }
        self.libs.push(Lib {
            found,
            attached,
            failed,
            links,
            launches_lost: false,
        });
        self.libs.len() - 1
    }

    /// `all`: look at every process's maps, not only those whose executable mappings changed
    /// size.
    fn scan(&mut self, ebpf: &mut Ebpf, pids: &[u32], all: bool) {
        // Forgets processes that are gone: a reused pid is looked at afresh.
        self.exec_sizes.retain(|pid, _| pids.contains(pid));
        self.forget_runtime_text(ebpf, pids);
        self.scan_only(ebpf, pids, all);
    }

    /// `scan` without forgetting the processes not in `pids`.
    fn scan_only(&mut self, ebpf: &mut Ebpf, pids: &[u32], all: bool) {
        for &pid in pids {
            let sizes = procfs::exec_sizes(pid);
            if !all && sizes.is_some() && self.exec_sizes.get(&pid) == sizes.as_ref() {
                continue;
            }
            let Some(maps) = procfs::read_maps(pid) else {
                continue;
            };
            if let Some(s) = sizes {
                self.exec_sizes.insert(pid, s);
            }
            let checked = &mut self.checked;
            let mut found_libs = discover::scan(pid, &maps, |inode, path, open| {
                *checked
                    .entry((inode, path.to_string()))
                    .or_insert_with(|| discover::embeds_runtime(open))
            });
            // Runtimes before the driver, whatever their order in the maps: a runtime launch
            // made while only the driver's launch probe is on counts as a direct driver
            // launch (see `LaunchGate`'s `outer_first`).
            found_libs.sort_by_key(|f| f.layer != Layer::Runtime);
            let mut text_set = false;
            for found in found_libs {
                // The runtimes' code is known before the driver's probes go on.
                if found.layer == Layer::Driver && !text_set {
                    self.set_runtime_text(ebpf, pid, &maps);
                    text_set = true;
                }
                let i = self.ensure(ebpf, found);
                self.users.entry(pid).or_default().insert(i);
            }
            if !text_set {
                self.set_runtime_text(ebpf, pid, &maps);
            }
        }
    }

    /// Tells the entry program where the shared runtimes that process `pid` maps have their
    /// code (`RT_TEXT_MAP`), from its maps `maps`: a driver launch called from there is
    /// nested in a runtime launch. Only runtimes whose launch probes are attached count: with
    /// none, the driver's launch is the only one seen.
    fn set_runtime_text(&mut self, ebpf: &mut Ebpf, pid: u32, maps: &[procfs::Mapping]) {
        let runtimes = self.users.get(&pid).into_iter().flatten().filter_map(|&i| {
            let l = &self.libs[i];
            (!l.launches_lost && runtime_launches_probed(&l.attached, &l.failed))
                .then_some(&l.found)
        });
        let text = discover::runtime_text(maps, runtimes);
        let Some(map) = ebpf.map_mut(RT_TEXT_MAP) else {
            return;
        };
        let Ok(mut map) = aya::maps::HashMap::<_, u32, RtText>::try_from(map) else {
            return;
        };
        // What the kernel holds, not what was last written: it drops a process's entry at its
        // exec and its exit.
        let held = map.get(&pid, 0).unwrap_or_default();
        if text == held {
            return;
        }
        if text == RtText::default() {
            // Gone already if the kernel dropped it meanwhile.
            let _ = map.remove(&pid);
            self.rt_text.remove(&pid);
            return;
        }
        match map.insert(pid, text, 0) {
            Ok(()) => {
                self.rt_text.insert(pid);
            }
            Err(e) if !self.rt_text_warned => {
                self.rt_text_warned = true;
                self.warnings.push(format!(
                    "the CUDA runtime's code in pid {pid} was not recorded ({e}): a runtime \
                     launch entered just before its probe went on may count as a direct driver \
                     launch"
                ));
            }
            Err(_) => {}
        }
    }

    /// Runtimes whose launch probes a window could not attach again: their code no longer
    /// tells a driver launch nested in one of their launches, which may now be the only launch
    /// seen.
    fn launches_lost(&mut self, ebpf: &mut Ebpf, paths: &[PathBuf]) {
        let mut pids = Vec::new();
        for (i, l) in self.libs.iter_mut().enumerate() {
            let lost = l.found.layer == Layer::Runtime && paths.contains(&l.found.open_path);
            if !lost || l.launches_lost {
                continue;
            }
            l.launches_lost = true;
            pids.extend(users_of(&self.users, i));
        }
        self.runtime_text_again(ebpf, pids);
    }

    /// Writes the runtimes' code of processes `pids` again, from their maps now (a process
    /// gone is left to the next scan).
    fn runtime_text_again(&mut self, ebpf: &mut Ebpf, pids: Vec<u32>) {
        for pid in pids {
            if let Some(maps) = procfs::read_maps(pid) {
                self.set_runtime_text(ebpf, pid, &maps);
            }
        }
    }

    /// Forgets the runtimes' code of processes not in `live`.
    fn forget_runtime_text(&mut self, ebpf: &mut Ebpf, live: &[u32]) {
        let gone: Vec<u32> = self
            .rt_text
            .iter()
            .filter(|pid| !live.contains(pid))
            .copied()
            .collect();
        if gone.is_empty() {
            return;
        }
        let Some(Ok(mut map)) = ebpf
            .map_mut(RT_TEXT_MAP)
            .map(aya::maps::HashMap::<_, u32, RtText>::try_from)
        else {
            return;
        };
        for pid in gone {
            let _ = map.remove(&pid);
            self.rt_text.remove(&pid);
        }
    }

    fn drain(&mut self) {
        let Some(ring) = self.events.as_mut() else {
            return;
        };
        while let Some(item) = ring.next() {
            if item.len() < EVENT_HEADER_BYTES {
                continue;
            }
            let u32_at = |o: usize| u32::from_ne_bytes(item[o..o + 4].try_into().unwrap());
            let u64_at = |o: usize| u64::from_ne_bytes(item[o..o + 8].try_into().unwrap());
            let (kind, pid, fid) = (u32_at(0), u32_at(4), u32_at(12));
            let (ts, addr, size) = (u64_at(16), u64_at(24), u64_at(32));
            // Pinned host memory is the host's: 500 MB of cudaMallocHost buffers never freed
            // read as GPU memory leaked, and a pinned buffer as the job's first GPU
            // allocation.
            let host = table::func(fid).is_some_and(|f| f.is_host_memory());
            match EventKind::from_u32(kind) {
                Some(EventKind::Alloc | EventKind::Free) if host => {}
                Some(EventKind::Alloc) => self.raw.mem.entry(pid).or_default().add(&MemEvent {
                    ts_ns: ts,
                    fid,
                    addr,
                    size: Some(size),
                }),
                Some(EventKind::Free) => self.raw.mem.entry(pid).or_default().add(&MemEvent {
                    ts_ns: ts,
                    fid,
                    addr,
                    size: None,
                }),
                Some(EventKind::Name) => {
                    let name = &item[EVENT_HEADER_BYTES..];
                    let end = name.iter().position(|b| *b == 0).unwrap_or(name.len());
                    if end > 0 {
                        let mut name = String::from_utf8_lossy(&name[..end]).into_owned();
                        // The kernel side reads at most NAME_BYTES - 1 bytes: a longer name
                        // (templated kernels') is cut, and two cut alike are not one kernel.
                        if end + 1 >= tracer_common::cuda::NAME_BYTES {
                            name.push(TRUNCATED_NAME);
                        }
                        self.raw.names.insert((pid, addr), name);
                    }
                }
                Some(EventKind::Alias) => {
                    self.raw.aliases.insert((pid, addr), size);
                }
                None => {}
            }
        }
    }
}

/// The processes that map library `i` (an index into `CudaFamily::libs`).
fn users_of(users: &BTreeMap<u32, HashSet<usize>>, i: usize) -> impl Iterator<Item = u32> + '_ {
    users
        .iter()
        .filter(move |(_, libs)| libs.contains(&i))
        .map(|(&pid, _)| pid)
}

/// Whether a runtime library's launch probes are all on: one of its launch functions was
/// probed (`attached`, the names) and none failed (`failed`, "name (program): why"). With one
/// of them unprobed, its driver launches are the only ones seen of its calls.
fn runtime_launches_probed(attached: &[String], failed: &[String]) -> bool {
    let runtime_launch = |name: &str| {
        table::by_name(name).is_some_and(|f| f.layer == Layer::Runtime && f.is_launch())
    };
    attached.iter().any(|a| runtime_launch(a))
        && !failed.iter().any(|e| {
            e.split_once(" (")
                .is_some_and(|(name, _)| runtime_launch(name))
        })
}

/// The gate that switches a function's probes on and off under the budget, if any.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Switch {
    Never,
    /// The copy and sync gate (`overhead::CallGate`).
    Calls,
    /// The launch gate (`overhead::LaunchGate`).
    Launches,
}

/// Attaches the entry (and return) program at every table function the library exports: one
/// link per program for the functions the gate switches and one for the others (uprobe_multi),
/// or one per function (perf links). Returns the functions attached, the failures, and the
/// links the gate does not hold.
fn attach_library(
    ebpf: &mut Ebpf,
    uprobes: &Uprobes,
    lib: &Found,
    entry_only: bool,
    (gate, calls): (
        &mut crate::overhead::LaunchGate,
        &mut crate::overhead::CallGate,
    ),
) -> (Vec<String>, Vec<String>, Vec<Link>) {
    let ids: Vec<usize> = table::of_layer(lib.layer).collect();
    let names: Vec<&str> = ids.iter().map(|&i| FUNCS[i].name).collect();
    let offsets = match discover::symbol_offsets(&lib.open_path, &names) {
        Ok(o) => o,
        Err(e) => return (vec![], vec![format!("{}: {e:#}", lib.path)], vec![]),
    };
    let exported: Vec<(usize, u64)> = ids
        .iter()
        .filter_map(|&fid| offsets.get(FUNCS[fid].name).map(|&off| (fid, off)))
        .collect();
    let mut failed: BTreeMap<usize, String> = BTreeMap::new();
    let mut links = Vec::new();
    // The return probes first: a call entered between the two attachments would otherwise
    // raise the thread's depth with no return to lower it, and hide its later calls.
    let progs: &[&'static str] = if entry_only {
        &[ENTRY_PROG]
    } else {
        &[RET_PROG, ENTRY_PROG]
    };
    // Which gate switches a function's probes, if one does: decided up front, as the group's
    // links go to that gate.
    let switch: BTreeMap<usize, Switch> = exported
        .iter()
        .map(|&(fid, _)| {
            let by = if gate.gated(fid) {
                Switch::Launches
            } else if calls.gated(fid) {
                Switch::Calls
            } else {
                Switch::Never
            };
            (fid, by)
        })
        .collect();
    for &prog in progs {
        for by in [Switch::Never, Switch::Calls, Switch::Launches] {
            let gated = by == Switch::Launches;
            let group: Vec<(usize, u64)> = exported
                .iter()
                .copied()
                .filter(|(fid, _)| switch.get(fid) == Some(&by) && !failed.contains_key(fid))
                .collect();
            if group.is_empty() {
                continue;
            }
            let points = |g: &[(usize, u64)]| -> Vec<(u64, u64)> {
                g.iter()
                    .map(|&(fid, off)| (off, table::cookie(fid)))
                    .collect()
            };
            if gated && !gate.attaches_now() {
                let outer = lib.layer == Layer::Runtime;
                gate.remember(prog, outer, lib.open_path.clone(), points(&group));
                continue;
            }
            let mut made = Vec::new();
            match uprobes.attach(ebpf, prog, &lib.open_path, &points(&group), None) {
                Ok(l) => made.push((points(&group), l)),
                // One at a time, to say which functions could not be probed.
                Err(_) => {
                    for one in group.chunks(1) {
                        match uprobes.attach(ebpf, prog, &lib.open_path, &points(one), None) {
                            Ok(l) => made.push((points(one), l)),
                            Err(e) => {
                                let name = FUNCS[one[0].0].name;
                                failed.insert(one[0].0, format!("{name} ({prog}): {e:#}"));
                            }
                        }
                    }
                }
            }
            for (points, l) in made {
                if by == Switch::Calls {
                    calls.add(ebpf, prog, lib.open_path.clone(), points, l);
                } else if gated {
                    gate.add(
                        ebpf,
                        prog,
                        lib.layer == Layer::Runtime,
                        lib.open_path.clone(),
                        points,
                        l,
                    );
                } else {
                    links.extend(l);
                }
            }
        }
    }
    let attached = exported
        .iter()
        .filter(|(fid, _)| !failed.contains_key(fid))
        .map(|(fid, _)| FUNCS[*fid].name.to_string())
        .collect();
    (attached, failed.into_values().collect(), links)
}

impl ProbeFamily for CudaFamily {
    fn name(&self) -> &'static str {
        "CUDA"
    }

    fn configure<'a>(&'a self, loader: &mut aya::EbpfLoader<'a>) -> Result<()> {
        loader.override_global(GLOBAL_ENTRY_ONLY, &self.entry_only, true);
        Ok(())
    }

    fn preload(&self) -> Vec<crate::bpf::Preload> {
        vec![crate::bpf::Preload::plain("cuda_thread_exit")]
    }

    fn window_ended(&mut self, ebpf: &mut Ebpf, tracker: &Tracker) -> Result<()> {
        // The calls from here on go uncounted (the accounting has set ACCOUNT_STOPPED, first):
        // the budget's last tick is taken now, not once the report is under way, or its last
        // window would take in time and launches past the window's end.
        let (costs, trap) = self.gate.hit_costs(ebpf);
        self.calls.last_tick(ebpf, tracker.ended_at(), costs, trap);
        self.gate.last_tick(ebpf, tracker.ended_at());
        Ok(())
    }

    fn attach(&mut self, ebpf: &mut Ebpf, ctx: &AttachCtx<'_>) -> Result<()> {
        // Loaded with the session's other uprobe programs (`Uprobes::load`).
        self.uprobes = Some(ctx.uprobes.clone());
        // Before the first library is attached: the gate's first window needs the cost.
        self.gate.calibrate(ebpf, ctx.uprobes, ctx.args.verbose);
        let (costs, _) = self.gate.hit_costs(ebpf);
        self.calls.set_uprobes(ebpf, ctx.uprobes, costs);
        crate::bpf::attach_tracepoint(ebpf, "cuda_thread_exit", "sched", "sched_process_exit")?;
        for (path, layer) in self.overrides.clone() {
            let found = discover::from_path(&path, layer)?;
            let i = self.ensure(ebpf, found);
            self.named.push(i);
            if self.libs[i].attached.is_empty() {
                anyhow::bail!(
                    "{} exports none of the CUDA functions gputrace probes{}",
                    path.display(),
                    self.libs[i]
                        .failed
                        .first()
                        .map(|f| format!(" ({f})"))
                        .unwrap_or_default()
                );
            }
        }
        self.scan(ebpf, ctx.pids, true);
        self.events = Some(RingBuf::try_from(
            ebpf.take_map(EVENTS_MAP)
                .context("map CUDA_EVENTS missing")?,
        )?);
        self.nvml = Some(nvml::Sampler::start(self.nvml_interval));
        Ok(())
    }

    fn tick(&mut self, ebpf: &mut Ebpf, tracker: &Tracker) -> Result<()> {
        self.ticks += 1;
        // The copy and sync probes first: whether they were on all tick tells the launch
        // windows whether their copies and syncs were all counted.
        let (costs, trap) = self.gate.hit_costs(ebpf);
        self.calls.tick(ebpf, costs, trap);
        for path in self.calls.take_lost() {
            if !self.calls_lost.contains(&path) {
                self.calls_lost.push(path);
            }
        }
        self.gate.tick(ebpf, self.calls.exact());
        let lost = self.gate.take_lost();
        if !lost.is_empty() {
            self.launches_lost(ebpf, &lost);
        }
        let refused = self.note_window_failures();
        if !refused.is_empty() {
            self.runtime_text_again(ebpf, refused);
        }
        self.drain();
        if self.ticks.is_multiple_of(SCAN_EVERY_TICKS) {
            let live: Vec<u32> = tracker.running().map(|(pid, _)| pid).collect();
            self.scan(ebpf, &live, self.ticks.is_multiple_of(SCAN_ALL_EVERY_TICKS));
        }
        Ok(())
    }

    fn mapped(&mut self, ebpf: &mut Ebpf, pids: &[(u32, u64)]) -> Result<()> {
        // Before the library's first launch: its calls until the next scan would go uncounted.
        for &(pid, mapped_at) in pids {
            let known = self.libs.len();
            self.scan_only(ebpf, &[pid], false);
            let lag = crate::probes::ktime_now().saturating_sub(mapped_at) as f64 / 1e6;
            for lib in &self.libs[known..] {
                if self.verbose {
                    crate::note!(
                        "gputrace: probes on {} {lag:.1} ms after pid {pid} mapped it",
                        lib.found.path
                    );
                }
                match self.late.iter_mut().find(|(p, _, _)| *p == lib.found.path) {
                    Some(l) if l.2 < lag => *l = (lib.found.path.clone(), pid, lag),
                    Some(_) => {}
                    None => self.late.push((lib.found.path.clone(), pid, lag)),
                }
            }
        }
        Ok(())
    }

    fn ended(&mut self, ebpf: &mut Ebpf, tracker: &Tracker) {
        let launch_probed = self.libs.iter().any(|l| {
            l.attached
                .iter()
                .any(|a| table::by_name(a).is_some_and(|f| f.is_launch()))
        });
        self.gate
            .ended(ebpf, launch_probed, tracker.ended_at().is_some());
    }

    fn finish(
        &mut self,
        ebpf: &mut Ebpf,
        ctx: &mut FinishCtx<'_>,
        data: &mut ReportData,
    ) -> Result<()> {
        self.drain();
        let _ = self.note_window_failures();
        let mut api: Vec<(ApiKey, ApiVal)> = crate::batch::read(ebpf, API_MAP)?;
        // The accounting has stopped by now: what the thread states hold no longer moves.
        let states = crate::accounting::States::open(ebpf)
            .and_then(|s| s.all(ebpf))
            .context("read the thread states")?;
        aggregate::add_held_calls(&mut api, &states);
        let errs: Vec<(ErrKey, u64)> = crate::batch::read(ebpf, ERRS_MAP)?;
        let launches: Vec<(LaunchKey, LaunchVal)> = crate::batch::read(ebpf, LAUNCH_MAP)?;
        let copies: Vec<(CopyKey, CopyVal)> = crate::batch::read(ebpf, COPY_MAP)?;
        let pids: Vec<u32> = data.report.processes.iter().map(|p| p.pid).collect();
        for p in data.report.processes.iter_mut() {
            let pid = p.pid;
            let api_stats = aggregate::api_stats(pid, &api, &errs);
            let mut lib_ids: Vec<usize> = self
                .users
                .get(&pid)
                .map(|set| set.iter().copied().collect())
                .unwrap_or_default();
            // A process that exited before any scan saw its maps made its calls through the
            // named libraries, attached before it started.
            if !api_stats.is_empty() {
                lib_ids.extend(&self.named);
            }
            lib_ids.sort_unstable();
            lib_ids.dedup();
            let libraries: Vec<CudaLibrary> = lib_ids
                .into_iter()
                .map(|i| library_report(&self.libs[i]))
                .collect();
            if libraries.is_empty() && api_stats.is_empty() {
                continue;
            }
            let (maps, alive) = match ctx.tracker.procs.get(&pid) {
                Some(t) => (t.maps.as_slice(), !t.info.exited),
                None => (&[][..], false),
            };
            let raw = &self.raw;
            let sym = &mut *ctx.symbolizer;
            let kernels = aggregate::kernels(pid, &launches, |fid, func| {
                kernel_name(raw, sym, pid, maps, alive, fid, func)
            });
            let unnamed = kernels
                .iter()
                .filter(|k| k.name.starts_with(HANDLE_NAME))
                .count();
            if unnamed > 0 {
                // Seen on an H100 attached to a running PyTorch job: its runtime registered
                // every kernel (cuLibraryGetKernel) long before, and launches by handle.
                data.report.blind_spots.push(format!(
                    "{unnamed} of pid {pid}'s kernels are shown by handle: no symbol names their \
                     launch pointer and the process registered their names before gputrace \
                     attached; launched under gputrace (`gputrace -- CMD`), a job's kernels \
                     are named as it loads them"
                ));
            }
            let memory = raw
                .mem
                .get(&pid)
                .map(|m| m.finish(ctx.window_start_ktime))
                .unwrap_or_default();
            p.cuda = Some(ProcessCuda {
                libraries,
                api: api_stats,
                copies: aggregate::copy_stats(pid, &copies),
                kernels,
                memory,
                threads: aggregate::thread_stats(pid, &api),
            });
        }
        self.gate.finish(ebpf, data, ctx.tracker.ended_at());
        // What the probes add inside a timed call: the return's trap and program.
        let ((_, inside_ns), _) = self.gate.hit_costs(ebpf);
        self.calls.finish(data, inside_ns);
        for path in &self.calls_lost {
            data.report.blind_spots.push(format!(
                "{}: a window of the budget's copy and sync probes could not attach them again \
                 (the library unmapped or its file gone?): its copies and syncs after that went \
                 unseen",
                path.display()
            ));
        }
        for (lib, pid, lag) in &self.late {
            data.report.blind_spots.push(format!(
                "{lib} was probed {lag:.1} ms after pid {pid} mapped it (found as it was mapped): \
                 the CUDA calls made through it in between were not seen"
            ));
        }
        for (pid, path, layer) in unprobed_openers(ebpf, ctx.tracker, &self.users) {
            let comm = ctx
                .tracker
                .procs
                .get(&pid)
                .map(|t| format!(" ({})", t.info.comm))
                .unwrap_or_default();
            let option = match layer {
                Layer::Runtime => "--libcudart",
                Layer::Driver => "--libcuda",
            };
            data.report.blind_spots.push(format!(
                "pid {pid}{comm} opened {path} and exited before gputrace saw it in its maps: \
                 the library was not probed for it, and its calls through it were not seen \
                 ({option} {path} probes it from the first call)"
            ));
        }
        for l in self.libs.iter().filter(|l| l.found.embedded) {
            data.report.blind_spots.push(format!(
                "{} carries its own CUDA runtime (statically linked); probed through its \
                 symbol table",
                l.found.path
            ));
        }
        if !self.libs.is_empty() {
            data.report.blind_spots.push(
                "CUDA runtimes linked statically into stripped objects (no symbol table) are \
                 not probed; their work is still seen at the driver (libcuda)"
                    .into(),
            );
        }
        for l in &self.libs {
            for f in &l.failed {
                data.report
                    .blind_spots
                    .push(format!("CUDA probe not attached in {}: {f}", l.found.path));
            }
        }
        data.report.warnings.append(&mut self.warnings);
        timeline_names::name_kernels(&self.raw, ctx, &mut data.timeline);
        if let Some(s) = self.nvml.take() {
            data.report.nvml = Some(s.finish(ctx.window_start_ktime, &pids));
        }
        Ok(())
    }
}

fn library_report(l: &Lib) -> CudaLibrary {
    CudaLibrary {
        path: l.found.path.clone(),
        kind: l.found.layer.name().into(),
        attached: l.attached.clone(),
        failed: l.failed.clone(),
    }
}

/// A launched kernel's name: the registered device name of a runtime host stub, else the stub's
/// symbol in whichever object it lives; for a driver handle the name given at
/// cuModuleGetFunction / cuLibraryGetKernel; else `library+offset` or the handle.
fn kernel_name(
    raw: &RawEvents,
    sym: &mut crate::symbolize::Symbolizer,
    pid: u32,
    maps: &[procfs::Mapping],
    alive: bool,
    fid: u32,
    func: u64,
) -> String {
    let mut handle = func;
    let mut cut = None;
    for _ in 0..4 {
        if let Some(n) = raw.names.get(&(pid, handle)) {
            if !n.ends_with(TRUNCATED_NAME) {
                return aggregate::demangle(n);
            }
            // A cut name: the stub's own symbol has all of it (below), else the cut name
            // and the handle, which tells it from another kernel cut alike.
            cut = Some(format!("{n} [{HANDLE_NAME}{func:x}]"));
            break;
        }
        match raw.aliases.get(&(pid, handle)) {
            Some(&k) => handle = k,
            None => break,
        }
    }
    let runtime = table::func(fid).is_some_and(|f| f.layer == Layer::Runtime);
    let mapping = crate::symbolize::find_mapping(maps, func);
    if let Some(m) = mapping.filter(|_| runtime) {
        let f = sym.user(pid, maps, alive, &[func]);
        if let Some(f) = f.into_iter().next() {
            // A library's code no symbol covers is one `[library]` frame for the profile;
            // a kernel there is told from the others by its offset.
            let placeholder = crate::symbolize::names_only_its_module(&f.name, f.module.as_deref());
            if f.name != "[unknown]" && !placeholder {
                return aggregate::demangle(&f.name);
            }
            if placeholder && cut.is_none() {
                return format!(
                    "{}+{:#x}",
                    f.module.unwrap_or_default(),
                    func - m.start + m.offset
                );
            }
        }
    }
    cut.unwrap_or_else(|| format!("{HANDLE_NAME}{func:x}"))
}

/// Exited processes that mapped code and opened a CUDA library (by the paths the syscall
/// programs kept, `FD_NAMES`) that no scan of their maps found: a CUDA program that failed and
/// exited within milliseconds (an nvcc binary on a box without a driver) left no trace.
fn unprobed_openers(
    ebpf: &Ebpf,
    tracker: &Tracker,
    users: &BTreeMap<u32, HashSet<usize>>,
) -> Vec<(u32, String, Layer)> {
    let gone: HashSet<u32> = tracker
        .mapped_ever
        .iter()
        .copied()
        .filter(|pid| !users.contains_key(pid))
        .filter(|pid| tracker.procs.get(pid).is_none_or(|t| t.info.exited))
        .collect();
    if gone.is_empty() {
        return Vec::new();
    }
    let Some(names) = crate::accounting::fill::opened_paths(ebpf) else {
        return Vec::new();
    };
    let mut out: Vec<(u32, String, Layer)> = names
        .iter()
        .filter_map(Result::ok)
        .filter(|n| gone.contains(&n.key.tgid))
        .filter_map(|n| {
            let path = String::from_utf8_lossy(n.bytes()).into_owned();
            discover::classify(&path).map(|layer| (n.key.tgid, path, layer))
        })
        .collect();
    out.sort_by(|a, b| (a.0, &a.1).cmp(&(b.0, &b.1)));
    out.dedup_by(|a, b| (a.0, &a.1) == (b.0, &b.1));
    out
}

/// How a kernel no name was found for is shown: its launch handle or pointer.
const HANDLE_NAME: &str = "handle 0x";

/// The end of a kernel name the kernel side cut at `NAME_BYTES - 1` bytes.
const TRUNCATED_NAME: char = '…';

#[cfg(test)]
mod tests {
    use super::runtime_launches_probed;

    #[test]
    fn a_runtimes_launches_count_as_probed_only_when_none_failed() {
        let s = |v: &[&str]| v.iter().map(|x| x.to_string()).collect::<Vec<_>>();
        let attached = s(&["cudaLaunchKernel", "cudaLaunchKernel_ptsz", "cudaMemcpy"]);
        assert!(runtime_launches_probed(&attached, &[]));
        // A copy that failed does not matter; a launch that failed does.
        assert!(runtime_launches_probed(
            &attached,
            &s(&["cudaMemcpy2D (cuda_entry): refused"])
        ));
        assert!(!runtime_launches_probed(
            &s(&["cudaLaunchKernel_ptsz", "cudaMemcpy"]),
            &s(&["cudaLaunchKernel (cuda_ret): refused"])
        ));
        // No launch function probed at all (the library's symbols unread, or copies only).
        assert!(!runtime_launches_probed(&s(&["cudaMemcpy"]), &[]));
        assert!(!runtime_launches_probed(
            &[],
            &s(&["/x/libcudart.so.12: no symbols"])
        ));
        // The driver's launches are not the runtime's.
        assert!(!runtime_launches_probed(&s(&["cuLaunchKernel"]), &[]));
    }
}
