//! Taking entries out of a kernel hash map while the programs still write to it (the retire
//! passes): each entry is read and deleted in one step, `BPF_MAP_LOOKUP_AND_DELETE_ELEM`
//! (hash maps since Linux 5.14), so an update that lands after the read is not deleted unread,
//! as it could be between a lookup and a delete. aya 0.14 keeps that command to its queue and
//! stack maps, hence the syscall here. Older kernels answer EINVAL (or ENOTSUPP): there the
//! entries are read, then deleted.
//!
//! The keys are listed first, in batches (`crate::batch`): walking them one at a time is a
//! syscall per entry of the map, dead or alive, at every pass.
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

/// Takes the entries whose keys `pick` chooses out of `map`; an entry that cannot be taken
/// stays in the map (read with the others at the end).
pub fn take<K: Pod, V: Pod>(
    map: &mut HashMap<&mut MapData, K, V>,
    pick: impl Fn(&K) -> bool,
) -> Vec<(K, V)> {
    take_with(map, pick, !NO_LOOKUP_AND_DELETE.load(Ordering::Relaxed))
}

/// Set once a kernel refused to delete in batches.
static NO_DELETE_BATCH: AtomicBool = AtomicBool::new(false);

/// Takes the entries whose keys `pick` chooses out of `map`, as [`take`], for entries no
/// program writes any more (a dead thread's rows): read with the others in the listing's
/// batches, then deleted a batch at a time. [`take`] reads each one again and deletes it in
/// a syscall of its own; a storm of short processes leaves ~20 rows each, and those syscalls
/// were an eighth of gputrace's CPU. What a program wrote between the read and the delete
/// would be lost, hence only final rows.
pub fn take_final<K: Pod, V: Pod>(
    map: &mut HashMap<&mut MapData, K, V>,
    pick: impl Fn(&K) -> bool,
) -> Vec<(K, V)> {
    if !NO_DELETE_BATCH.load(Ordering::Relaxed) {
        // Filtered in place (the listing's own buffer): a pass reads ~20,000 rows of ~300
        // bytes under a shell loop.
        let picked: Vec<(K, V)> = crate::batch::entries(map)
            .into_iter()
            .filter(|(k, _)| pick(k))
            .collect();
        let keys: Vec<K> = picked.iter().map(|(k, _)| *k).collect();
        match crate::batch::delete(map, &keys) {
            Ok(deleted) => {
                return picked
                    .into_iter()
                    .zip(deleted)
                    .filter_map(|(kv, d)| d.then_some(kv))
                    .collect();
            }
            Err(e) if unsupported(&e) => NO_DELETE_BATCH.store(true, Ordering::Relaxed),
            Err(_) => {}
        }
    }
    take(map, pick)
}

/// `one_step`: try the one-step command (else read, then delete).
fn take_with<K: Pod, V: Pod>(
    map: &mut HashMap<&mut MapData, K, V>,
    pick: impl Fn(&K) -> bool,
    mut one_step: bool,
) -> Vec<(K, V)> {
    let keys: Vec<K> = crate::batch::keys(map)
        .into_iter()
        .filter(|k| pick(k))
        .collect();
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
    use aya::maps::Map;

    use super::*;
    use crate::batch::tests::hash_map_of;

    /// A BPF hash map of u32 -> u64 with room for 64 entries, or None (with a loud skip) where
    /// this process may not create one; in CI, a failure.
    fn hash_map() -> Option<Map> {
        hash_map_of(64)
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
    fn takes_final_entries_in_batches() {
        let Some(mut m) = hash_map_of(4096) else {
            return;
        };
        let mut map: HashMap<&mut MapData, u32, u64> = HashMap::try_from(&mut m).unwrap();
        for k in 0..3000u32 {
            map.insert(k, u64::from(k) * 100, 0).unwrap();
        }
        let mut taken = take_final(&mut map, |k| k % 3 == 0);
        taken.sort();
        let want: Vec<(u32, u64)> = (0..3000)
            .step_by(3)
            .map(|k| (k, u64::from(k) * 100))
            .collect();
        assert_eq!(taken, want);
        assert!(
            !NO_DELETE_BATCH.load(Ordering::Relaxed),
            "this kernel (5.6 and later) deletes hash entries in batches"
        );
        let mut left: Vec<u32> = map.keys().map(|k| k.unwrap()).collect();
        left.sort();
        assert_eq!(left, (0..3000).filter(|k| k % 3 != 0).collect::<Vec<u32>>());
        assert!(take_final(&mut map, |k| k % 3 == 0).is_empty());
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
