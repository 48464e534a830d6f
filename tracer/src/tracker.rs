//! What user space knows of each traced process: names, parent, exit, and a snapshot of its
//! memory maps taken while it was alive (for symbolisation after it exits).

use std::collections::BTreeMap;

use tracer_common::proc::{ProcEvent, ProcEventKind};

use crate::{
    procfs::{self, Mapping},
    report::build::ProcessInfo,
};

#[derive(Debug, Clone, Default)]
pub struct Tracked {
    pub info: ProcessInfo,
    pub maps: Vec<Mapping>,
    /// Maps must be read again (new process, exec).
    pub maps_stale: bool,
}

#[derive(Debug, Default)]
pub struct Tracker {
    /// Fork/exec/exit events as they came, for the timeline (bounded by
    /// `report::timeline::LIFECYCLE_MAX`: a fork storm must not grow memory unbounded).
    pub lifecycle: Vec<ProcEvent>,
    pub procs: BTreeMap<u32, Tracked>,
    pub exited_roots: Vec<u32>,
    pub roots: Vec<u32>,
    pub events: u64,
}

impl Tracker {
    pub fn new(roots: &[u32]) -> Self {
        Self {
            roots: roots.to_vec(),
            ..Default::default()
        }
    }

    /// Starts tracking a process that exists now (roots, pre-existing descendants, forks).
    pub fn add(&mut self, pid: u32, ppid: Option<u32>) {
        let t = self.procs.entry(pid).or_default();
        t.info.pid = pid;
        if t.info.ppid.is_none() {
            t.info.ppid = ppid.or_else(|| procfs::stat(pid).map(|s| s.ppid));
        }
        t.maps_stale = true;
        Self::refresh_names(pid, t);
    }

    fn refresh_names(pid: u32, t: &mut Tracked) {
        if let Some(c) = procfs::comm(pid) {
            t.info.comm = c;
        }
        if let Some(c) = procfs::cmdline(pid) {
            if !c.is_empty() {
                t.info.cmdline = c;
            }
        }
    }

    pub fn on_event(&mut self, ev: &ProcEvent) {
        self.events += 1;
        if self.lifecycle.len() < crate::report::timeline::LIFECYCLE_MAX {
            self.lifecycle.push(*ev);
        }
        match ProcEventKind::from_u32(ev.kind) {
            Some(ProcEventKind::Fork) => {
                self.add(ev.pid, Some(ev.ppid));
                // Until it execs the child runs its parent's code: start from the parent's maps.
                if let Some(parent_maps) = self.procs.get(&ev.ppid).map(|p| p.maps.clone()) {
                    if let Some(t) = self.procs.get_mut(&ev.pid) {
                        if t.maps.is_empty() {
                            t.maps = parent_maps;
                        }
                    }
                }
            }
            Some(ProcEventKind::Exec) => {
                let t = self.procs.entry(ev.pid).or_default();
                t.info.pid = ev.pid;
                t.maps_stale = true;
                Self::refresh_names(ev.pid, t);
            }
            Some(ProcEventKind::Exit) => {
                self.mark_exited(ev.pid);
            }
            Some(ProcEventKind::ThreadExit) | None => {}
        }
    }

    pub fn mark_exited(&mut self, pid: u32) {
        if let Some(t) = self.procs.get_mut(&pid) {
            t.info.exited = true;
        }
        if self.roots.contains(&pid) && !self.exited_roots.contains(&pid) {
            self.exited_roots.push(pid);
        }
    }

    pub fn all_roots_exited(&self) -> bool {
        self.roots.iter().all(|r| self.exited_roots.contains(r))
    }

    /// Re-reads maps: the stale ones, or all live ones when `all`.
    pub fn refresh_maps(&mut self, all: bool) {
        for (pid, t) in self.procs.iter_mut() {
            if t.info.exited || !(all || t.maps_stale) {
                continue;
            }
            match procfs::read_maps(*pid) {
                Some(m) if !m.is_empty() => {
                    t.maps = m;
                    t.maps_stale = false;
                    Self::refresh_names(*pid, t);
                }
                _ => {}
            }
        }
    }

    /// Checks liveness of processes whose exit event may have been lost.
    pub fn poll_liveness(&mut self) {
        let dead: Vec<u32> = self
            .procs
            .iter()
            .filter(|(pid, t)| !t.info.exited && !procfs::is_alive(**pid))
            .map(|(pid, _)| *pid)
            .collect();
        for pid in dead {
            self.mark_exited(pid);
        }
    }

    pub fn infos(&self) -> BTreeMap<u32, ProcessInfo> {
        self.procs
            .iter()
            .map(|(pid, t)| (*pid, t.info.clone()))
            .collect()
    }
}
