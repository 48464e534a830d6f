//! Launching `-- CMD` paused, so that it is traced from its first instruction.
//!
//! The child is forked by hand and waits on a pipe before it calls exec; the parent releases it
//! once the probes are attached and its pid is in the traced set. A second, close-on-exec pipe
//! carries exec's errno back, so "command not found" is an error of gputrace, not a silent exit.

use std::{
    ffi::CString,
    os::{
        fd::{AsRawFd, FromRawFd, OwnedFd},
        unix::ffi::OsStrExt,
    },
    path::{Path, PathBuf},
};

use anyhow::{Context, Result};

use crate::error::TraceError;

pub struct Launched {
    pub pid: u32,
    go: OwnedFd,
    exec_err: OwnedFd,
}

/// Finds the program like execvp would, so that a missing one fails before anything is loaded.
pub fn resolve_program(program: &str) -> Result<PathBuf, TraceError> {
    let err = |reason: &str| TraceError::Exec {
        program: program.to_string(),
        reason: reason.to_string(),
    };
    let check = |p: &Path| -> Result<PathBuf, TraceError> {
        let meta = std::fs::metadata(p).map_err(|e| err(&e.to_string()))?;
        if meta.is_dir() {
            return Err(err("is a directory"));
        }
        let c = CString::new(p.as_os_str().as_bytes()).map_err(|_| err("bad path"))?;
        if unsafe { libc::access(c.as_ptr(), libc::X_OK) } != 0 {
            return Err(err("permission denied (not executable)"));
        }
        Ok(p.to_path_buf())
    };
    if program.contains('/') {
        return check(Path::new(program));
    }
    let path = std::env::var_os("PATH").unwrap_or_else(|| "/usr/bin:/bin".into());
    for dir in std::env::split_paths(&path) {
        let cand = dir.join(program);
        if cand.is_file() {
            return check(&cand);
        }
    }
    Err(err("command not found in PATH"))
}

fn pipe_cloexec() -> Result<(OwnedFd, OwnedFd)> {
    let mut fds = [0i32; 2];
    if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
        return Err(std::io::Error::last_os_error()).context("pipe2");
    }
    Ok(unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) })
}

/// Forks a child that waits for [`Launched::release`] before it execs `argv`.
pub fn spawn_paused(argv: &[String]) -> Result<Launched> {
    let program = resolve_program(&argv[0])?;
    let prog_c = CString::new(program.as_os_str().as_bytes()).context("program path")?;
    let args_c: Vec<CString> = argv
        .iter()
        .map(|a| CString::new(a.as_bytes()))
        .collect::<Result<_, _>>()
        .context("an argument contains a NUL byte")?;
    let mut argv_p: Vec<*const libc::c_char> = args_c.iter().map(|a| a.as_ptr()).collect();
    argv_p.push(std::ptr::null());

    let (go_r, go_w) = pipe_cloexec()?;
    let (err_r, err_w) = pipe_cloexec()?;

    // SAFETY: the child only calls async-signal-safe functions (read, signal, execv, write,
    // _exit) on memory prepared before the fork.
    let pid = unsafe { libc::fork() };
    if pid < 0 {
        return Err(std::io::Error::last_os_error()).context("fork");
    }
    if pid == 0 {
        unsafe {
            // Only gputrace may hold the write end: if it dies before the release (even by
            // SIGKILL), the read below sees EOF and the command is never run untraced.
            libc::close(go_w.as_raw_fd());
            libc::close(err_r.as_raw_fd());
            let mut b = 0u8;
            loop {
                let n = libc::read(go_r.as_raw_fd(), (&mut b as *mut u8).cast(), 1);
                if n == 1 {
                    break;
                }
                if n == 0 || *libc::__errno_location() != libc::EINTR {
                    libc::_exit(127);
                }
            }
            // Rust ignores SIGPIPE; the command must get the default back, as with a shell.
            libc::signal(libc::SIGPIPE, libc::SIG_DFL);
            libc::execv(prog_c.as_ptr(), argv_p.as_ptr());
            let errno: i32 = *libc::__errno_location();
            libc::write(err_w.as_raw_fd(), (&errno as *const i32).cast(), 4);
            libc::_exit(127);
        }
    }
    drop(go_r);
    drop(err_w);
    Ok(Launched {
        pid: pid as u32,
        go: go_w,
        exec_err: err_r,
    })
}

impl Launched {
    /// Lets the child exec; returns once exec succeeded (or with its error).
    pub fn release(self, program: &str) -> Result<()> {
        let b = 1u8;
        let n = unsafe { libc::write(self.go.as_raw_fd(), (&b as *const u8).cast(), 1) };
        if n != 1 {
            return Err(std::io::Error::last_os_error()).context("release the launched command");
        }
        drop(self.go);
        let mut errno = 0i32;
        let n = loop {
            let n = unsafe {
                libc::read(
                    self.exec_err.as_raw_fd(),
                    (&mut errno as *mut i32).cast(),
                    4,
                )
            };
            if n < 0 && std::io::Error::last_os_error().kind() == std::io::ErrorKind::Interrupted {
                continue;
            }
            break n;
        };
        if n == 4 {
            let mut status = 0;
            unsafe { libc::waitpid(self.pid as i32, &mut status, 0) };
            return Err(TraceError::Exec {
                program: program.to_string(),
                reason: std::io::Error::from_raw_os_error(errno).to_string(),
            }
            .into());
        }
        Ok(())
    }
}

/// Reaps a child without blocking; `Some(code)` once it has exited (128+signal when killed).
pub fn try_reap(pid: u32) -> Option<i32> {
    let mut status = 0;
    let r = unsafe { libc::waitpid(pid as i32, &mut status, libc::WNOHANG) };
    if r == pid as i32 {
        if libc::WIFEXITED(status) {
            Some(libc::WEXITSTATUS(status))
        } else if libc::WIFSIGNALED(status) {
            Some(128 + libc::WTERMSIG(status))
        } else {
            None
        }
    } else {
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn resolves_programs() {
        assert!(resolve_program("sh").is_ok());
        assert!(matches!(
            resolve_program("definitely-not-a-command-xyz"),
            Err(TraceError::Exec { .. })
        ));
        let dir = tempfile::tempdir().unwrap();
        let plain = dir.path().join("not-executable");
        std::fs::write(&plain, "x").unwrap();
        assert!(matches!(
            resolve_program(plain.to_str().unwrap()),
            Err(TraceError::Exec { .. })
        ));
        assert!(matches!(
            resolve_program("/tmp"),
            Err(TraceError::Exec { .. })
        ));
    }
}
