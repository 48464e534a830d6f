//! Block I/O per submitting process and device: requests, bytes, issue-to-complete latency
//! and time queued in the I/O scheduler. A request is attributed to the submitter of its first
//! bio (seen at `block_bio_queue`), whoever issues it; requests whose bios kernel threads
//! submitted (writeback) are not charged to any traced process.
//!
//! Each program comes three times. On BTF-typed raw tracepoints (`*_btf`, the default): they
//! get the kernel's `struct bio` / `struct request` as typed pointers and read the few fields
//! needed with plain loads ([`Direct`]), where a `bpf_probe_read_kernel` is a helper call
//! (~30-40 ns each on the development VM, five or so per program). On raw tracepoints, the same
//! code reading through that helper ([`Probe`]), where a kernel refuses the typed programs.
//! And on the classic tracepoints (`*_tp`), which first format a record with the command name
//! and a flags string, for kernels whose BTF does not show what is read here. The BTF and raw
//! sets need no `block_rq_insert`: a request's allocation time (`start_time_ns`) starts its
//! queueing, and the owner recorded at `block_bio_queue` follows it to the issue, which saves a
//! program run per request. They also keep their per-request state in arrays indexed by a hash
//! (of the bio's sector, of the request's address), written in place: on this VM a hash map
//! update costs about 1 µs (a lookup ~0.2 µs, an array slot nothing but the stores), and the
//! classic set makes two updates and two deletes per request.

use aya_ebpf::{
    helpers::bpf_ktime_get_ns,
    macros::{btf_tracepoint, map, raw_tracepoint, tracepoint},
    maps::{Array, HashMap, LruHashMap, PerCpuArray, PerCpuHashMap},
    programs::{BtfTracePointContext, RawTracePointContext, TracePointContext},
    Global,
};
use tracer_common::{
    drops::Drop,
    wall::{
        block_selected, log2_bucket, BlkInflight, BlkInflightKey, BlkKey, BlkStat, BlockSample,
        ThreadState, BLOCK_ENTRIES, BLOCK_INFLIGHT_ENTRIES, BLOCK_SHIFT_MAX, HIST_BUCKETS,
        MAP_F_NO_PREALLOC,
    },
};

use crate::{
    account,
    kread::{arg0_value, Direct, Kernel, Probe},
    maps::{
        by_path, count_drop, counter, counter_add, current_ids, is_traced, maybe_traced, traced,
    },
};
use tracer_common::hits::Prog;

/// Per CPU: each program adds to its CPU's copy with plain stores, where a shared row took an
/// atomic add per field (six per completion); user space sums the copies. A completion (in
/// interrupt context) may interrupt a bio's submission on the same CPU, but they add to
/// different fields (requests and latencies; bytes). Not preallocated (`BPF_F_NO_PREALLOC`):
/// a row per CPU of a 128-CPU machine is ~40 KB, and a trace has a few rows, not the 4,096
/// it may hold. A kernel before 6.1 gets it preallocated, at fewer rows (`prealloc` in the
/// loader): its verifier warns of a map allocated as used in a tracepoint program.
#[map(name = "BLOCK_IO")]
static BLOCK_IO: PerCpuHashMap<BlkKey, BlkStat> =
    PerCpuHashMap::with_max_entries(BLOCK_ENTRIES, MAP_F_NO_PREALLOC);

#[map(name = "BLK_INFLIGHT")]
static BLK_INFLIGHT: HashMap<BlkInflightKey, BlkInflight> =
    HashMap::with_max_entries(BLOCK_INFLIGHT_ENTRIES, 0);

/// Absolute start sector of a bio -> the traced process that submitted it, for requests that a
/// kernel worker inserts or issues (requeues, plugs flushed by a worker). Keyed by sector only:
/// the bio's dev is the partition's, the request's the disk's. LRU: merged bios never complete.
#[map(name = "BIO_OWNER")]
static BIO_OWNER: LruHashMap<u64, u32> = LruHashMap::with_max_entries(BLOCK_INFLIGHT_ENTRIES, 0);

/// The raw programs' bio owners: slot `slot_of(sector)` holds the submitter of the last
/// traced bio queued at that sector. Lossy by design (a later bio at a sector of the same slot
/// takes it), which costs that request its owner: its completion is not counted, and its bytes
/// show as not seen completing (`BlkStat::done_bytes`). Where no issue program runs, an owner
/// is held until the completion, a whole device latency: at queue depth 128 ~0.8% of the
/// requests' owners would be lost. Four times the slots (1 MiB) cost `block_bio_queue` and
/// the completion ~45 ns each here (cache misses), a pair of slots per sector ~100-150 ns
/// (the read before the store waits for the line the completion last wrote on another CPU);
/// a data loader's queue depth is a few requests.
#[map(name = "BIO_OWNERS")]
static BIO_OWNERS: Array<OwnerSlot> = Array::with_max_entries(OWNER_SLOTS, 0);

/// The raw programs' requests in flight, at slot `slot_of(rq)`; a request whose slot is taken
/// by another one in flight goes to `RQ_SPILL`.
#[map(name = "RQ_INFLIGHT")]
static RQ_INFLIGHT: Array<RqSlot> = Array::with_max_entries(RQ_SLOTS, 0);

#[map(name = "RQ_SPILL")]
static RQ_SPILL: HashMap<u64, RqSlot> = HashMap::with_max_entries(RQ_SPILL_ENTRIES, 0);

/// How many requests `RQ_SPILL` holds: while 0, a completion that misses its slot (every
/// untraced request of the machine) needs no hash lookup.
#[map(name = "RQ_SPILLED")]
static RQ_SPILLED: Array<u64> = Array::with_max_entries(1, 0);

/// `tracer_common::wall::BLOCK_SAMPLE_MAP`: how user space has block requests sampled.
#[map(name = "BLOCK_SAMPLE")]
static BLOCK_SAMPLE: Array<BlockSample> = Array::with_max_entries(1, 0);

/// `tracer_common::wall::BLOCK_COUNTED_MAP`.
#[map(name = "BLOCK_COUNTED")]
static BLOCK_COUNTED: PerCpuArray<u64> = PerCpuArray::with_max_entries(1, 0);

/// While the shift is not 0, a data loader's reads (~18,000 a second in the demo) are counted 1
/// in `2^shift`, each that many times. A request not picked costs its bio's queueing and its
/// completion their early returns only: no owner written or read, no clock, no row, no
/// timeline (here ~105 and ~145 ns a hit against ~125 and ~280 for one counted, timed with
/// the kernel's statistics; the completion's part is mostly its first read of the request,
/// which another CPU wrote). The pick is a hash of the request's first sector and of a salt
/// (`BlockSample`), which both ends read from one map value. The shift a request was picked
/// under is kept with its owner (`OwnerSlot::sector`'s top bits): it counts by that.
#[inline(always)]
fn sampling() -> Option<&'static BlockSample> {
    BLOCK_SAMPLE.get(0).filter(|b| b.shift != 0)
}

/// The shift of `b`, bounded for the verifier.
#[inline(always)]
fn shift_of(b: &BlockSample) -> u32 {
    (b.shift as u32).min(BLOCK_SHIFT_MAX)
}

/// The sampling shift now (0: every request counts) when the bio being queued (or split, or
/// remapped) now at the sector `sector` reads is one to count, else None. The sector is read
/// only while sampling.
#[inline(always)]
fn picked_now(sector: impl FnOnce() -> u64) -> Option<u32> {
    match sampling() {
        None => Some(0),
        Some(b) => {
            let shift = shift_of(b);
            block_selected(sector(), b.salt, shift).then_some(shift)
        }
    }
}

/// Whether the request whose first sector is `sector` may have been picked when its first
/// bio was queued: under this salt or the last (a request queued two salts ago, seconds, then
/// goes uncounted), at this shift or the last (a request in flight as the shift rose). Only a
/// picked bio left an owner: a request tried here that was not picked finds none.
#[inline(always)]
fn picked_at(sector: u64) -> bool {
    match sampling() {
        None => true,
        Some(b) => {
            let shift = shift_of(b).min(b.prev_shift as u32);
            block_selected(sector, b.salt, shift) || block_selected(sector, b.prev_salt, shift)
        }
    }
}

/// `OwnerSlot::sector` keeps the sector below this bit (2^56 sectors: 32 EiB) and the
/// request's sampling shift above it.
const SHIFT_AT: u32 = 56;
const SECTOR_MASK: u64 = (1 << SHIFT_AT) - 1;

const OWNER_SLOTS: u32 = 16_384;
const RQ_SLOTS: u32 = 4_096;
const RQ_SPILL_ENTRIES: u32 = 4_096;
/// Five minutes: the block layer times a request out after 30 s by default.
const STALE_NS: u64 = 300_000_000_000;

#[repr(C)]
#[derive(Clone, Copy)]
struct OwnerSlot {
    /// The bio's sector, and its sampling shift in the top bits (`SHIFT_AT`).
    sector: u64,
    /// 0: empty (a consumed or never-written slot).
    tgid: u32,
    /// The `dev_t` of the bio's disk (a partition's whole disk): a sector alone is not a
    /// request's. An md mirror's two copies of a write are at one sector of two disks; a
    /// device mapper's bio, at a sector of its own device, leaves an owner no request of a
    /// real disk may take. (The disk's `struct gendisk` address, two loads fewer, cannot be
    /// hashed on a BTF tracepoint: the verifier allows no arithmetic but adding on a typed
    /// pointer.)
    disk: u32,
}

#[repr(C)]
#[derive(Clone, Copy)]
struct RqSlot {
    /// The request's address; 0: empty.
    rq: u64,
    /// Its `start_time_ns`: a request issued again with the same one was requeued, with
    /// another one the address was recycled for a new request.
    alloc_ns: u64,
    /// Its first bio: a request that block layer did not stamp (`alloc_ns` 0) is told from a
    /// new one at the same address by this.
    bio: u64,
    issue_ns: u64,
    bytes: u64,
    tgid: u32,
    write: u32,
    /// The request's first sector (for the timeline) and its disk (`disk_dev`), read at the
    /// issue, where the block layer has just touched them: a completion runs in an interrupt,
    /// often on another CPU, where the four loads behind the disk's number miss the cache.
    sector: u64,
    dev: u32,
    /// The sampling shift its owner was picked under (it counts `2^shift` times).
    shift: u32,
}

/// A slot for a 64-bit key (Fibonacci hashing: the addresses of requests are multiples of
/// their size, sectors of the I/O size).
#[inline(always)]
fn slot_of(key: u64, slots: u32) -> u32 {
    (key.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 32) as u32 % slots
}

impl RqSlot {
    /// Whether `rq`'s allocation stamp and first bio are this request's.
    #[inline(always)]
    fn same(&self, alloc: u64, bio: u64) -> bool {
        self.alloc_ns == alloc && self.bio == bio
    }

    /// Issued again after a requeue: it keeps its owner and its allocation time. `p`: the
    /// request, to read from.
    #[inline(always)]
    fn reissued<K: Kernel>(&mut self, p: u64, now: u64) {
        self.issue_ns = now;
        self.bytes = K::read::<u32>(p, OFF_K_RQ_LEN.load()) as u64;
    }
}

/// The owner slot of the bio at `sector` of disk `disk` (its `dev_t`).
#[inline(always)]
fn owner_index(sector: u64, disk: u32) -> u32 {
    slot_of(sector ^ ((disk as u64) << 32), OWNER_SLOTS)
}

/// Records `tgid` as the submitter of the bio at `sector` of `disk`. Stores only: a read of
/// the slot first (to keep another bio's owner in a second slot of a pair) stalls on the cache
/// line, which the completion on another CPU last wrote: `block_bio_queue` took ~100-150 ns
/// more.
#[inline(always)]
fn set_owner(sector: u64, disk: u32, tgid: u32, shift: u32) {
    if let Some(o) = BIO_OWNERS.get_ptr_mut(owner_index(sector, disk)) {
        unsafe {
            (*o).sector = sector | (shift as u64) << SHIFT_AT;
            (*o).tgid = tgid;
            (*o).disk = disk;
        }
    }
}

/// The owner slot that holds the submitter of the bio at `sector` of `disk`, when one does.
#[inline(always)]
fn owner_slot(sector: u64, disk: u32) -> Option<*mut OwnerSlot> {
    BIO_OWNERS
        .get_ptr_mut(owner_index(sector, disk))
        .filter(|&o| unsafe {
            (*o).tgid != 0 && (*o).sector & SECTOR_MASK == sector && (*o).disk == disk
        })
}

/// The sampling shift the owner in slot `o` was picked under.
#[inline(always)]
fn owner_shift(o: *mut OwnerSlot) -> u32 {
    (unsafe { (*o).sector } >> SHIFT_AT) as u32
}

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
static OFF_REMAP_SECTOR: Global<u32> = Global::new(16);
#[no_mangle]
static OFF_REMAP_OLD_SECTOR: Global<u32> = Global::new(32);
#[no_mangle]
static OFF_REMAP_DEV: Global<u32> = Global::new(8);
#[no_mangle]
static OFF_REMAP_OLD_DEV: Global<u32> = Global::new(28);
#[no_mangle]
static OFF_RQC_DEV: Global<u32> = Global::new(8);
#[no_mangle]
static OFF_RQC_SECTOR: Global<u32> = Global::new(16);
#[no_mangle]
static OFF_RQC_NR_SECTOR: Global<u32> = Global::new(24);

// The raw programs' struct offsets, from the kernel's BTF (`bio.bi_iter` already added to the
// `bvec_iter` fields).
#[no_mangle]
static OFF_K_BIO_SECTOR: Global<u32> = Global::new(0);
#[no_mangle]
static OFF_K_BIO_SIZE: Global<u32> = Global::new(0);
#[no_mangle]
static OFF_K_BIO_OPF: Global<u32> = Global::new(0);
#[no_mangle]
static OFF_K_BIO_BDEV: Global<u32> = Global::new(0);
#[no_mangle]
static OFF_K_BDEV_DEV: Global<u32> = Global::new(0);
#[no_mangle]
static OFF_K_BDEV_DISK: Global<u32> = Global::new(0);
#[no_mangle]
static OFF_K_BDEV_START: Global<u32> = Global::new(0);
#[no_mangle]
static OFF_K_RQ_Q: Global<u32> = Global::new(0);
#[no_mangle]
static OFF_K_RQ_SECTOR: Global<u32> = Global::new(0);
#[no_mangle]
static OFF_K_RQ_LEN: Global<u32> = Global::new(0);
#[no_mangle]
static OFF_K_RQ_FLAGS: Global<u32> = Global::new(0);
#[no_mangle]
static OFF_K_RQ_START: Global<u32> = Global::new(0);
#[no_mangle]
static OFF_K_RQ_BIO: Global<u32> = Global::new(0);
/// `request.io_start_time_ns`: the block layer's own issue stamp (`blk_mq_start_request`, where
/// the queue keeps I/O statistics: writeback throttling, blk-iolatency, iocost).
#[no_mangle]
static OFF_K_RQ_IO_START: Global<u32> = Global::new(0);
/// 1: no `block_rq_issue` program runs; a completion takes its owner from the bio's and its
/// issue time from the kernel's stamp ([`complete_stamped`]). User space sets it where every
/// disk's queue stamps its issues: a program run (~0.5 µs here) less per request.
#[no_mangle]
static ISSUE_STAMPED: Global<u32> = Global::new(0);
/// Tests only: every request reads as unstamped (as on a queue whose statistics went off).
#[no_mangle]
static TEST_UNSTAMPED_ISSUES: Global<u32> = Global::new(0);
#[no_mangle]
static OFF_K_Q_DISK: Global<u32> = Global::new(0);
#[no_mangle]
static OFF_K_DISK_MAJOR: Global<u32> = Global::new(0);
#[no_mangle]
static OFF_K_DISK_MINOR: Global<u32> = Global::new(0);
/// `enum req_op` values (ZONE_APPEND moved from 13 to 7 in Linux 6.0): from the BTF.
#[no_mangle]
static REQ_OP_READ: Global<u32> = Global::new(0);
#[no_mangle]
static REQ_OP_WRITE: Global<u32> = Global::new(1);
#[no_mangle]
static REQ_OP_ZONE_APPEND: Global<u32> = Global::new(7);
/// `REQ_OP_MASK`: the low bits of `blk_opf_t` hold the operation.
const REQ_OP_MASK: u32 = 0xff;
/// `MINORBITS`: the kernel's `dev_t` is `major << 20 | minor`, as the tracepoints print it.
const MINORBITS: u32 = 20;

/// 0 read, 1 write, 2 neither, from a `blk_opf_t`: as the classic tracepoints' rwbs (`R`, `W`,
/// `D`, `F`, `N`), except that a zone appdata written, counts as a write (rwbs says `N`).
#[inline(always)]
fn op_kind(opf: u32) -> u32 {
    let op = opf & REQ_OP_MASK;
    if op == REQ_OP_READ.load() {
        0
    } else if op == REQ_OP_WRITE.load() || op == REQ_OP_ZONE_APPEND.load() {
        1
    } else {
        2
    }
}

/// Runs in the submitter's context: remembers who submitted the bio.
// TP_PROTO(struct bio *bio)
#[raw_tracepoint(tracepoint = "block_bio_queue")]
pub fn block_bio_queue(ctx: RawTracePointContext) -> u32 {
    by_path(Prog::BlockBioQueue, |p| bio_queue::<Probe>(ctx.arg(0), p));
    0
}

#[btf_tracepoint(function = "block_bio_queue")]
pub fn block_bio_queue_btf(ctx: BtfTracePointContext) -> i32 {
    by_path(Prog::BlockBioQueueBtf, |p| {
        bio_queue::<Direct>(ctx.arg(0), p)
    });
    0
}

#[inline(always)]
fn bio_queue<K: Kernel>(bio: u64, p: Prog) {
    // Requests submitted after the window's end are not its (those in flight are drained).
    if account::stopped() {
        return;
    }
    let Some(shift) = picked_now(|| K::read(bio, OFF_K_BIO_SECTOR.load())) else {
        return;
    };
    let (tgid, tid) = current_ids();
    // The submitter's own state when it has one: its bytes are then summed there, with no
    // hash lookup (the state is an array slot). Two separate paths: merged, LLVM emits a read
    // of the state's register on the path that has none, which the verifier rejects.
    if maybe_traced(tid) {
        if let Some(st) = account::state(tid) {
            let st = unsafe { &mut *st };
            if st.tgid == tgid {
                traced(p);
                let b = bio_fields::<K>(bio);
                set_owner(b.sector, b.disk, tgid, shift);
                held_bio_bytes(st, b.dev, b.bytes << shift, b.kind);
                return;
            }
        }
    }
    if !is_traced(tgid) {
        return;
    }
    traced(p);
    let b = bio_fields::<K>(bio);
    set_owner(b.sector, b.disk, tgid, shift);
    bio_bytes(tgid, b.dev, b.bytes << shift, b.kind);
}

/// What a bio is: its start sector, device (a partition's), disk (the whole disk's `dev_t`),
/// size and kind (`op_kind`).
struct Bio {
    sector: u64,
    dev: u32,
    disk: u32,
    bytes: u64,
    kind: u32,
}

#[inline(always)]
fn bio_fields<K: Kernel>(bio: u64) -> Bio {
    let sector: u64 = K::read(bio, OFF_K_BIO_SECTOR.load());
    let bytes: u32 = K::read(bio, OFF_K_BIO_SIZE.load());
    let opf: u32 = K::read(bio, OFF_K_BIO_OPF.load());
    let bdev: u64 = K::read(bio, OFF_K_BIO_BDEV.load());
    let (dev, disk) = if bdev == 0 {
        (0, 0)
    } else {
        (K::read(bdev, OFF_K_BDEV_DEV.load()), bdev_disk::<K>(bdev))
    };
    Bio {
        sector,
        dev,
        disk,
        bytes: bytes as u64,
        kind: op_kind(opf),
    }
}

/// The `dev_t` of a block device's disk: a partition's is its whole disk's.
#[inline(always)]
fn bdev_disk<K: Kernel>(bdev: u64) -> u32 {
    disk_dev::<K>(K::read(bdev, OFF_K_BDEV_DISK.load()))
}

/// As [`bio_bytes`], summed in the submitter's state after its first bio to `dev`
/// (`ThreadState::bio_dev`).
#[inline(always)]
fn held_bio_bytes(st: &mut ThreadState, dev: u32, bytes: u64, kind: u32) {
    if st.bio_dev != dev {
        flush_bio(st);
        st.bio_dev = dev;
        bio_bytes(st.tgid, dev, bytes, kind);
        return;
    }
    match kind {
        0 => st.held_bio_read += bytes,
        1 => st.held_bio_write += bytes,
        _ => {}
    }
}

/// Writes out the bio bytes `st` holds (`ThreadState::held_bio`).
#[inline(always)]
pub fn flush_bio(st: &mut ThreadState) {
    if st.held_bio_read == 0 && st.held_bio_write == 0 {
        return;
    }
    if let Some(s) = stat(&BlkKey {
        tgid: st.tgid,
        dev: st.bio_dev,
    }) {
        unsafe {
            (*s).read_bytes += st.held_bio_read;
            (*s).write_bytes += st.held_bio_write;
        }
    }
    st.held_bio_read = 0;
    st.held_bio_write = 0;
}

#[tracepoint]
pub fn block_bio_queue_tp(ctx: TracePointContext) -> u32 {
    crate::maps::hit(tracer_common::hits::Prog::BlockBioQueueTp);
    let (tgid, _) = current_ids();
    // As `bio_queue`: what is submitted after the window's end is not its.
    if !is_traced(tgid) || account::stopped() {
        return 0;
    }
    let sector: u64 = unsafe { ctx.read_at(OFF_BIO_SECTOR.load() as usize) }.unwrap_or(0);
    let dev: u32 = unsafe { ctx.read_at(OFF_BIO_DEV.load() as usize) }.unwrap_or(0);
    let nr_sector: u32 = unsafe { ctx.read_at(OFF_BIO_NR_SECTOR.load() as usize) }.unwrap_or(0);
    let rwbs: [u8; 4] = unsafe { ctx.read_at(OFF_BIO_RWBS.load() as usize) }.unwrap_or([0; 4]);
    let _ = BIO_OWNER.insert(&sector, &tgid, 0);
    bio_bytes(tgid, dev, nr_sector as u64 * 512, rw_kind(&rwbs));
    0
}

#[inline(always)]
fn bio_bytes(tgid: u32, dev: u32, bytes: u64, kind: u32) {
    // Bytes are counted here, where the submitter is current, so they are exact whatever
    // happens to the requests later (merges, splits, requeues, issue by a worker).
    let Some(s) = stat(&BlkKey { tgid, dev }) else {
        return;
    };
    match kind {
        0 => unsafe { (*s).read_bytes += bytes },
        1 => unsafe { (*s).write_bytes += bytes },
        _ => {}
    }
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
// TP_PROTO(struct bio *split, unsigned int new_sector)
#[raw_tracepoint(tracepoint = "block_split")]
pub fn block_split(ctx: RawTracePointContext) -> u32 {
    crate::maps::hit(tracer_common::hits::Prog::BlockSplit);
    split_raw::<Probe>(ctx.arg(0));
    0
}

#[btf_tracepoint(function = "block_split")]
pub fn block_split_btf(ctx: BtfTracePointContext) -> i32 {
    crate::maps::hit(tracer_common::hits::Prog::BlockSplitBtf);
    split_raw::<Direct>(ctx.arg(0));
    0
}

#[inline(always)]
fn split_raw<K: Kernel>(bio: u64) {
    // `bio` is the front part, still at the original sector; the rest starts where it ends
    // (the tracepoint's own `new_sector` is 32 bits: wrong past 2 TiB).
    let sector: u64 = K::read(bio, OFF_K_BIO_SECTOR.load());
    let new = sector + (K::read::<u32>(bio, OFF_K_BIO_SIZE.load()) as u64 >> 9);
    let bdev: u64 = K::read(bio, OFF_K_BIO_BDEV.load());
    if bdev == 0 {
        return;
    }
    let disk = bdev_disk::<K>(bdev);
    pass_owner(owner_slot(sector, disk), new, disk);
}

/// The bio now at `sector` of `disk` goes on as another request than the one whose owner slot
/// is `from` (a split's rest, a stacked device's bio). Counted or not by its own pick: were it
/// counted only where the first one was, it would be picked 1 in `4^shift`, at a weight of
/// `2^shift`. A request picked whose first part was not has its owner from the process
/// queueing it (splits run in the submitter's context).
#[inline(always)]
fn pass_owner(from: Option<*mut OwnerSlot>, sector: u64, disk: u32) {
    let Some(shift) = picked_now(|| sector) else {
        return;
    };
    let tgid = match from {
        Some(o) => unsafe { (*o).tgid },
        None if shift != 0 => {
            let (tgid, _) = current_ids();
            if !is_traced(tgid) {
                return;
            }
            tgid
        }
        None => return,
    };
    set_owner(sector, disk, tgid, shift);
}

#[tracepoint]
pub fn block_split_tp(ctx: TracePointContext) -> u32 {
    crate::maps::hit(tracer_common::hits::Prog::BlockSplitTp);
    let sector: u64 = unsafe { ctx.read_at(OFF_SPLIT_SECTOR.load() as usize) }.unwrap_or(0);
    let new: u64 = unsafe { ctx.read_at(OFF_SPLIT_NEW.load() as usize) }.unwrap_or(0);
    split(sector, new);
    0
}

/// A bio goes on from a stacked device (an NVMe multipath head, md, a device mapper) to
/// another, the same bio: the kernel traces its queueing once, at the first device, and its
/// request is made at the second, so its owner goes with it. A device mapper's clones, md's
/// mirror copies, are new bios whose queueing is traced again. Attached only where such a
/// device exists: every bio to a partition is remapped too, before its queueing is traced.
// TP_PROTO(struct bio *bio, dev_t dev, sector_t from)
#[raw_tracepoint(tracepoint = "block_bio_remap")]
pub fn block_bio_remap(ctx: RawTracePointContext) -> u32 {
    crate::maps::hit(tracer_common::hits::Prog::BlockBioRemap);
    remap::<Probe>(ctx.arg(0), ctx.arg(1), ctx.arg(2));
    0
}

#[btf_tracepoint(function = "block_bio_remap")]
pub fn block_bio_remap_btf(ctx: BtfTracePointContext) -> i32 {
    crate::maps::hit(tracer_common::hits::Prog::BlockBioRemapBtf);
    remap::<Direct>(ctx.arg(0), ctx.arg(1), ctx.arg(2));
    0
}

/// `bio`, now at its new device and sector, was at `from` of the stacked device `dev` (its
/// whole disk's `dev_t`). A partition's own remap (`dev` is the bio's device) comes before the
/// bio's queueing, which names its owner at the absolute sector: passed over, since an owner
/// found at the relative sector would be another bio's. So the owner goes straight to the
/// absolute sector: a partition's (md on partitions) is remapped after this.
#[inline(always)]
fn remap<K: Kernel>(bio: u64, dev: u64, from: u64) {
    let bdev: u64 = K::read(bio, OFF_K_BIO_BDEV.load());
    if bdev == 0 || dev as u32 == K::read::<u32>(bdev, OFF_K_BDEV_DEV.load()) {
        return;
    }
    let sector = K::read::<u64>(bio, OFF_K_BIO_SECTOR.load())
        + K::read::<u64>(bdev, OFF_K_BDEV_START.load());
    pass_owner(owner_slot(from, dev as u32), sector, bdev_disk::<K>(bdev));
}

#[tracepoint]
pub fn block_bio_remap_tp(ctx: TracePointContext) -> u32 {
    crate::maps::hit(tracer_common::hits::Prog::BlockBioRemapTp);
    // A partition's own remap, passed over as above. Keyed by sector alone, the owner then
    // reaches a partition's absolute sector only where its stacked device is on a whole disk.
    let dev: u32 = unsafe { ctx.read_at(OFF_REMAP_DEV.load() as usize) }.unwrap_or(0);
    let old_dev: u32 = unsafe { ctx.read_at(OFF_REMAP_OLD_DEV.load() as usize) }.unwrap_or(0);
    if dev == old_dev {
        return 0;
    }
    let old: u64 = unsafe { ctx.read_at(OFF_REMAP_OLD_SECTOR.load() as usize) }.unwrap_or(0);
    let new: u64 = unsafe { ctx.read_at(OFF_REMAP_SECTOR.load() as usize) }.unwrap_or(0);
    split(old, new);
    0
}

#[inline(always)]
fn split(sector: u64, new: u64) {
    let Some(owner) = (unsafe { BIO_OWNER.get(&sector) }).copied() else {
        return;
    };
    let _ = BIO_OWNER.insert(&new, &owner, 0);
}

/// A request's disk, its `struct gendisk` (`rq->q->disk`; 0 when it has none).
#[inline(always)]
fn rq_disk<K: Kernel>(rq: u64) -> u64 {
    let q: u64 = K::read(rq, OFF_K_RQ_Q.load());
    if q == 0 {
        return 0;
    }
    K::read(q, OFF_K_Q_DISK.load())
}

/// The kernel's `dev_t` of a disk (`disk_devt(disk)`, as the tracepoints).
#[inline(always)]
fn disk_dev<K: Kernel>(disk: u64) -> u32 {
    if disk == 0 {
        return 0;
    }
    let major: u32 = K::read(disk, OFF_K_DISK_MAJOR.load());
    let minor: u32 = K::read(disk, OFF_K_DISK_MINOR.load());
    (major << MINORBITS) | minor
}

/// The request goes to the device. Its owner is the submitter of its first bio when
/// `block_bio_queue` saw one (whoever dispatches it: the submitter, kblockd, another process
/// running the queue), else nobody traced; queueing started at its allocation.
// TP_PROTO(struct request *rq)
#[raw_tracepoint(tracepoint = "block_rq_issue")]
pub fn block_rq_issue(ctx: RawTracePointContext) -> u32 {
    by_path(Prog::BlockRqIssue, |p| {
        let rq: u64 = ctx.arg(0);
        rq_issue::<Probe>(rq, rq, p);
    });
    0
}

#[btf_tracepoint(function = "block_rq_issue")]
pub fn block_rq_issue_btf(ctx: BtfTracePointContext) -> i32 {
    by_path(Prog::BlockRqIssueBtf, |p| {
        rq_issue::<Direct>(arg0_value(&ctx), ctx.arg(0), p)
    });
    0
}

/// `rq`: the request's address, `p`: the same to read from (a typed pointer for [`Direct`]).
#[inline(always)]
fn rq_issue<K: Kernel>(rq: u64, p: u64, prog: Prog) {
    // Read once the request is known to be ours: most of a machine's are not.
    let clock = || {
        traced(prog);
        unsafe { bpf_ktime_get_ns() }
    };
    let Some(slot) = RQ_INFLIGHT.get_ptr_mut(slot_of(rq, RQ_SLOTS)) else {
        return;
    };
    let mine = unsafe { (*slot).rq == rq };
    let spilled = counter(&RQ_SPILLED) != 0;
    // Who the request is: its allocation stamp (0 when the block layer did not stamp it: no
    // I/O statistics, no scheduler) and its first bio. Requests allocated under one plug share
    // a stamp, and an unstamped one has none, so the bio tells them apart. Read only when an
    // entry for this address may exist, or for a request that is kept.
    let identity = || -> (u64, u64) {
        (
            K::read(p, OFF_K_RQ_START.load()),
            K::read(p, OFF_K_RQ_BIO.load()),
        )
    };
    let known = (mine || spilled).then(identity);
    if let Some((alloc, bio)) = known {
        if mine {
            if unsafe { (*slot).same(alloc, bio) } {
                unsafe { (*slot).reissued::<K>(p, clock()) };
                return;
            }
            // The same address, a new request: the old one completed unseen.
            unsafe { (*slot).rq = 0 };
            count_drop(Drop::BlockNoCompletion);
        }
        // The hash lookup only while something was spilled.
        let r = if spilled {
            RQ_SPILL.get_ptr_mut(&rq)
        } else {
            None
        };
        if let Some(r) = r {
            if unsafe { (*r).same(alloc, bio) } {
                unsafe { (*r).reissued::<K>(p, clock()) };
                return;
            }
            if RQ_SPILL.remove(&rq).is_ok() {
                counter_add(&RQ_SPILLED, u64::MAX);
                count_drop(Drop::BlockNoCompletion);
            }
        }
    }
    let sector: u64 = K::read(p, OFF_K_RQ_SECTOR.load());
    if !picked_at(sector) {
        return;
    }
    let dev = disk_dev::<K>(rq_disk::<K>(p));
    // Not the current process when no traced bio owns it: a queue is run by whoever comes,
    // and dispatches the requests it holds, other processes' writeback too (charged to the
    // data demo's loaders that way: 2-8 requests of 3-4 MiB each a run).
    let Some(o) = owner_slot(sector, dev) else {
        return;
    };
    // Consumed: a later request at this sector is somebody else's until a traced bio is
    // queued there again.
    let tgid = unsafe { (*o).tgid };
    let shift = owner_shift(o);
    unsafe { (*o).tgid = 0 };
    let now = clock();
    let (alloc, bio) = known.unwrap_or_else(identity);
    let opf: u32 = K::read(p, OFF_K_RQ_FLAGS.load());
    let v = RqSlot {
        rq,
        alloc_ns: alloc,
        bio,
        issue_ns: now,
        bytes: K::read::<u32>(p, OFF_K_RQ_LEN.load()) as u64,
        tgid,
        write: op_kind(opf),
        sector,
        dev,
        shift,
    };
    // Two CPUs may fill one free slot at once (plain stores): rare, and it costs one of the
    // two requests or a misattribution, not the counts of others.
    let held = unsafe { (*slot).rq != 0 };
    // A slot held longer than the block layer's timeouts allow is a completion never seen.
    let stale = held && now.saturating_sub(unsafe { (*slot).issue_ns }) > STALE_NS;
    if stale {
        count_drop(Drop::BlockNoCompletion);
    }
    if !held || stale {
        unsafe { *slot = v };
    } else if RQ_SPILL.insert(&rq, &v, 0).is_ok() {
        counter_add(&RQ_SPILLED, 1);
    } else {
        count_drop(Drop::BlockMapFull);
    }
}

#[tracepoint]
pub fn block_rq_insert_tp(ctx: TracePointContext) -> u32 {
    crate::maps::hit(tracer_common::hits::Prog::BlockRqInsertTp);
    start_tp(&ctx, true);
    0
}

#[tracepoint]
pub fn block_rq_issue_tp(ctx: TracePointContext) -> u32 {
    crate::maps::hit(tracer_common::hits::Prog::BlockRqIssueTp);
    start_tp(&ctx, false);
    0
}

#[inline(always)]
fn start_tp(ctx: &TracePointContext, insert: bool) {
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
    // The submitter of its first bio, not whoever runs the queue (see `rq_issue`).
    let tgid = match unsafe { BIO_OWNER.get(&sector) } {
        Some(owner) => *owner,
        None => return,
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

// TP_PROTO(struct request *rq, blk_status_t error, unsigned int nr_bytes)
#[raw_tracepoint(tracepoint = "block_rq_complete")]
pub fn block_rq_complete(ctx: RawTracePointContext) -> u32 {
    by_path(Prog::BlockRqComplete, |p| {
        let rq: u64 = ctx.arg(0);
        rq_complete::<Probe>(rq, rq, ctx.arg::<u64>(2), p)
    });
    0
}

#[btf_tracepoint(function = "block_rq_complete")]
pub fn block_rq_complete_btf(ctx: BtfTracePointContext) -> i32 {
    by_path(Prog::BlockRqCompleteBtf, |p| {
        rq_complete::<Direct>(arg0_value(&ctx), ctx.arg(0), ctx.arg::<u64>(2), p)
    });
    0
}

/// `rq`: the request's address, `p`: the same to read from; `nr_bytes`: the bytes this
/// completion finished. Reads nothing of the request where the issue kept what it needs.
#[inline(always)]
fn rq_complete<K: Kernel>(rq: u64, p: u64, nr_bytes: u64, prog: Prog) {
    if ISSUE_STAMPED.load() != 0 {
        complete_stamped::<K>(p, nr_bytes, prog);
        return;
    }
    let Some(slot) = RQ_INFLIGHT.get_ptr_mut(slot_of(rq, RQ_SLOTS)) else {
        return;
    };
    let (r, in_slot) = if unsafe { (*slot).rq } == rq {
        (unsafe { *slot }, true)
    } else if counter(&RQ_SPILLED) != 0 {
        match RQ_SPILL.get_ptr(&rq) {
            Some(r) => (unsafe { *r }, false),
            None => return,
        }
    } else {
        return;
    };
    traced(prog);
    // Only for a request kept at its issue: most of a machine's are not.
    let now = unsafe { bpf_ktime_get_ns() };
    let done: u64 = nr_bytes & 0xffff_ffff;
    if done != 0 && done < r.bytes {
        // Part of it: the rest completes later.
        if in_slot {
            unsafe { (*slot).bytes -= done };
        } else if let Some(p) = RQ_SPILL.get_ptr_mut(&rq) {
            unsafe { (*p).bytes -= done };
        }
    } else if in_slot {
        unsafe { (*slot).rq = 0 };
    } else if RQ_SPILL.remove(&rq).is_ok() {
        counter_add(&RQ_SPILLED, u64::MAX);
    }
    let queued = if r.alloc_ns != 0 {
        r.issue_ns.saturating_sub(r.alloc_ns)
    } else {
        0
    };
    account(
        now,
        &BlkInflight {
            insert_ns: r.alloc_ns,
            issue_ns: r.issue_ns,
            tgid: r.tgid,
            write: r.write,
            bytes: r.bytes,
        },
        r.dev,
        r.sector,
        queued,
        done_of(done, r.bytes),
        r.shift,
    );
}

/// The bytes a completion finished: `nr_bytes` (`done`) where it finished part of the
/// `left` bytes the request had, all of them otherwise.
#[inline(always)]
fn done_of(done: u64, left: u64) -> u64 {
    if done != 0 && done < left {
        done
    } else {
        left
    }
}

/// A completion with no issue program: the request is the traced submitter's when its first
/// sector holds a traced bio's owner (consumed here, as the issue did), timed from the
/// kernel's issue stamp; its queueing from its allocation stamp to that one. The stamps are the
/// block layer's clock (a plug's cached `ktime_get_ns`: the submission's first reading under
/// one plug, microseconds early for a plugged direct read, against the program's own reading
/// at the issue).
#[inline(always)]
fn complete_stamped<K: Kernel>(p: u64, nr_bytes: u64, prog: Prog) {
    let sector: u64 = K::read(p, OFF_K_RQ_SECTOR.load());
    if !picked_at(sector) {
        return;
    }
    let alloc: u64 = K::read(p, OFF_K_RQ_START.load());
    // The owner of a bio at this sector of another disk is not this request's: an md
    // mirror's other copy, a device mapper's bio at its own device's sector.
    let dev = disk_dev::<K>(rq_disk::<K>(p));
    let Some(o) = owner_slot(sector, dev) else {
        return;
    };
    // Before this completion: the bytes not yet completed.
    let bytes = K::read::<u32>(p, OFF_K_RQ_LEN.load()) as u64;
    // A request with none: an empty flush (fsync's) that the flush machinery completes
    // without issuing it, or a flushed write's last step after its data completed, at the
    // sector after its data (the next bio's). Neither is this owner's request.
    if bytes == 0 {
        return;
    }
    traced(prog);
    let now = unsafe { bpf_ktime_get_ns() };
    let tgid = unsafe { (*o).tgid };
    let picked = owner_shift(o);
    unsafe { (*o).tgid = 0 };
    let done: u64 = nr_bytes & 0xffff_ffff;
    if done != 0 && done < bytes {
        // Part of it: the rest completes later, from where this part ends (after the
        // consumption above: the two sectors may share a slot). While requests are sampled,
        // the rest counts only where its own sector is picked too: a request completed in
        // parts is rare (a device's partial completion).
        set_owner(sector + (done >> 9), dev, tgid, picked);
    }
    let issue: u64 = if TEST_UNSTAMPED_ISSUES.load() != 0 {
        0
    } else {
        K::read(p, OFF_K_RQ_IO_START.load())
    };
    let (started, queued) = if issue != 0 {
        let queued = if alloc != 0 {
            issue.saturating_sub(alloc)
        } else {
            0
        };
        (issue, queued)
    } else if alloc != 0 {
        // This queue stopped stamping issues (its statistics turned off during the trace):
        // timed from the allocation, queueing included.
        count_drop(Drop::BlockIssueUnstamped);
        (alloc, 0)
    } else {
        count_drop(Drop::BlockIssueUnstamped);
        return;
    };
    let opf: u32 = K::read(p, OFF_K_RQ_FLAGS.load());
    account(
        now,
        &BlkInflight {
            insert_ns: alloc,
            issue_ns: started,
            tgid,
            write: op_kind(opf),
            bytes,
        },
        dev,
        sector,
        queued,
        done_of(done, bytes),
        picked,
    );
}

#[tracepoint]
pub fn block_rq_complete_tp(ctx: TracePointContext) -> u32 {
    crate::maps::hit(tracer_common::hits::Prog::BlockRqCompleteTp);
    let now = unsafe { bpf_ktime_get_ns() };
    let dev: u32 = unsafe { ctx.read_at(OFF_RQC_DEV.load() as usize) }.unwrap_or(0);
    let sector: u64 = unsafe { ctx.read_at(OFF_RQC_SECTOR.load() as usize) }.unwrap_or(0);
    let nr_sector: u32 = unsafe { ctx.read_at(OFF_RQC_NR_SECTOR.load() as usize) }.unwrap_or(0);
    complete_tp(now, sector, dev, nr_sector as u64 * 512);
    0
}

/// `done`: the bytes this completion finished; a request can complete in several parts, and
/// only the last one forgets it.
#[inline(always)]
fn complete_tp(now: u64, sector: u64, dev: u32, done: u64) {
    let key = BlkInflightKey {
        sector,
        dev,
        _pad: 0,
    };
    let Some(rp) = BLK_INFLIGHT.get_ptr_mut(&key) else {
        return;
    };
    let r = unsafe { *rp };
    if done != 0 && done < r.bytes {
        unsafe { (*rp).bytes -= done };
    } else {
        let _ = BLK_INFLIGHT.remove(&key);
    }
    let queued = if r.insert_ns != 0 && r.issue_ns != 0 {
        r.issue_ns.saturating_sub(r.insert_ns)
    } else {
        0
    };
    account(now, &r, dev, sector, queued, done_of(done, r.bytes), 0);
}

/// Counts a completion of request `r` (its bytes before this completion), which finished
/// `done` bytes of it; `2^shift` times for a request picked under sampling shift `shift`.
#[inline(always)]
fn account(now: u64, r: &BlkInflight, dev: u32, sector: u64, queued: u64, done: u64, shift: u32) {
    // Seen at insert only (its issue raced with the insert): timed from the insert.
    let started = if r.issue_ns != 0 {
        r.issue_ns
    } else {
        r.insert_ns
    };
    let Some(stat) = stat(&BlkKey { tgid: r.tgid, dev }) else {
        return;
    };
    let lat = now.saturating_sub(started);
    // The verifier wants the shift bounded.
    let shift = shift.min(BLOCK_SHIFT_MAX);
    let w = 1u64 << shift;
    crate::timeline::block(
        r.tgid,
        dev,
        started,
        lat,
        r.bytes << shift,
        r.write,
        sector,
        queued << shift,
        w,
    );
    let s = unsafe { &mut *stat };
    s.requests += w;
    if r.write == 1 {
        s.writes += w;
        s.done_bytes += done << shift;
    } else if r.write == 0 {
        s.reads += w;
        s.done_bytes += done << shift;
    }
    s.total_ns += lat << shift;
    s.queue_ns += queued << shift;
    let b = log2_bucket(lat);
    if b < HIST_BUCKETS {
        s.hist[b] += w;
    }
    s.seen += 1;
    s.var += w * (w - 1);
    if let Some(n) = BLOCK_COUNTED.get_ptr_mut(0) {
        unsafe { *n += w };
    }
}
