//! The report file being written, for the signal that aborts the report (a second Ctrl-C):
//! its handler removes it, where the hidden `.NAME.gputrace-PID.tmp` would otherwise stay
//! behind. Kept in atomics, the only state a signal handler may read.

#[cfg(test)]
use std::ffi::CString;
use std::{
    ffi::{c_char, CStr},
    os::fd::RawFd,
    sync::atomic::{AtomicI32, AtomicPtr, Ordering},
};

static DIR_FD: AtomicI32 = AtomicI32::new(-1);
static NAME: AtomicPtr<c_char> = AtomicPtr::new(std::ptr::null_mut());

/// While it lives, `name` in the directory open as `dir_fd` is the file being written.
pub struct Writing(());

/// Marks `name` (in the directory open as `dir_fd`) as being written.
pub fn writing(dir_fd: RawFd, name: &CStr) -> Writing {
    NAME.store(std::ptr::null_mut(), Ordering::SeqCst);
    DIR_FD.store(dir_fd, Ordering::SeqCst);
    // Never freed: a handler on another thread may be reading the last one. A report writes
    // about ten files, each name a few dozen bytes.
    NAME.store(name.to_owned().into_raw(), Ordering::SeqCst);
    Writing(())
}

impl Drop for Writing {
    fn drop(&mut self) {
        NAME.store(std::ptr::null_mut(), Ordering::SeqCst);
    }
}

/// Removes the file being written, if any. Async-signal-safe: atomics and `unlinkat`.
pub fn remove() {
    let name = NAME.load(Ordering::SeqCst);
    let fd = DIR_FD.load(Ordering::SeqCst);
    if !name.is_null() && fd >= 0 {
        // SAFETY: `name` is a C string that is never freed; a stale fd names no file of ours.
        unsafe { libc::unlinkat(fd, name, 0) };
    }
}

/// The name being written, for tests.
#[cfg(test)]
fn current() -> Option<CString> {
    let name = NAME.load(Ordering::SeqCst);
    // SAFETY: as in `remove`.
    (!name.is_null()).then(|| unsafe { CStr::from_ptr(name) }.to_owned())
}

#[cfg(test)]
mod tests {
    use std::os::fd::AsRawFd;

    use super::*;

    #[test]
    fn removes_the_file_being_written_only() {
        let dir = std::env::temp_dir().join(format!("gputrace-partial-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let d = std::fs::File::open(&dir).unwrap();
        std::fs::write(dir.join(".a.tmp"), "half").unwrap();
        std::fs::write(dir.join("b"), "whole").unwrap();
        {
            let _w = writing(d.as_raw_fd(), c".a.tmp");
            assert_eq!(current().as_deref(), Some(c".a.tmp"));
            remove();
        }
        assert!(!dir.join(".a.tmp").exists());
        assert_eq!(current(), None, "written: nothing to remove");
        std::fs::write(dir.join(".a.tmp"), "half").unwrap();
        remove();
        assert!(dir.join(".a.tmp").exists() && dir.join("b").exists());
        let _ = std::fs::remove_dir_all(&dir);
    }
}
