//! The thread states the programs keep: direct-mapped by tid in `THREAD_SLOTS`, the few whose
//! slot another thread holds in the `THREADS` hash map (see `tracer_common::wall`). Read while
//! tracing (thread names) and at the end (the time live threads hold), written when user space
//! seeds the threads that exist at attach.
//!
//! The slots and the spill counter are mapped into memory: reading 8,192 slots one
//! `BPF_MAP_LOOKUP_ELEM` at a time costs a syscall each, every half second.

use std::{
    os::fd::{AsFd, AsRawFd},
    ptr::NonNull,
    sync::atomic::{AtomicU64, Ordering},
};

use anyhow::{bail, Context, Result};
use aya::{
    maps::{HashMap, Map, MapData},
    Ebpf,
};
use tracer_common::wall::{
    ThreadState, THREADS_MAP, THREADS_SPILLED_MAP, THREAD_SLOTS, THREAD_SLOTS_MAP,
};

/// The programs' `THREAD_SLOT_MASK`: `THREAD_SLOTS - 1`, or fewer slots for tests
/// (`GPUTRACE_THREAD_SLOTS`, a power of two), so that threads share slots and the spill map
/// is exercised.
pub fn slot_mask() -> u32 {
    std::env::var("GPUTRACE_THREAD_SLOTS")
        .ok()
        .and_then(|v| v.parse::<u32>().ok())
        .filter(|n| n.is_power_of_two() && *n <= THREAD_SLOTS)
        .map_or(THREAD_SLOTS - 1, |n| n - 1)
}

/// A BPF array map's values, mapped shared (the map was created `BPF_F_MMAPABLE`).
struct Mapped {
    ptr: NonNull<u8>,
    len: usize,
}

impl Mapped {
    /// Maps `entries` values of `value_size` bytes of array map `name`.
    fn new(ebpf: &Ebpf, name: &str, value_size: usize, entries: u32) -> Result<Mapped> {
        let Some(Map::Array(data)) = ebpf.map(name) else {
            bail!("map {name} missing or not an array");
        };
        // The kernel lays an array's values out 8-byte aligned, from the mapping's start.
        let len = value_size.next_multiple_of(8) * entries as usize;
        let fd = data.fd().as_fd().as_raw_fd();
        // SAFETY: a fresh shared mapping of the map's fd; nothing else refers to the range.
        let ptr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                fd,
                0,
            )
        };
        if ptr == libc::MAP_FAILED {
            return Err(std::io::Error::last_os_error())
                .with_context(|| format!("mmap map {name}"));
        }
        let ptr = NonNull::new(ptr.cast()).context("mmap returned null")?;
        Ok(Mapped { ptr, len })
    }
}

impl Drop for Mapped {
    fn drop(&mut self) {
        // SAFETY: the range mmap gave us, not used after this.
        unsafe { libc::munmap(self.ptr.as_ptr().cast(), self.len) };
    }
}

/// Size of one slot in the array (values are 8-byte aligned).
const SLOT_BYTES: usize = std::mem::size_of::<ThreadState>().next_multiple_of(8);

pub struct States {
    slots: Mapped,
    spilled: Mapped,
    mask: u32,
}

impl States {
    pub fn open(ebpf: &Ebpf) -> Result<States> {
        Ok(States {
            slots: Mapped::new(
                ebpf,
                THREAD_SLOTS_MAP,
                std::mem::size_of::<ThreadState>(),
                THREAD_SLOTS,
            )?,
            spilled: Mapped::new(ebpf, THREADS_SPILLED_MAP, 8, 1)?,
            mask: slot_mask(),
        })
    }

    fn slot(&self, i: u32) -> *mut ThreadState {
        debug_assert!(i < THREAD_SLOTS);
        // SAFETY: i < THREAD_SLOTS, so the slot lies inside the mapping.
        unsafe { self.slots.ptr.as_ptr().add(i as usize * SLOT_BYTES).cast() }
    }

    /// A copy of slot `i` (the programs may be writing it: a copy, not a reference).
    fn read_slot(&self, i: u32) -> ThreadState {
        // SAFETY: inside the mapping, aligned (page-aligned start, 8-byte multiples); any bit
        // pattern is a valid ThreadState (plain integers).
        unsafe { std::ptr::read_volatile(self.slot(i)) }
    }

    fn spilled(&self) -> &AtomicU64 {
        // SAFETY: the counter's 8 aligned bytes, shared with the programs' atomic adds.
        unsafe { AtomicU64::from_ptr(self.spilled.ptr.as_ptr().cast()) }
    }

    /// Every thread state, in slots then spilled.
    pub fn all(&self, ebpf: &Ebpf) -> Result<Vec<(u32, ThreadState)>> {
        let mut out: Vec<(u32, ThreadState)> = (0..THREAD_SLOTS)
            .map(|i| self.read_slot(i))
            .filter(|st| st.tid != 0)
            .map(|st| (st.tid, st))
            .collect();
        out.extend(crate::batch::entries(&spill_map(ebpf)?));
        Ok(out)
    }

    /// Every thread state, as [`States::all`], each slot a copy taken whole: read until two
    /// copies in a row agree (a slot is copied field by field while its thread may run and
    /// move a stack id from one field to another). Past a few tries, both copies.
    pub fn all_settled(&self, ebpf: &Ebpf) -> Result<Vec<(u32, ThreadState)>> {
        let mut out = Vec::new();
        for i in 0..THREAD_SLOTS {
            let mut a = self.read_slot(i);
            let mut settled = false;
            for _ in 0..4 {
                let b = self.read_slot(i);
                if a == b {
                    settled = true;
                    break;
                }
                a = b;
            }
            if !settled {
                let b = self.read_slot(i);
                if b.tid != 0 {
                    out.push((b.tid, b));
                }
            }
            if a.tid != 0 {
                out.push((a.tid, a));
            }
        }
        out.extend(crate::batch::try_entries(&spill_map(ebpf)?).context("list THREADS")?);
        Ok(out)
    }

    /// Thread `tid`'s state, if it has one.
    pub fn get(&self, ebpf: &Ebpf, tid: u32) -> Option<ThreadState> {
        let st = self.read_slot(tid & self.mask);
        if st.tid == tid && tid != 0 {
            return Some(st);
        }
        spill_map(ebpf).ok()?.get(&tid, 0).ok()
    }

    /// Gives `st` to thread `st.tid` unless it has a state already (the programs saw it: theirs
    /// is exact).
    pub fn seed(&self, ebpf: &mut Ebpf, st: &ThreadState) -> Result<()> {
        let tid = st.tid;
        let slot = self.slot(tid & self.mask);
        // SAFETY: inside the mapping, aligned.
        let owner = unsafe { std::ptr::read_volatile(std::ptr::addr_of!((*slot).tid)) };
        if owner == tid {
            return Ok(());
        }
        if owner == 0 {
            // The programs may give the thread a state between the check and the store (its
            // first event since the attach): the seed then replaces a state microseconds old.
            // SAFETY: as above; the programs read a slot only once its tid matches theirs.
            unsafe { std::ptr::write_volatile(slot, *st) };
            return Ok(());
        }
        let mut spill: HashMap<&mut MapData, u32, ThreadState> =
            HashMap::try_from(ebpf.map_mut(THREADS_MAP).context("map THREADS missing")?)?;
        // BPF_NOEXIST: a state the programs made meanwhile stays.
        if spill.insert(tid, st, 1).is_ok() {
            self.spilled().fetch_add(1, Ordering::Relaxed);
        }
        Ok(())
    }
}

fn spill_map(ebpf: &Ebpf) -> Result<HashMap<&MapData, u32, ThreadState>> {
    Ok(HashMap::try_from(
        ebpf.map(THREADS_MAP).context("map THREADS missing")?,
    )?)
}
