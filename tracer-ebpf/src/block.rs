//! Block I/O per issuing process and device: requests, bytes, issue-to-complete latency and
//! time queued in the I/O scheduler. A request is attributed to the process current at insert
//! or issue (the submitter for direct and plugged I/O); requests issued by kernel threads
//! (writeback) are not charged to any traced process.

use aya_ebpf::{
    helpers::bpf_ktime_get_ns,
    macros::{map, tracepoint},
    maps::{HashMap, PerCpuArray},
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

use crate::maps::{count_drop, current_ids, is_traced};

#[map(name = "BLOCK_IO")]
static BLOCK_IO: HashMap<BlkKey, BlkStat> = HashMap::with_max_entries(BLOCK_ENTRIES, 0);

#[map(name = "BLK_INFLIGHT")]
static BLK_INFLIGHT: HashMap<BlkInflightKey, BlkInflight> =
    HashMap::with_max_entries(BLOCK_INFLIGHT_ENTRIES, 0);

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
static OFF_RQC_DEV: Global<u32> = Global::new(8);
#[no_mangle]
static OFF_RQC_SECTOR: Global<u32> = Global::new(16);

#[tracepoint]
pub fn block_rq_insert(ctx: TracePointContext) -> u32 {
    start(&ctx, true);
    0
}

#[tracepoint]
pub fn block_rq_issue(ctx: TracePointContext) -> u32 {
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
        if !insert {
            unsafe { (*r).issue_ns = now };
        }
        return;
    }
    let (tgid, _) = current_ids();
    if !is_traced(tgid) {
        return;
    }
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
    let now = unsafe { bpf_ktime_get_ns() };
    let dev: u32 = unsafe { ctx.read_at(OFF_RQC_DEV.load() as usize) }.unwrap_or(0);
    let sector: u64 = unsafe { ctx.read_at(OFF_RQC_SECTOR.load() as usize) }.unwrap_or(0);
    let key = BlkInflightKey {
        sector,
        dev,
        _pad: 0,
    };
    let Some(r) = (unsafe { BLK_INFLIGHT.get(&key) }) else {
        return 0;
    };
    let r = *r;
    let _ = BLK_INFLIGHT.remove(&key);
    // Seen at insert only (its issue raced with the insert): timed from the insert.
    let started = if r.issue_ns != 0 {
        r.issue_ns
    } else {
        r.insert_ns
    };
    let bk = BlkKey { tgid: r.tgid, dev };
    let stat = match BLOCK_IO.get_ptr_mut(&bk) {
        Some(s) => s,
        None => {
            let Some(zero) = BLK_ZERO.get_ptr(0) else {
                return 0;
            };
            // BPF_NOEXIST: completions of one process may race on two CPUs.
            let _ = BLOCK_IO.insert(&bk, unsafe { &*zero }, 1);
            match BLOCK_IO.get_ptr_mut(&bk) {
                Some(s) => s,
                None => {
                    count_drop(Drop::BlockMapFull);
                    return 0;
                }
            }
        }
    };
    let lat = now.saturating_sub(started);
    let queued = if r.insert_ns != 0 && r.issue_ns != 0 {
        r.issue_ns.saturating_sub(r.insert_ns)
    } else {
        0
    };
    let s = unsafe { &mut *stat };
    use crate::maps::atomic_add;
    atomic_add(&mut s.requests, 1);
    if r.write == 1 {
        atomic_add(&mut s.writes, 1);
        atomic_add(&mut s.write_bytes, r.bytes);
    } else if r.write == 0 {
        atomic_add(&mut s.reads, 1);
        atomic_add(&mut s.read_bytes, r.bytes);
    }
    atomic_add(&mut s.total_ns, lat);
    atomic_add(&mut s.queue_ns, queued);
    let b = log2_bucket(lat);
    if b < HIST_BUCKETS {
        atomic_add(&mut s.hist[b], 1);
    }
    0
}
