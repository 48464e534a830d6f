//! Reading a kernel hash map whole, a chunk of entries per `BPF_MAP_LOOKUP_BATCH` (hash maps
//! since Linux 5.6), where aya walks it a `BPF_MAP_GET_NEXT_KEY` per entry (and a lookup per
//! entry for the values): 50,000 keys took ~42 ms walked and ~14 ms in batches on the
//! development VM. Kernels without the command get aya's walk.
//!
//! Deleting chosen keys likewise: a chunk of keys per `BPF_MAP_DELETE_BATCH`.
//!
//! For plain hash maps only: a per-CPU map's values are one per CPU.

use std::os::fd::{AsFd, AsRawFd, BorrowedFd};

use aya::{
    maps::{HashMap, IterableMap, MapData},
    Pod,
};
use aya_obj::generated::{bpf_attr, bpf_cmd};

/// Entries per call at first (doubled when one hash bucket holds more).
const CHUNK: usize = 1024;

/// Every entry of `map`, in batches where the kernel can, else walked key by key (entries
/// that cannot be read in the walk are left out).
pub fn entries<T: std::borrow::Borrow<MapData>, K: Pod, V: Pod>(
    map: &HashMap<T, K, V>,
) -> Vec<(K, V)> {
    match batched(map, CHUNK) {
        Ok(v) => v,
        Err(_) => map.iter().filter_map(Result::ok).collect(),
    }
}

/// Every entry of the eBPF object's hash map `name`, as [`entries`].
pub fn read<K: Pod, V: Pod>(ebpf: &aya::Ebpf, name: &str) -> anyhow::Result<Vec<(K, V)>> {
    use anyhow::Context;
    let map: HashMap<&MapData, K, V> = HashMap::try_from(
        ebpf.map(name)
            .with_context(|| format!("map {name} missing"))?,
    )?;
    Ok(entries(&map))
}

/// Every key of `map`, as [`entries`].
pub fn keys<T: std::borrow::Borrow<MapData>, K: Pod, V: Pod>(map: &HashMap<T, K, V>) -> Vec<K> {
    match batched(map, CHUNK) {
        Ok(v) => v.into_iter().map(|(k, _)| k).collect(),
        Err(_) => map.keys().filter_map(Result::ok).collect(),
    }
}

/// Every entry of `map`, as [`entries`], or an error where one could not be listed (a walk
/// cut short): for callers that must not take a partial listing for the whole map.
pub fn try_entries<T: std::borrow::Borrow<MapData>, K: Pod, V: Pod>(
    map: &HashMap<T, K, V>,
) -> Result<Vec<(K, V)>, aya::maps::MapError> {
    match batched(map, CHUNK) {
        Ok(v) => Ok(v),
        Err(_) => map.iter().collect(),
    }
}

/// Every key of `map`, as [`try_entries`].
pub fn try_keys<T: std::borrow::Borrow<MapData>, K: Pod, V: Pod>(
    map: &HashMap<T, K, V>,
) -> Result<Vec<K>, aya::maps::MapError> {
    Ok(try_entries(map)?.into_iter().map(|(k, _)| k).collect())
}

/// Deletes `keys` from `map`, a chunk of keys per `BPF_MAP_DELETE_BATCH` (hash maps since
/// Linux 5.6), where a delete is a syscall per key; says which were deleted. `Err` only where
/// the first call failed, nothing deleted (a kernel without the command answers EINVAL, a map
/// type without it ENOTSUPP).
///
/// The kernel deletes the keys in order and stops at the first it cannot (one that is gone:
/// ENOENT), saying how many it did: that key is skipped and the rest sent again.
pub fn delete<T: std::borrow::Borrow<MapData>, K: Pod, V: Pod>(
    map: &HashMap<T, K, V>,
    keys: &[K],
) -> std::io::Result<Vec<bool>> {
    // The typed map was made only if the kernel's key size is K's.
    delete_keys(map.map().fd().as_fd(), keys)
}

fn delete_keys<K: Pod>(fd: BorrowedFd<'_>, keys: &[K]) -> std::io::Result<Vec<bool>> {
    let mut deleted = vec![false; keys.len()];
    let mut at = 0;
    while at < keys.len() {
        let n = (keys.len() - at).min(CHUNK);
        // SAFETY: an all-zero bpf_attr is valid (a union of plain integers).
        let mut attr = unsafe { std::mem::zeroed::<bpf_attr>() };
        // SAFETY: the batch arm of the zeroed union, written before the kernel reads it.
        let b = unsafe { &mut attr.batch };
        b.keys = keys[at..].as_ptr() as u64;
        b.count = n as u32;
        b.map_fd = fd.as_raw_fd() as u32;
        let r = crate::bpf::sys_bpf(bpf_cmd::BPF_MAP_DELETE_BATCH, &mut attr);
        // SAFETY: a plain integer of the union's arm written above.
        let count = unsafe { attr.batch.count } as usize;
        // The kernel writes `count` back once past its argument checks, always under `n` on
        // an error (the keys it deleted before the one it could not); an error before them
        // (no such command, a map type without it, a bad fd) leaves it as given: nothing was
        // deleted.
        let done = if r.is_err() && count >= n {
            0
        } else {
            count.min(n)
        };
        match r {
            Ok(_) => {
                deleted[at..at + n].fill(true);
                at += n;
            }
            Err(e) if e.raw_os_error() == Some(libc::ENOENT) => {
                deleted[at..at + done].fill(true);
                at += done + 1;
            }
            Err(e) if at == 0 && done == 0 => return Err(e),
            // Anything else midway: what was deleted stays deleted; the rest stays in the map.
            Err(_) => {
                deleted[at..at + done].fill(true);
                break;
            }
        }
    }
    Ok(deleted)
}

/// `chunk` entries per call; `Err` where the kernel cannot read the map in batches.
fn batched<T: std::borrow::Borrow<MapData>, K: Pod, V: Pod>(
    map: &HashMap<T, K, V>,
    mut chunk: usize,
) -> std::io::Result<Vec<(K, V)>> {
    let fd = map.map().fd().as_fd();
    let mut out = Vec::new();
    // The kernel's cursor: a bucket index for hash maps (4 bytes; room for 8).
    let (mut cursor_in, mut cursor_out) = (0u64, 0u64);
    let mut first = true;
    // The typed map was made only if the kernel's key and value sizes are K's and V's, so
    // the kernel writes arrays of K and of V.
    let mut keys: Vec<std::mem::MaybeUninit<K>> = Vec::new();
    let mut values: Vec<std::mem::MaybeUninit<V>> = Vec::new();
    loop {
        keys.clear();
        keys.reserve(chunk);
        values.clear();
        values.reserve(chunk);
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
        // The kernel sets `count` to what it wrote on success, at the end (ENOENT) and when a
        // bucket does not fit (ENOSPC); any other error may leave it as given, with nothing
        // written.
        let (done, too_small) = match r {
            Ok(_) => (false, false),
            Err(e) if e.raw_os_error() == Some(libc::ENOENT) => (true, false),
            Err(e) if e.raw_os_error() == Some(libc::ENOSPC) => (false, true),
            Err(e) => return Err(e),
        };
        // SAFETY: see above: the kernel wrote `count` keys and values (never above the room
        // given); K and V are Pod.
        let n = (unsafe { attr.batch.count } as usize).min(chunk);
        unsafe {
            keys.set_len(n);
            values.set_len(n);
        }
        out.extend(
            keys.iter()
                .zip(&values)
                .map(|(k, v)| unsafe { (k.assume_init(), v.assume_init()) }),
        );
        if done {
            return Ok(out);
        }
        if too_small {
            if n > 0 {
                // Not what the kernel does (it returns what fitted without an error): taken
                // as an error, so the caller walks the map instead.
                return Err(std::io::Error::from_raw_os_error(libc::ENOSPC));
            }
            // A bucket with more entries than `chunk`: again from the same place, with room.
            chunk *= 2;
            continue;
        }
        cursor_in = cursor_out;
        first = false;
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use std::os::fd::{FromRawFd, OwnedFd};

    use aya::maps::Map;

    use super::*;

    /// A BPF hash map of u32 -> u64 with room for `entries`, or None (with a loud skip) where
    /// this process may not create one; in CI, a failure.
    pub(crate) fn hash_map_of(entries: u32) -> Option<Map> {
        map_fd(1, entries).map(|fd| Map::HashMap(MapData::from_fd(fd).expect("map info")))
    }

    /// A BPF map of type `map_type` (1: hash, 2: array) of u32 -> u64, as [`hash_map_of`].
    fn map_fd(map_type: u32, entries: u32) -> Option<OwnedFd> {
        // union bpf_attr for BPF_MAP_CREATE: map_type, key_size, value_size, max_entries.
        let mut attr = [0u8; 72];
        attr[0..4].copy_from_slice(&map_type.to_ne_bytes());
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
        Some(unsafe { OwnedFd::from_raw_fd(fd as i32) })
    }

    #[test]
    fn batches_delete_the_keys_given_and_say_which_were_there() {
        let Some(mut m) = hash_map_of(4096) else {
            return;
        };
        let mut map: HashMap<&mut MapData, u32, u64> = HashMap::try_from(&mut m).unwrap();
        for k in 0..3000u32 {
            map.insert(k, u64::from(k), 0).unwrap();
        }
        // Even keys, more than a chunk of them, with two that are not there among them.
        let mut doomed: Vec<u32> = (0..3000).step_by(2).collect();
        doomed.insert(5, 5_000);
        doomed.push(6_000);
        let deleted = delete(&map, &doomed).expect("batch delete");
        let missing: Vec<u32> = doomed
            .iter()
            .zip(&deleted)
            .filter(|(_, d)| !**d)
            .map(|(k, _)| *k)
            .collect();
        assert_eq!(missing, vec![5_000, 6_000]);
        let mut left = keys(&map);
        left.sort();
        assert_eq!(left, (1..3000).step_by(2).collect::<Vec<u32>>());
        assert_eq!(delete(&map, &[]).unwrap(), Vec::<bool>::new());
    }

    #[test]
    fn a_map_that_cannot_delete_in_batches_is_an_error_not_keys_deleted() {
        // Arrays have no batch delete (ENOTSUPP): the kernel fails before it writes the
        // count back, which then still reads as every key given.
        let Some(fd) = map_fd(2, 8) else { return };
        let keys: Vec<u32> = (0..5).collect();
        let e = delete_keys(fd.as_fd(), &keys).expect_err("an array deletes nothing");
        assert!(
            matches!(
                e.raw_os_error(),
                Some(524) | Some(libc::EINVAL) | Some(libc::EOPNOTSUPP)
            ),
            "{e}"
        );
    }

    #[test]
    fn batches_read_every_entry_once() {
        let Some(mut m) = hash_map_of(4096) else {
            return;
        };
        let mut map: HashMap<&mut MapData, u32, u64> = HashMap::try_from(&mut m).unwrap();
        for k in 0..3000u32 {
            map.insert(k, u64::from(k) * 3, 0).unwrap();
        }
        let want: Vec<(u32, u64)> = (0..3000).map(|k| (k, u64::from(k) * 3)).collect();
        // One entry per call to start with: the buckets that hold two or more make the kernel
        // ask for room (ENOSPC), and the reading goes on from the same bucket.
        for chunk in [1, 7, CHUNK] {
            let mut got = batched(&map, chunk).expect("batch lookup");
            got.sort();
            assert_eq!(got, want, "chunk {chunk}");
        }
        let mut got = entries(&map);
        got.sort();
        assert_eq!(got, want);
        let mut k = keys(&map);
        k.sort();
        assert_eq!(k, (0..3000).collect::<Vec<u32>>());
        // An empty map: nothing, not an error.
        let mut e = hash_map_of(8).unwrap();
        let empty: HashMap<&mut MapData, u32, u64> = HashMap::try_from(&mut e).unwrap();
        assert!(batched(&empty, 4).unwrap().is_empty());
    }
}
