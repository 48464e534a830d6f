//! Taking entries out of a kernel hash map while the programs still write to it (the retire
//! passes): each entry is read and deleted in one step, `BPF_MAP_LOOKUP_AND_DELETE_ELEM`
//! (hash maps since Linux 5.14), so an update that lands after the read is not deleted unread,
//! as it could be between a lookup and a delete. aya 0.14 keeps that command to its queue and
//! stack maps, hence the syscall here. Older kernels answer EINVAL (or ENOTSUPP): there the
//! entries are read, then deleted.
//!
//! The keys are listed first, a chunk of entries per `BPF_MAP_LOOKUP_BATCH` (hash maps since
//! Linux 5.6): walking them one `BPF_MAP_GET_NEXT_KEY` at a time is a syscall per entry of
//! the map, dead or alive, at every pass (50,000 keys: ~42 ms walked, ~14 ms in batches on
//! the development VM). Kernels without it get the walk.
//!
//! What one step cannot close: a program that looked the entry up just before the delete may
//! still write to the value it holds (the kernel frees it after an RCU grace period); only a
//! row that a live program is updating can be in that state, and the passes take only the
//! rows of dead threads and closed files.

use std::{
    os::fd::{AsFd, AsRawFd, BorrowedFd},
    sync::atomic::{AtomicBool, Ordering},
};

use aya::{
    maps::{HashMap, IterableMap, MapData},
    Pod,
};
use aya_obj::generated::{bpf_attr, bpf_cmd};

/// Set once a kernel refused the one-step command for hash maps: it will not learn it later.
static NO_LOOKUP_AND_DELETE: AtomicBool = AtomicBool::new(false);

/// ENOTSUPP, the kernel-internal errno some paths leak to user space (not in libc).
const ENOTSUPP: i32 = 524;

/// Reads and deletes `key`'s entry in one step: `Ok(None)` when there is none.
fn lookup_and_delete<K: Pod, V: Pod>(fd: BorrowedFd<'_>, key: &K) -> std::io::Result<Option<V>> {
    let mut value = std::mem::MaybeUninit::<V>::zeroed();
    // SAFETY: an all-zero bpf_attr is valid (a union of plain integers).
    let mut attr = unsafe { std::mem::zeroed::<bpf_attr>() };
    attr.__bindgen_anon_2.map_fd = fd.as_raw_fd() as u32;
    attr.__bindgen_anon_2.key = key as *const K as u64;
    attr.__bindgen_anon_2.__bindgen_anon_1.value = value.as_mut_ptr() as u64;
    match crate::bpf::sys_bpf(bpf_cmd::BPF_MAP_LOOKUP_AND_DELETE_ELEM, &mut attr) {
        // SAFETY: the kernel wrote the value (its size is the map's: checked when the typed
        // map was made), and V is Pod.
        Ok(_) => Ok(Some(unsafe { value.assume_init() })),
        Err(e) if e.raw_os_error() == Some(libc::ENOENT) => Ok(None),
        Err(e) => Err(e),
    }
}

fn unsupported(e: &std::io::Error) -> bool {
    matches!(
        e.raw_os_error(),
        Some(libc::EINVAL) | Some(libc::EOPNOTSUPP) | Some(ENOTSUPP)
    )
}

/// Entries per `BPF_MAP_LOOKUP_BATCH` at first (doubled when a hash bucket holds more).
const BATCH: usize = 1024;

/// Every key of hash map `fd` (values of `value_size` bytes), `chunk` entries per call: `Err`
/// where the kernel cannot list them in batches.
fn batch_keys<K: Pod>(
    fd: BorrowedFd<'_>,
    value_size: usize,
    mut chunk: usize,
) -> std::io::Result<Vec<K>> {
    let mut out: Vec<K> = Vec::new();
    // The kernel's cursor: a bucket index for hash maps (4 bytes; room for 8).
    let (mut cursor_in, mut cursor_out) = (0u64, 0u64);
    let mut first = true;
    let mut keys: Vec<std::mem::MaybeUninit<K>> = Vec::new();
    let mut values: Vec<u8> = Vec::new();
    loop {
        keys.clear();
        keys.reserve(chunk);
        values.resize(chunk * value_size.max(1), 0);
        // SAFETY: an all-zero bpf_attr is valid (a union of plain integers).
        let mut attr = unsafe { std::mem::zeroed::<bpf_attr>() };
        // SAFETY: the batch arm of the zeroed union, written before the kernel reads it.
        let b = unsafe { &mut attr.batch };
        b.in_batch = if first {
            0
        } else {
            &mut cursor_in as *mut u64 as u64
        };
        b.out_batch = &mut cursor_out as *mut u64 as u64;
        b.keys = keys.as_mut_ptr() as u64;
        b.values = values.as_mut_ptr() as u64;
        b.count = chunk as u32;
        b.map_fd = fd.as_raw_fd() as u32;
        let r = crate::bpf::sys_bpf(bpf_cmd::BPF_MAP_LOOKUP_BATCH, &mut attr);
        // SAFETY: the kernel wrote `count` (never above the room given) and that many keys.
        let n = (unsafe { attr.batch.count } as usize).min(chunk);
        unsafe { keys.set_len(n) };
        // SAFETY: the first n keys were written by the kernel, and K is Pod.
        out.extend(keys.iter().map(|k| unsafe { k.assume_init() }));
        match r {
            Ok(_) => {}
            // ENOENT: no more buckets (the last call may still have returned some).
            Err(e) if e.raw_os_error() == Some(libc::ENOENT) => return Ok(out),
            // A bucket with more entries than `chunk`: again from the same place, with room.
            Err(e) if e.raw_os_error() == Some(libc::ENOSPC) && n == 0 => {
                chunk *= 2;
                continue;
            }
            Err(e) => return Err(e),
        }
        cursor_in = cursor_out;
        first = false;
    }
}

/// Takes the entries whose keys `pick` chooses out of `map`; an entry that cannot be taken
/// stays in the map (read with the others at the end).
pub fn take<K: Pod, V: Pod>(
    map: &mut HashMap<&mut MapData, K, V>,
    pick: impl Fn(&K) -> bool,
) -> Vec<(K, V)> {
    take_with(map, pick, !NO_LOOKUP_AND_DELETE.load(Ordering::Relaxed))
}

/// `one_step`: try the one-step command (else read, then delete).
fn take_with<K: Pod, V: Pod>(
    map: &mut HashMap<&mut MapData, K, V>,
    pick: impl Fn(&K) -> bool,
    mut one_step: bool,
) -> Vec<(K, V)> {
    let listed = batch_keys::<K>(map.map().fd().as_fd(), std::mem::size_of::<V>(), BATCH);
    let keys: Vec<K> = match listed {
        Ok(keys) => keys.into_iter().filter(|k| pick(k)).collect(),
        Err(_) => map
            .keys()
            .filter_map(|k| k.ok())
            .filter(|k| pick(k))
            .collect(),
    };
    let mut out = Vec::with_capacity(keys.len());
    for k in keys {
        if one_step {
            let fd = map.map().fd().as_fd();
            match lookup_and_delete::<K, V>(fd, &k) {
                Ok(Some(v)) => {
                    out.push((k, v));
                    continue;
                }
                Ok(None) => continue,
                Err(e) if unsupported(&e) => {
                    NO_LOOKUP_AND_DELETE.store(true, Ordering::Relaxed);
                    one_step = false;
                }
                // Anything else: this key as on old kernels. What was taken stays taken (a
                // pass that returned nothing would lose the rows it had deleted).
                Err(_) => {}
            }
        }
        if let Ok(v) = map.get(&k, 0) {
            // A row that vanished between the read and the delete was taken by no one.
            if map.remove(&k).is_ok() {
                out.push((k, v));
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use std::os::fd::{FromRawFd, OwnedFd};

    use aya::maps::Map;

    use super::*;

    /// A BPF hash map of u32 -> u64 with room for 64 entries, or None (with a loud skip) where
    /// this process may not create one; in CI, a failure.
    fn hash_map() -> Option<Map> {
        hash_map_of(64)
    }

    fn hash_map_of(entries: u32) -> Option<Map> {
        // union bpf_attr for BPF_MAP_CREATE: map_type (1: hash), key_size, value_size,
        // max_entries.
        let mut attr = [0u8; 72];
        attr[0..4].copy_from_slice(&1u32.to_ne_bytes());
        attr[4..8].copy_from_slice(&4u32.to_ne_bytes());
        attr[8..12].copy_from_slice(&8u32.to_ne_bytes());
        attr[12..16].copy_from_slice(&entries.to_ne_bytes());
        // SAFETY: attr outlives the call and is what BPF_MAP_CREATE reads.
        let fd = unsafe {
            libc::syscall(
                libc::SYS_bpf,
                0 as libc::c_int,
                attr.as_ptr(),
                attr.len() as libc::c_uint,
            )
        };
        if fd < 0 {
            let e = std::io::Error::last_os_error();
            assert!(
                std::env::var_os("CI").is_none(),
                "create a BPF hash map: {e}"
            );
            eprintln!("SKIP: cannot create a BPF hash map ({e}): run the tests as root");
            return None;
        }
        // SAFETY: the syscall returned a new fd that nothing else owns.
        let fd = unsafe { OwnedFd::from_raw_fd(fd as i32) };
        Some(Map::HashMap(MapData::from_fd(fd).expect("map info")))
    }

    fn check(one_step: bool) {
        let Some(mut m) = hash_map() else { return };
        let mut map: HashMap<&mut MapData, u32, u64> = HashMap::try_from(&mut m).unwrap();
        for k in 1..=10u32 {
            map.insert(k, u64::from(k) * 100, 0).unwrap();
        }
        let mut taken = take_with(&mut map, |k| k % 2 == 0, one_step);
        taken.sort();
        assert_eq!(
            taken,
            vec![(2, 200), (4, 400), (6, 600), (8, 800), (10, 1000)]
        );
        let mut left: Vec<u32> = map.keys().map(|k| k.unwrap()).collect();
        left.sort();
        assert_eq!(left, vec![1, 3, 5, 7, 9]);
        assert!(take_with(&mut map, |k| *k > 100, one_step).is_empty());
    }

    #[test]
    fn takes_the_picked_entries_in_one_step() {
        check(true);
    }

    #[test]
    fn takes_the_picked_entries_by_read_then_delete() {
        check(false);
    }

    #[test]
    fn batches_list_every_key_once() {
        let Some(mut m) = hash_map_of(4096) else {
            return;
        };
        let mut map: HashMap<&mut MapData, u32, u64> = HashMap::try_from(&mut m).unwrap();
        for k in 0..3000u32 {
            map.insert(k, 1, 0).unwrap();
        }
        let fd = map.map().fd().as_fd();
        // One entry per call to start with: the buckets that hold two or more make the kernel
        // ask for room (ENOSPC), and the listing goes on from the same bucket.
        for chunk in [1, 7, BATCH] {
            let mut keys = batch_keys::<u32>(fd, 8, chunk).expect("batch lookup");
            keys.sort();
            assert_eq!(keys, (0..3000).collect::<Vec<u32>>(), "chunk {chunk}");
        }
        // An empty map: nothing, not an error.
        let mut e = hash_map_of(8).unwrap();
        let empty: HashMap<&mut MapData, u32, u64> = HashMap::try_from(&mut e).unwrap();
        assert!(batch_keys::<u32>(empty.map().fd().as_fd(), 8, 4)
            .unwrap()
            .is_empty());
    }

    #[test]
    fn this_kernel_deletes_hash_entries_in_one_step() {
        let Some(mut m) = hash_map() else { return };
        let mut map: HashMap<&mut MapData, u32, u64> = HashMap::try_from(&mut m).unwrap();
        map.insert(7, 70, 0).unwrap();
        let fd = map.map().fd().as_fd();
        match lookup_and_delete::<u32, u64>(fd, &7) {
            Ok(v) => assert_eq!(v, Some(70)),
            // Hash maps learnt the command in 5.14: older kernels fall back, and say so here.
            Err(e) if unsupported(&e) => {
                eprintln!("SKIP: no one-step delete here: {e}");
                return;
            }
            Err(e) => panic!("lookup and delete: {e}"),
        }
        assert_eq!(lookup_and_delete::<u32, u64>(fd, &7).unwrap(), None);
    }
}
