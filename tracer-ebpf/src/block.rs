//! Block I/O per issuing process and device: requests, bytes, issue-to-complete latency and
//! time queued in the I/O scheduler. A request is attributed to the process current at insert
//! or issue (the submitter for direct and plugged I/O); requests issued by kernel threads
//! (writeback) are not charged to any traced process.

use aya_ebpf::{
    helpers::bpf_ktime_get_ns,
    macros::{map, tracepoint},
    maps::{HashMap, LruHashMap, PerCpuArray},
    programs::TracePointContext,
    Global,
};
use tracer_common::{
    drops::Drop,
    wall::{
        log2_bucket, BlkInflight, BlkInflightKey, BlkKey, BlkStat, BLOCK_ENTRIES,
        BLOCK_INFLIGHT_ENTRIES, HIST_BUCKETS,
    },
};

use crate::maps::{atomic_add, count_drop, current_ids, is_traced};

#[map(name = "BLOCK_IO")]
static BLOCK_IO: HashMap<BlkKey, BlkStat> = HashMap::with_max_entries(BLOCK_ENTRIES, 0);

#[map(name = "BLK_INFLIGHT")]
static BLK_INFLIGHT: HashMap<BlkInflightKey, BlkInflight> =
    HashMap::with_max_entries(BLOCK_INFLIGHT_ENTRIES, 0);

/// Absolute start sector of a bio -> the traced process that submitted it, for requests that a
/// kernel worker inserts or issues (requeues, plugs flushed by a worker). Keyed by sector only:
/// the bio's dev is the partition's, the request's the disk's. LRU: merged bios never complete.
#[map(name = "BIO_OWNER")]
static BIO_OWNER: LruHashMap<u64, u32> = LruHashMap::with_max_entries(BLOCK_INFLIGHT_ENTRIES, 0);

#[map(name = "BLK_ZERO")]
static BLK_ZERO: PerCpuArray<BlkStat> = PerCpuArray::with_max_entries(1, 0);

// block_rq_insert / block_rq_issue share a layout; block_rq_complete has its own.
#[no_mangle]
static OFF_RQ_DEV: Global<u32> = Global::new(8);
#[no_mangle]
static OFF_RQ_SECTOR: Global<u32> = Global::new(16);
#[no_mangle]
static OFF_RQ_BYTES: Global<u32> = Global::new(28);
#[no_mangle]
static OFF_RQ_RWBS: Global<u32> = Global::new(34);
#[no_mangle]
static OFF_BIO_SECTOR: Global<u32> = Global::new(16);
#[no_mangle]
static OFF_BIO_DEV: Global<u32> = Global::new(8);
#[no_mangle]
static OFF_BIO_NR_SECTOR: Global<u32> = Global::new(24);
#[no_mangle]
static OFF_BIO_RWBS: Global<u32> = Global::new(28);
#[no_mangle]
static OFF_SPLIT_SECTOR: Global<u32> = Global::new(16);
#[no_mangle]
static OFF_SPLIT_NEW: Global<u32> = Global::new(24);
#[no_mangle]
static OFF_RQC_DEV: Global<u32> = Global::new(8);
#[no_mangle]
static OFF_RQC_SECTOR: Global<u32> = Global::new(16);
#[no_mangle]
static OFF_RQC_NR_SECTOR: Global<u32> = Global::new(24);

/// Runs in the submitter's context: remembers who submitted the bio.
#[tracepoint]
pub fn block_bio_queue(ctx: TracePointContext) -> u32 {
    crate::maps::hit(tracer_common::hits::Prog::BlockBioQueue);
    let (tgid, _) = current_ids();
    if !is_traced(tgid) {
        return 0;
    }
    let sector: u64 = unsafe { ctx.read_at(OFF_BIO_SECTOR.load() as usize) }.unwrap_or(0);
    let _ = BIO_OWNER.insert(&sector, &tgid, 0);
    // Bytes are counted here, where the submitter is current, so they are exact whatever
    // happens to the requests later (merges, splits, requeues, issue by a worker).
    let dev: u32 = unsafe { ctx.read_at(OFF_BIO_DEV.load() as usize) }.unwrap_or(0);
    let nr_sector: u32 = unsafe { ctx.read_at(OFF_BIO_NR_SECTOR.load() as usize) }.unwrap_or(0);
    let rwbs: [u8; 4] = unsafe { ctx.read_at(OFF_BIO_RWBS.load() as usize) }.unwrap_or([0; 4]);
    let Some(s) = stat(&BlkKey { tgid, dev }) else {
        return 0;
    };
    let bytes = nr_sector as u64 * 512;
    match rw_kind(&rwbs) {
        0 => atomic_add(unsafe { &mut (*s).read_bytes }, bytes),
        1 => atomic_add(unsafe { &mut (*s).write_bytes }, bytes),
        _ => {}
    }
    0
}

/// The stats row of `key`, created when missing.
#[inline(always)]
fn stat(key: &BlkKey) -> Option<*mut BlkStat> {
    if let Some(s) = BLOCK_IO.get_ptr_mut(key) {
        return Some(s);
    }
    let zero = BLK_ZERO.get_ptr(0)?;
    // BPF_NOEXIST: another CPU may insert the same row at the same time.
    let _ = BLOCK_IO.insert(key, unsafe { &*zero }, 1);
    let s = BLOCK_IO.get_ptr_mut(key);
    if s.is_none() {
        count_drop(Drop::BlockMapFull);
    }
    s
}

/// A split bio's second part starts at `new_sector`; it has the same owner.
#[tracepoint]
pub fn block_split(ctx: TracePointContext) -> u32 {
    crate::maps::hit(tracer_common::hits::Prog::BlockSplit);
    let sector: u64 = unsafe { ctx.read_at(OFF_SPLIT_SECTOR.load() as usize) }.unwrap_or(0);
    let Some(owner) = (unsafe { BIO_OWNER.get(&sector) }).copied() else {
        return 0;
    };
    let new: u64 = unsafe { ctx.read_at(OFF_SPLIT_NEW.load() as usize) }.unwrap_or(0);
    let _ = BIO_OWNER.insert(&new, &owner, 0);
    0
}

#[tracepoint]
pub fn block_rq_insert(ctx: TracePointContext) -> u32 {
    crate::maps::hit(tracer_common::hits::Prog::BlockRqInsert);
    start(&ctx, true);
    0
}

#[tracepoint]
pub fn block_rq_issue(ctx: TracePointContext) -> u32 {
    crate::maps::hit(tracer_common::hits::Prog::BlockRqIssue);
    start(&ctx, false);
    0
}

#[inline(always)]
fn start(ctx: &TracePointContext, insert: bool) {
    let now = unsafe { bpf_ktime_get_ns() };
    let dev: u32 = unsafe { ctx.read_at(OFF_RQ_DEV.load() as usize) }.unwrap_or(0);
    let sector: u64 = unsafe { ctx.read_at(OFF_RQ_SECTOR.load() as usize) }.unwrap_or(0);
    let key = BlkInflightKey {
        sector,
        dev,
        _pad: 0,
    };
    // A request already seen keeps its owner: a requeued request is inserted and issued again,
    // possibly from a kernel worker.
    if let Some(r) = BLK_INFLIGHT.get_ptr_mut(&key) {
        if insert {
            // A requeue, or a stale entry of a request merged away: queued from now.
            unsafe {
                (*r).insert_ns = now;
                (*r).issue_ns = 0;
            }
        } else {
            // Bios merged into the request after its insert made it larger.
            let bytes: u32 = unsafe { ctx.read_at(OFF_RQ_BYTES.load() as usize) }.unwrap_or(0);
            unsafe {
                (*r).issue_ns = now;
                (*r).bytes = bytes as u64;
            }
        }
        return;
    }
    let (cur, _) = current_ids();
    let tgid = if is_traced(cur) {
        cur
    } else {
        match unsafe { BIO_OWNER.get(&sector) } {
            Some(owner) => *owner,
            None => return,
        }
    };
    let _ = BIO_OWNER.remove(&sector);
    let bytes: u32 = unsafe { ctx.read_at(OFF_RQ_BYTES.load() as usize) }.unwrap_or(0);
    let rwbs: [u8; 4] = unsafe { ctx.read_at(OFF_RQ_RWBS.load() as usize) }.unwrap_or([0; 4]);
    let write = rw_kind(&rwbs);
    let v = BlkInflight {
        insert_ns: if insert { now } else { 0 },
        issue_ns: if insert { 0 } else { now },
        tgid,
        write,
        bytes: bytes as u64,
    };
    if BLK_INFLIGHT.insert(&key, &v, 0).is_err() {
        count_drop(Drop::BlockMapFull);
    }
}

/// 0 read, 1 write, 2 neither (discard, flush, ...): rwbs is e.g. `R`, `RA`, `WS`, `FWS`, `DS`.
#[inline(always)]
fn rw_kind(rwbs: &[u8; 4]) -> u32 {
    if rwbs[0] == b'D' {
        2
    } else if rwbs[0] == b'W' || rwbs[1] == b'W' {
        1
    } else if rwbs[0] == b'R' || rwbs[1] == b'R' {
        0
    } else {
        2
    }
}

#[tracepoint]
pub fn block_rq_complete(ctx: TracePointContext) -> u32 {
    crate::maps::hit(tracer_common::hits::Prog::BlockRqComplete);
    let now = unsafe { bpf_ktime_get_ns() };
    let dev: u32 = unsafe { ctx.read_at(OFF_RQC_DEV.load() as usize) }.unwrap_or(0);
    let sector: u64 = unsafe { ctx.read_at(OFF_RQC_SECTOR.load() as usize) }.unwrap_or(0);
    let key = BlkInflightKey {
        sector,
        dev,
        _pad: 0,
    };
    let Some(rp) = BLK_INFLIGHT.get_ptr_mut(&key) else {
        return 0;
    };
    // The bytes this completion finished; a request can complete in several parts, and only
    // the last one forgets it.
    let nr_sector: u32 = unsafe { ctx.read_at(OFF_RQC_NR_SECTOR.load() as usize) }.unwrap_or(0);
    let done = nr_sector as u64 * 512;
    let r = unsafe { *rp };
    if done != 0 && done < r.bytes {
        unsafe { (*rp).bytes -= done };
    } else {
        let _ = BLK_INFLIGHT.remove(&key);
    }
    // Seen at insert only (its issue raced with the insert): timed from the insert.
    let started = if r.issue_ns != 0 {
        r.issue_ns
    } else {
        r.insert_ns
    };
    let Some(stat) = stat(&BlkKey { tgid: r.tgid, dev }) else {
        return 0;
    };
    let lat = now.saturating_sub(started);
    let queued = if r.insert_ns != 0 && r.issue_ns != 0 {
        r.issue_ns.saturating_sub(r.insert_ns)
    } else {
        0
    };
    crate::timeline::block(r.tgid, dev, started, lat, r.bytes, r.write, sector, queued);
    let s = unsafe { &mut *stat };
    atomic_add(&mut s.requests, 1);
    if r.write == 1 {
        atomic_add(&mut s.writes, 1);
    } else if r.write == 0 {
        atomic_add(&mut s.reads, 1);
    }
    atomic_add(&mut s.total_ns, lat);
    atomic_add(&mut s.queue_ns, queued);
    let b = log2_bucket(lat);
    if b < HIST_BUCKETS {
        atomic_add(&mut s.hist[b], 1);
    }
    0
}
