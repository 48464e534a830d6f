//! Reading another process's memory without stopping it (`process_vm_readv`). Reads race with
//! the target; callers validate what they read (type pointers, sizes) before trusting it.

use std::io;

pub trait Memory {
    fn read(&self, addr: u64, buf: &mut [u8]) -> io::Result<()>;

    fn u64(&self, addr: u64) -> io::Result<u64> {
        let mut b = [0u8; 8];
        self.read(addr, &mut b)?;
        Ok(u64::from_le_bytes(b))
    }

    fn u32(&self, addr: u64) -> io::Result<u32> {
        let mut b = [0u8; 4];
        self.read(addr, &mut b)?;
        Ok(u32::from_le_bytes(b))
    }

    fn i32(&self, addr: u64) -> io::Result<i32> {
        Ok(self.u32(addr)? as i32)
    }
}

/// A live process.
pub struct ProcessMemory(pub u32);

impl Memory for ProcessMemory {
    fn read(&self, addr: u64, buf: &mut [u8]) -> io::Result<()> {
        let local = libc::iovec {
            iov_base: buf.as_mut_ptr().cast(),
            iov_len: buf.len(),
        };
        let remote = libc::iovec {
            iov_base: addr as *mut libc::c_void,
            iov_len: buf.len(),
        };
        let read = |pid: u32| {
            // SAFETY: `local` covers exactly `buf`, which we own mutably; the remote side is only
            // read.
            unsafe { libc::process_vm_readv(pid as libc::pid_t, &local, 1, &remote, 1, 0) }
        };
        let mut n = read(self.0);
        if n < 0 {
            let err = io::Error::last_os_error();
            // A leader that left while its threads run has no memory of its own.
            if err.raw_os_error() != Some(libc::ESRCH) {
                return Err(err);
            }
            match crate::procfs::mm_pid(self.0) {
                id if id != self.0 => n = read(id),
                _ => return Err(err),
            }
        }
        if n < 0 {
            return Err(io::Error::last_os_error());
        }
        if n as usize != buf.len() {
            return Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                format!("short read at {addr:#x}: {n} of {} bytes", buf.len()),
            ));
        }
        Ok(())
    }
}
