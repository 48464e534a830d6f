//! CPU samples from the kernel's counts (`CPU_COUNTS`) to symbolised stacks: at the end of
//! the trace, and while it runs for the processes that exited.
//!
//! An exited process is symbolised with the maps the tracker kept of it, and it keeps those
//! of the last [`crate::tracker::MAX_EXITED_MAPS`] to exit only. Read at the end, the samples
//! of a job that runs a program every few seconds (a shell-out, `nvidia-smi`) had user
//! frames for the last 256 such programs, and `[unknown]` for the others. So once 128
//! processes exited since the last look, the rows of the exited processes are taken out of
//! the map and symbolised at once (`Exited`), which also leaves the map's 65,536 rows to the
//! processes still running. Past [`MAX_EXITED_ROWS`] rows, each new one is folded into a row
//! of its command and stack ([`FOLDED_TID`]): an hour of a shell loop's short processes had
//! left its rows in the map, which filled, and 73,695 samples were lost. What this misses is
//! symbolised at the end as before, or not at all: more than ~128 exits in one tick (100 ms)
//! before a look, and rows with a Python stack, of processes whose maps were dropped by then.

use std::{cell::Cell, collections::BTreeSet};

use anyhow::{Context, Result};
use aya::{
    maps::{HashMap, MapData},
    Ebpf,
};
use tracer_common::{
    cpu::{SampleKey, CPU_COUNTS_MAP},
    python::PY_STACK_PENDING,
};

use crate::{
    aggregate::cpu::{CpuProfile, StackSample},
    collect::{self, RawSample},
    symbolize::Symbolizer,
    tracker::{max_exited_maps, Life, Tracker},
};

/// Rows of exited processes' samples kept symbolised, each its own (~2 KB each, ~35 MB). Past
/// it, a sample is folded into a row of its command and stack, one per such pair, under the
/// first process's pid and tid [`FOLDED_TID`]. `GPUTRACE_MAX_EXITED_SAMPLES` lowers it, for
/// tests.
pub const MAX_EXITED_ROWS: usize = 16_384;

/// The tid of the rows exited processes' samples are folded into past [`MAX_EXITED_ROWS`]:
/// no thread's (the idle task's), as the time rows of exited threads are.
pub use crate::accounting::aggregate::FOLDED_TID;

fn max_exited_rows() -> usize {
    crate::env_cap("GPUTRACE_MAX_EXITED_SAMPLES", MAX_EXITED_ROWS)
}

/// The samples of exited processes taken so far, and the symboliser the trace keeps (its
/// caches serve the end's symbolisation too).
pub struct Exited {
    samples: Vec<StackSample>,
    sym: Symbolizer,
    python: crate::python::Python,
    /// Exits since the last pass.
    exits: usize,
    /// The processes that exited since the last pass, as the ring told (less those whose pid
    /// a later fork took): those the tracker forgot too. Their rows had stayed in the map to
    /// the end, and each pass listed them again: under a shell loop the map's rows, and the
    /// passes' kernel time, grew all through the trace (3,355 rows listed in 3 s at 22 s,
    /// 12,627 at 125 s).
    gone: BTreeSet<u32>,
    max_rows: usize,
    /// Past `max_rows`: the folded rows, by a hash of (command, stack, kernel mode), at their
    /// index in `samples` (not a copy of each stack); and how many samples went into them.
    folded: std::collections::HashMap<u64, Vec<usize>>,
    folded_samples: u64,
    /// Why a pass failed, if one did: the later ones are not tried, and the rows are read at
    /// the end (those that pass took too, from `unread`).
    failed: Option<String>,
    unread: Vec<RawSample>,
}

impl Exited {
    pub fn new(python: crate::python::Python) -> Self {
        Self {
            samples: Vec::new(),
            sym: Symbolizer::new(),
            exits: 0,
            gone: BTreeSet::new(),
            python,
            max_rows: max_exited_rows(),
            folded: std::collections::HashMap::new(),
            folded_samples: 0,
            failed: None,
            unread: Vec::new(),
        }
    }

    /// At a tick: once half as many processes exited since the last pass as the tracker keeps
    /// the maps of, takes the rows of every exited process it knows (those that exited
    /// before too, for samples counted as they exited) and of those that exited since the
    /// last pass and it forgot, and symbolises them; returns whether
    /// it ran `drain` (the process events the ring holds), which it does between the two.
    /// Not sooner: the first pass loads the kernel's symbols and the programs' (~30 ms here,
    /// ~300 ms in a debug build), and a program that execs and exits while the event loop
    /// waits for it has its maps read too late; a trace with few exits never pays that. Rows
    /// with a Python stack stay: their frames are merged at the end, from what the Python
    /// family read by then. (A process gone before it was classified has
    /// `PY_STACK_PENDING`: native frames only, as at the end.)
    pub fn tick(
        &mut self,
        ebpf: &mut Ebpf,
        tracker: &mut Tracker,
        drain: impl FnOnce(&mut Tracker),
    ) -> bool {
        if self.failed.is_some() {
            return false;
        }
        self.note_gone(&tracker.lives);
        if self.exits < (max_exited_maps() / 2).max(1) {
            return false;
        }
        self.exits = 0;
        if let Err(e) = self.pass(ebpf, tracker, drain) {
            self.failed = Some(format!("{e:#}"));
        }
        true
    }

    fn pass(
        &mut self,
        ebpf: &mut Ebpf,
        tracker: &mut Tracker,
        drain: impl FnOnce(&mut Tracker),
    ) -> Result<()> {
        let mut exited: BTreeSet<u32> = tracker
            .procs
            .iter()
            .filter(|(_, t)| t.info.exited)
            .map(|(pid, _)| *pid)
            .collect();
        let gone = std::mem::take(&mut self.gone);
        exited.extend(&gone);
        // At most `max_rows` a pass: one pass could take the whole map (65,536 rows).
        let room = Cell::new(self.max_rows);
        let mut map: HashMap<&mut MapData, SampleKey, u64> = HashMap::try_from(
            ebpf.map_mut(CPU_COUNTS_MAP)
                .context("map CPU_COUNTS missing")?,
        )?;
        let rows: Vec<RawSample> = crate::accounting::take::take(&mut map, |k| {
            let pick = room.get() > 0
                && (k.py_stack == 0 || k.py_stack == PY_STACK_PENDING)
                && exited.contains(&k.pid);
            if pick {
                room.set(room.get() - 1);
            }
            pick
        })
        .into_iter()
        .map(|(key, count)| RawSample { key, count })
        .collect();
        if room.get() == 0 {
            // Their rows may not all have fit: the next pass looks again.
            self.gone.extend(gone);
        }
        if rows.is_empty() {
            return Ok(());
        }
        // A pid the tracker had as exited may have been taken by a new process since the ring
        // was last read (the pids wrapped): its rows went with the old one's. With its fork
        // read now, they are symbolised as the new process's, as at the end.
        let before = tracker.lives.len();
        drain(tracker);
        self.note_gone(&tracker.lives[before..]);
        self.sym.use_held(tracker.held.paths());
        self.sym.use_perf_maps(tracker.held.perf_map_paths());
        match symbolize(ebpf, tracker, &rows, &mut self.sym, &self.python) {
            Ok(cpu) => {
                for s in cpu.samples {
                    self.keep(s);
                }
            }
            Err(e) => {
                // Out of the map already: read with the rest at the end.
                self.unread = rows;
                return Err(e);
            }
        }
        Ok(())
    }

    /// Counts and notes the exits in `lives` (this tick's forks and exits, in order), and
    /// forgets a pid a fork took again: the new process's rows are not the gone one's.
    fn note_gone(&mut self, lives: &[Life]) {
        for l in lives {
            match l {
                Life::Exited(pid) => {
                    self.exits += 1;
                    self.gone.insert(*pid);
                }
                Life::Forked(pid) => {
                    self.gone.remove(pid);
                }
            }
        }
    }

    /// Keeps sample `s`: its own row up to `max_rows`, past them folded into its command's
    /// and stack's.
    fn keep(&mut self, s: StackSample) {
        if self.samples.len() < self.max_rows {
            self.samples.push(s);
            return;
        }
        use std::hash::{Hash, Hasher};
        self.folded_samples += s.count;
        let mut h = std::collections::hash_map::DefaultHasher::new();
        (&s.comm, &s.frames, s.kernel_mode).hash(&mut h);
        let same = self.folded.entry(h.finish()).or_default();
        let samples = &mut self.samples;
        let found = same.iter().copied().find(|&i| {
            let f = &samples[i];
            f.comm == s.comm && f.frames == s.frames && f.kernel_mode == s.kernel_mode
        });
        match found {
            Some(i) => samples[i].count += s.count,
            None => {
                same.push(samples.len());
                samples.push(StackSample {
                    tid: FOLDED_TID,
                    ..s
                });
            }
        }
    }

    /// The user stack ids of the rows taken but not symbolised (a pass failed): read at the
    /// end, their stacks are held (`crate::young`).
    pub fn unread_stacks(&self) -> impl Iterator<Item = i32> + '_ {
        self.unread.iter().map(|s| s.key.user_stack_id)
    }

    /// The samples taken, the symboliser, and why the passes stopped if they failed.
    pub fn finish(self) -> Finished {
        let folded = (self.folded_samples > 0).then(|| {
            format!(
                "to bound memory, {} CPU samples of exited processes, past {} rows of them, \
                 were folded by command and stack: in cpu.folded under the first such \
                 process's pid, thread 0",
                self.folded_samples, self.max_rows
            )
        });
        Finished {
            samples: self.samples,
            unread: self.unread,
            sym: self.sym,
            failed: self.failed,
            folded,
        }
    }
}

/// What [`Exited`] leaves for the end.
pub struct Finished {
    /// Symbolised.
    pub samples: Vec<StackSample>,
    /// Taken by a pass that failed before it symbolised them.
    pub unread: Vec<RawSample>,
    pub sym: Symbolizer,
    pub failed: Option<String>,
    /// What was folded past [`MAX_EXITED_ROWS`], as a warning.
    pub folded: Option<String>,
}

/// Turns the kernel's (pid, tid, stack ids) counts into symbolised stacks.
pub fn symbolize(
    ebpf: &Ebpf,
    tracker: &Tracker,
    samples: &[RawSample],
    sym: &mut Symbolizer,
    python: &crate::python::Python,
) -> Result<CpuProfile> {
    let mut stacks = collect::Stacks::new(ebpf)?;
    let mut out = Vec::with_capacity(samples.len());
    for s in samples {
        let pid = s.key.pid;
        let (maps, earlier) = tracker.maps_for_image(pid, s.key.exec_id);
        // An earlier image's files are not behind the process's map_files now (another image
        // maps those ranges): they are read as an exited process's are.
        let alive = !earlier && tracker.procs.get(&pid).is_some_and(|t| !t.info.exited);
        let mut frames = Vec::new();
        if let Some(ips) = stacks.user(s.key.user_stack_id).map(<[u64]>::to_vec) {
            let mut user = sym.user(pid, maps, alive, &ips);
            user.reverse();
            frames.extend(user);
        }
        let mut frames = python.merge(pid, s.key.py_stack, frames);
        let kernel_mode = in_kernel(s.key.kernel_stack_id);
        if let Some(ips) = stacks.kernel(s.key.kernel_stack_id).map(<[u64]>::to_vec) {
            let mut k = sym.kernel(&ips);
            k.reverse();
            frames.extend(k);
        }
        out.push(StackSample {
            pid,
            tid: s.key.tid,
            comm: crate::session::comm_str(&s.key.comm),
            frames,
            count: s.count,
            kernel_mode,
        });
    }
    Ok(CpuProfile::from_samples(out))
}

/// Whether a sample with kernel stack `id` was taken in kernel mode: in user mode there is no
/// kernel stack to walk (-EFAULT); any other error (its slot taken, -EEXIST; the map full,
/// -ENOMEM) is of a stack that was there.
fn in_kernel(id: i32) -> bool {
    id != -libc::EFAULT
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_kernel_stack_that_lost_its_slot_is_still_kernel_mode() {
        assert!(in_kernel(0) && in_kernel(4000) && in_kernel(-17) && in_kernel(-12));
        assert!(!in_kernel(-14));
    }

    #[test]
    fn a_gone_process_is_taken_unless_a_fork_took_its_pid_again() {
        let mut e = Exited::new(crate::python::Python::default());
        e.note_gone(&[Life::Exited(7), Life::Forked(8), Life::Exited(9)]);
        assert_eq!(e.gone, BTreeSet::from([7, 9]));
        // Pid 7 came back: its rows are the new process's now.
        e.note_gone(&[Life::Forked(7), Life::Exited(8)]);
        assert_eq!(e.gone, BTreeSet::from([8, 9]));
        assert_eq!(e.exits, 3);
    }
}
