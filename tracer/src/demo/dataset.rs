//! The demo's data set: real files on disk, written once, then read by the data-loader workers
//! either through the page cache or with O_DIRECT, so that a data-bound run really waits on the
//! disk (and shows up as block I/O) instead of on memory.

use std::{
    alloc::{self, Layout},
    fs::{File, OpenOptions},
    io::Write,
    os::{fd::AsRawFd, unix::fs::OpenOptionsExt},
    path::{Path, PathBuf},
};

use anyhow::{Context, Result};

const ALIGN: usize = 4096;

pub fn file_path(dir: &Path, i: u32) -> PathBuf {
    dir.join(format!("shard-{i:03}.bin"))
}

/// Writes `count` files of `size` bytes of pseudo-random data, flushed to disk and evicted
/// from the page cache.
pub fn create(dir: &Path, count: u32, size: u64) -> Result<Vec<PathBuf>> {
    let mut rng: u64 = 0x9e37_79b9_7f4a_7c15;
    let mut chunk = vec![0u8; 1 << 20];
    let mut paths = Vec::new();
    for i in 0..count {
        let path = file_path(dir, i);
        let mut f = OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o644)
            .open(&path)
            .with_context(|| format!("create {}", path.display()))?;
        let mut left = size;
        while left > 0 {
            for w in chunk.chunks_exact_mut(8) {
                // xorshift64: cheap bytes that no filesystem can compress or dedupe.
                rng ^= rng << 13;
                rng ^= rng >> 7;
                rng ^= rng << 17;
                w.copy_from_slice(&rng.to_le_bytes());
            }
            let n = left.min(chunk.len() as u64) as usize;
            f.write_all(&chunk[..n])
                .with_context(|| format!("write {}", path.display()))?;
            left -= n as u64;
        }
        f.sync_all()
            .with_context(|| format!("sync {}", path.display()))?;
        drop_cache(&f);
        paths.push(path);
    }
    Ok(paths)
}

/// Evicts a file's clean pages, so the next buffered read goes to the disk.
pub fn drop_cache(f: &File) {
    unsafe { libc::posix_fadvise(f.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED) };
}

/// A heap buffer aligned for O_DIRECT.
pub struct AlignedBuf {
    ptr: *mut u8,
    layout: Layout,
}

impl AlignedBuf {
    pub fn new(len: usize) -> AlignedBuf {
        let layout = Layout::from_size_align(len.max(ALIGN), ALIGN).expect("buffer layout");
        // SAFETY: the layout has a non-zero size.
        let ptr = unsafe { alloc::alloc_zeroed(layout) };
        if ptr.is_null() {
            alloc::handle_alloc_error(layout);
        }
        AlignedBuf { ptr, layout }
    }

    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        // SAFETY: ptr is valid for layout.size() bytes and uniquely owned.
        unsafe { std::slice::from_raw_parts_mut(self.ptr, self.layout.size()) }
    }
}

impl Drop for AlignedBuf {
    fn drop(&mut self) {
        // SAFETY: allocated in `new` with this layout.
        unsafe { alloc::dealloc(self.ptr, self.layout) }
    }
}

/// Opens a data file for reading: O_DIRECT when asked and the filesystem supports it
/// (tmpfs and some overlays do not); `direct` in the result says which.
pub fn open(path: &Path, direct: bool) -> Result<(File, bool)> {
    if direct {
        match OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_DIRECT)
            .open(path)
        {
            Ok(f) => return Ok((f, true)),
            Err(e) if e.raw_os_error() == Some(libc::EINVAL) => {}
            Err(e) => return Err(e).with_context(|| format!("open {}", path.display())),
        }
    }
    let f = File::open(path).with_context(|| format!("open {}", path.display()))?;
    Ok((f, false))
}

/// Reads `buf.len()` bytes at `offset` with pread (short reads retried).
pub fn read_at(f: &File, buf: &mut [u8], offset: u64) -> Result<usize> {
    let mut done = 0;
    while done < buf.len() {
        let n = unsafe {
            libc::pread(
                f.as_raw_fd(),
                buf[done..].as_mut_ptr().cast(),
                buf.len() - done,
                (offset + done as u64) as libc::off_t,
            )
        };
        if n < 0 {
            let e = std::io::Error::last_os_error();
            if e.kind() == std::io::ErrorKind::Interrupted {
                continue;
            }
            return Err(e).context("read a data file");
        }
        if n == 0 {
            break;
        }
        done += n as usize;
    }
    Ok(done)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn writes_and_reads_back() {
        let dir = tempfile::tempdir().unwrap();
        let paths = create(dir.path(), 2, 1 << 20).unwrap();
        assert_eq!(paths.len(), 2);
        let a = std::fs::read(&paths[0]).unwrap();
        let b = std::fs::read(&paths[1]).unwrap();
        assert_eq!(a.len(), 1 << 20);
        assert_ne!(a, b, "shards must differ");
        let (f, _direct) = open(&paths[1], true).unwrap();
        let mut buf = AlignedBuf::new(64 * 1024);
        let n = read_at(&f, buf.as_mut_slice(), 128 * 1024).unwrap();
        assert_eq!(n, 64 * 1024);
        assert_eq!(buf.as_mut_slice(), &b[128 * 1024..192 * 1024]);
    }
}
