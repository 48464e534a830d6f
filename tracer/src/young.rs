//! The user stacks of processes under a second old (`tracer_common::cpu::YOUNG_STACKS_MAPS`):
//! two maps, the programs putting new stacks in one of them. A stack map never frees a slot
//! by itself, and every short process's stacks are new ones (its libraries sit at other
//! addresses), so one map filled under a shell loop and the later processes' stacks were
//! lost (20,000 programs of 1 ms: 40% of their samples named, 92% with the switches).
//!
//! Once the programs took a sixteenth of a map's slots in stacks since the last switch (and
//! [`MIN_SWITCH`] after it), [`Young::tick`] frees in the map they do not use the stacks that
//! nothing holds any more, then switches them to it. What holds a stack id: sample rows
//! (`CPU_COUNTS`), time rows (`WALL`), the thread states (a wait or CUDA call not yet written
//! out, reusable walks), and rows gputrace took out of the maps unread. A grace period passed
//! since the programs left that map (the previous switch waits for one): none is still
//! between taking an id there and storing it.
//!
//! Rows that leave the maps for gputrace's memory before the end (dead threads' time rows,
//! `accounting::retire`) take a copy of their young stack with them ([`Copies`]), and no longer
//! hold its slot; the exited processes' sample rows are symbolised as they are taken
//! (`cpu_samples::Exited`).

use std::{
    collections::{HashMap, HashSet},
    rc::Rc,
    sync::{
        atomic::{AtomicBool, Ordering},
        Arc,
    },
    time::{Duration, Instant},
};

use anyhow::{Context, Result};
use aya::{
    maps::{Array, HashMap as BpfHashMap, MapData, PerCpuArray, StackTraceMap},
    Ebpf,
};
use tracer_common::{
    cpu::{
        SampleKey, UserStack, CPU_COUNTS_MAP, YOUNG_CTL_MAP, YOUNG_STACKS_ENTRIES,
        YOUNG_STACKS_MAPS, YOUNG_TAKEN_MAP,
    },
    wall::{WallKey, WallVal, WALL_MAP},
};

/// Least time between two switches: each one reads every thread state and the keys of every
/// sample and time row (~2 ms under a shell loop here).
const MIN_SWITCH: Duration = Duration::from_millis(250);

/// Bytes of stacks copied out of the maps kept at most (a stack is 8 bytes a frame, up to 127
/// frames): past it, a row that leaves the maps goes without its young stack (counted).
/// `GPUTRACE_MAX_YOUNG_COPY_BYTES` lowers it, for tests.
pub const MAX_COPY_BYTES: usize = 64 << 20;

/// Slots each young map has: `GPUTRACE_YOUNG_STACKS` lowers it, for tests that fill the maps
/// in seconds.
pub fn capacity() -> u32 {
    crate::env_cap("GPUTRACE_YOUNG_STACKS", YOUNG_STACKS_ENTRIES as usize).max(1) as u32
}

/// Whether to switch maps: `taken` stacks given since the last switch, `since` it. A new stack
/// collides with those of its map at the map's fill: ~1,000 new stacks between switches in
/// 8,192 slots lost ~6% of them, half that many ~3%.
fn due(taken: u64, since: Duration, capacity: u32) -> bool {
    since >= MIN_SWITCH && taken >= u64::from(capacity / 16).max(1)
}

/// What the switches did, for the report.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Switched {
    pub switches: u64,
    /// Stacks freed from the maps left behind.
    pub freed: u64,
}

pub struct Young {
    /// The map the programs put new stacks in.
    current: usize,
    /// The stacks taken (`YOUNG_TAKEN`) as of the last switch, and when it was.
    taken_then: u64,
    switched_at: Instant,
    capacity: u32,
    /// Whether a grace period passed since the last switch: the map left is no program's.
    settled: Arc<AtomicBool>,
    pub done: Switched,
    /// Why a switch failed: no more are tried (the programs stay on their map, which fills as
    /// before), and the report says so.
    pub failed: Option<String>,
}

impl Default for Young {
    fn default() -> Self {
        Self::new()
    }
}

impl Young {
    pub fn new() -> Self {
        Self {
            current: 0,
            taken_then: 0,
            switched_at: Instant::now(),
            capacity: capacity(),
            settled: Arc::new(AtomicBool::new(true)),
            done: Switched::default(),
            failed: None,
        }
    }

    /// At a tick: switches maps when due. `more` are the ids of rows gputrace holds unread.
    pub fn tick(&mut self, ebpf: &mut Ebpf, more: impl IntoIterator<Item = i32>) {
        if self.failed.is_some() {
            return;
        }
        let taken = match taken(ebpf) {
            Ok(n) => n,
            Err(e) => {
                self.failed = Some(format!("{e:#}"));
                return;
            }
        };
        if !self.settled.load(Ordering::Acquire)
            || !due(
                taken.wrapping_sub(self.taken_then),
                self.switched_at.elapsed(),
                self.capacity,
            )
        {
            return;
        }
        match self.switch(ebpf, more) {
            Ok(()) => {
                self.taken_then = taken;
                self.switched_at = Instant::now();
            }
            Err(e) => self.failed = Some(format!("{e:#}")),
        }
    }

    /// Frees what nothing holds in the map the programs do not use, and switches them to it.
    fn switch(&mut self, ebpf: &mut Ebpf, more: impl IntoIterator<Item = i32>) -> Result<()> {
        let next = 1 - self.current;
        let held = held(ebpf, next, more)?;
        let name = YOUNG_STACKS_MAPS[next];
        let mut map = StackTraceMap::try_from(
            ebpf.map_mut(name)
                .with_context(|| format!("map {name} missing"))?,
        )
        .with_context(|| format!("open map {name}"))?;
        // A slot the listing misses is not freed: no harm.
        let ids: Vec<u32> = map.stack_ids().filter_map(Result::ok).collect();
        let free = unheld(&ids, &held);
        for id in &free {
            // A slot listed is there until we delete it: nothing else deletes.
            map.remove(id)
                .with_context(|| format!("free stack {id} of {name}"))?;
        }
        self.done.freed += free.len() as u64;
        let mut c: Array<&mut MapData, u64> = Array::try_from(
            ebpf.map_mut(YOUNG_CTL_MAP)
                .with_context(|| format!("map {YOUNG_CTL_MAP} missing"))?,
        )
        .with_context(|| format!("open map {YOUNG_CTL_MAP}"))?;
        c.set(0, next as u64, 0)
            .with_context(|| format!("write {YOUNG_CTL_MAP}"))?;
        self.current = next;
        self.done.switches += 1;
        // A program that read the old choice may still be taking a stack there: after a grace
        // period (they run under RCU) none is, and the map left can be freed. Waited for on a
        // thread of its own (5-20 ms here, the event loop's time otherwise). Where the kernel
        // refuses membarrier, a second stands in (a program runs for microseconds).
        self.settled.store(false, Ordering::Release);
        let settled = Arc::clone(&self.settled);
        let wait = move || {
            if !crate::bpf::grace_period() {
                std::thread::sleep(Duration::from_secs(1));
            }
            settled.store(true, Ordering::Release);
        };
        if let Err(e) = std::thread::Builder::new()
            .name("gputrace-grace".into())
            .spawn(wait)
        {
            crate::note!("gputrace: no thread for the young stacks' grace period ({e}): waiting");
            if !crate::bpf::grace_period() {
                std::thread::sleep(Duration::from_secs(1));
            }
            self.settled.store(true, Ordering::Release);
        }
        Ok(())
    }
}

/// The young stacks the programs took so far, all CPUs'.
fn taken(ebpf: &Ebpf) -> Result<u64> {
    let map: PerCpuArray<&MapData, u64> = PerCpuArray::try_from(
        ebpf.map(YOUNG_TAKEN_MAP)
            .with_context(|| format!("map {YOUNG_TAKEN_MAP} missing"))?,
    )
    .with_context(|| format!("open map {YOUNG_TAKEN_MAP}"))?;
    let per_cpu = map
        .get(&0, 0)
        .with_context(|| format!("read {YOUNG_TAKEN_MAP}"))?;
    Ok(per_cpu.iter().sum())
}

/// The slots of young map `map` that a row or state holds (see the module's docs). The map
/// takes no new stacks, so its ids only move from thread states to time rows (a wait or CUDA
/// call written out): the states are read first, each a copy taken whole
/// (`States::all_settled`), and an id that moves after that read was in them. A listing cut
/// short fails the switch: what it missed would be freed.
fn held(ebpf: &Ebpf, map: usize, more: impl IntoIterator<Item = i32>) -> Result<HashSet<u32>> {
    let states = crate::accounting::States::open(ebpf)
        .and_then(|s| s.all_settled(ebpf))
        .context("read the thread states")?;
    let time: BpfHashMap<&MapData, WallKey, WallVal> = BpfHashMap::try_from(
        ebpf.map(WALL_MAP)
            .with_context(|| format!("map {WALL_MAP} missing"))?,
    )?;
    let time = crate::batch::try_keys(&time).with_context(|| format!("list {WALL_MAP}"))?;
    let samples: BpfHashMap<&MapData, SampleKey, u64> = BpfHashMap::try_from(
        ebpf.map(CPU_COUNTS_MAP)
            .with_context(|| format!("map {CPU_COUNTS_MAP} missing"))?,
    )?;
    let samples =
        crate::batch::try_keys(&samples).with_context(|| format!("list {CPU_COUNTS_MAP}"))?;
    let ids = states
        .iter()
        .flat_map(|(_, st)| st.user_stacks())
        .chain(time.into_iter().map(|k| k.ustack))
        .chain(samples.into_iter().map(|k| k.user_stack_id))
        .chain(more);
    Ok(slots_of(map, ids))
}

/// The slots in young map `map` of stack ids `ids`.
fn slots_of(map: usize, ids: impl IntoIterator<Item = i32>) -> HashSet<u32> {
    ids.into_iter()
        .filter_map(|id| match UserStack::of(id) {
            UserStack::Young { map: m, slot } if m == map => Some(slot),
            _ => None,
        })
        .collect()
}

/// The ids of `ids` nothing holds.
fn unheld(ids: &[u32], held: &HashSet<u32>) -> Vec<u32> {
    ids.iter()
        .copied()
        .filter(|id| !held.contains(id))
        .collect()
}

/// Young stacks copied out of their maps, with the rows that held them, by content: a copy
/// per distinct stack. Ids `UserStack::copied(index)`.
#[derive(Default)]
pub struct Copies {
    stacks: Vec<Rc<[u64]>>,
    index: HashMap<Rc<[u64]>, u32>,
    bytes: usize,
    /// Rows that went without their young stack past the copies' room.
    pub not_copied: u64,
    /// Rows whose young stack was not in its map when they left it: none, unless a stack
    /// was freed while they held it (said in the report).
    pub missing: u64,
}

impl Copies {
    /// Copy `id`'s stack.
    pub fn get(&self, id: u32) -> Option<&[u64]> {
        self.stacks.get(id as usize).map(|s| &**s)
    }

    pub fn len(&self) -> usize {
        self.stacks.len()
    }

    pub fn is_empty(&self) -> bool {
        self.stacks.is_empty()
    }

    /// The id that stands for user stack `id` once its row leaves the maps: a young stack's
    /// copy (read from `stacks`: without them, none), any other id as it is.
    pub fn keep(&mut self, id: i32, stacks: Option<&mut crate::collect::Stacks<'_>>) -> i32 {
        if !matches!(UserStack::of(id), UserStack::Young { .. }) {
            return id;
        }
        match stacks.and_then(|s| s.user(id)) {
            Some(ips) => self.insert(ips.to_vec()),
            None => {
                self.missing += 1;
                -libc::ENOENT
            }
        }
    }

    /// The copy id of stack `ips`, or -ENOSPC (counted) past the room for copies.
    fn insert(&mut self, ips: Vec<u64>) -> i32 {
        if let Some(&i) = self.index.get(ips.as_slice()) {
            return UserStack::copied(i).unwrap_or(-libc::ENOSPC);
        }
        let size = std::mem::size_of_val(ips.as_slice());
        let room = self.bytes + size <= max_copy_bytes();
        match UserStack::copied(self.stacks.len() as u32).filter(|_| room) {
            Some(id) => {
                let ips: Rc<[u64]> = ips.into();
                self.index.insert(ips.clone(), self.stacks.len() as u32);
                self.stacks.push(ips);
                self.bytes += size;
                id
            }
            None => {
                self.not_copied += 1;
                -libc::ENOSPC
            }
        }
    }
}

fn max_copy_bytes() -> usize {
    crate::env_cap("GPUTRACE_MAX_YOUNG_COPY_BYTES", MAX_COPY_BYTES)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn maps_switch_once_a_sixteenth_was_taken_and_a_while_passed() {
        let s = MIN_SWITCH;
        assert!(due(512, s, 8192));
        assert!(!due(511, s * 10, 8192));
        assert!(!due(100_000, s - Duration::from_millis(1), 8192));
        // A map of a few slots (a test's) switches at every stack.
        assert!(due(1, s, 4));
        assert!(!due(0, s, 4));
    }

    #[test]
    fn only_the_left_maps_stacks_nothing_holds_are_freed() {
        let ids = [
            UserStack::young(1, 3),
            UserStack::young(0, 4),
            5,                      // the older processes' map
            UserStack::young(1, 9), // held, and listed twice
            UserStack::young(1, 9),
            -17,
            UserStack::copied(3).unwrap(),
        ];
        let held = slots_of(1, ids);
        assert_eq!(held, HashSet::from([3, 9]));
        assert_eq!(unheld(&[1, 3, 4, 9, 12], &held), vec![1, 4, 12]);
        assert_eq!(slots_of(0, ids), HashSet::from([4]));
    }

    #[test]
    fn copies_are_kept_once_per_stack_and_bounded() {
        let mut c = Copies::default();
        let a = c.insert(vec![1, 2, 3]);
        let b = c.insert(vec![4, 5]);
        assert_ne!(a, b);
        assert_eq!(c.insert(vec![1, 2, 3]), a);
        assert_eq!(c.len(), 2);
        let UserStack::Copied(i) = UserStack::of(b) else {
            panic!("{b} is no copy");
        };
        assert_eq!(c.get(i), Some(&[4u64, 5][..]));
        assert_eq!(c.not_copied, 0);
        // Only young stacks are copied; one whose map cannot be read goes without (counted).
        assert_eq!(c.keep(5, None), 5);
        assert_eq!(c.keep(-17, None), -17);
        assert_eq!(c.keep(a, None), a);
        assert_eq!(c.keep(UserStack::young(1, 3), None), -libc::ENOENT);
        assert_eq!((c.missing, c.not_copied), (1, 0));
    }

    #[test]
    fn a_state_holds_each_of_its_stacks() {
        let mut st = tracer_common::wall::ThreadState::new(1, 2, 2, 0);
        st.off_ustack = UserStack::young(0, 1);
        st.cuda_ustack = UserStack::young(0, 2);
        st.held_ustack = UserStack::young(0, 3);
        st.held_wait.ustack = UserStack::young(0, 4);
        st.walked[0].ustack = UserStack::young(0, 5);
        let last = st.walked.len() - 1;
        st.walked[last].ustack = UserStack::young(0, 6);
        assert_eq!(
            slots_of(0, st.user_stacks()),
            HashSet::from([1, 2, 3, 4, 5, 6])
        );
    }
}
