//! The output directory: opened once, before the trace, and written through that handle after
//! it, so nothing another user does to the path in between (a directory renamed and a
//! symlink put in its place, a planted link on a file's name) moves where the reports go.
//!
//! The path is walked a component at a time from `/` (or the working directory), each opened
//! with `O_NOFOLLOW`. A symbolic link is followed only where nobody else could have put it
//! there or swapped it since: owned by root or the invoking user, in a directory owned by one
//! of them that others cannot write (or that is sticky, as `/tmp`, where only a link's owner
//! may replace it). `/var/run -> /run` is followed; a link another user planted in `/tmp`,
//! or in a directory they own, is refused. The output directory itself is never a link, with
//! or without a trailing slash.

use std::{
    ffi::{CStr, CString, OsStr},
    io,
    os::{
        fd::{AsRawFd, FromRawFd, OwnedFd},
        unix::ffi::OsStrExt,
    },
    path::{Component, Path, PathBuf},
};

/// An open output directory and the path it was opened at (for messages).
#[derive(Debug)]
pub struct OutputDir {
    fd: OwnedFd,
    path: PathBuf,
}

/// How many times a component that vanished or appeared under us is looked at again before
/// giving up (another process racing the walk).
const RETRIES: usize = 4;

fn cstr(name: &OsStr) -> io::Result<CString> {
    CString::new(name.as_bytes())
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "path contains a NUL byte"))
}

fn open_at(dir: Option<&OwnedFd>, name: &CStr, flags: libc::c_int) -> io::Result<OwnedFd> {
    let at = dir.map_or(libc::AT_FDCWD, |d| d.as_raw_fd());
    // SAFETY: a valid C string; the fd returned is ours alone.
    let fd = unsafe { libc::openat(at, name.as_ptr(), flags | libc::O_CLOEXEC, 0o644) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: just opened, owned by nothing else.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

fn stat_fd(fd: &OwnedFd) -> io::Result<libc::stat> {
    // SAFETY: an all-zero stat is valid; fstat fills it.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    if unsafe { libc::fstat(fd.as_raw_fd(), &mut st) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(st)
}

fn stat_at(dir: &OwnedFd, name: &CStr) -> io::Result<libc::stat> {
    // SAFETY: as in `stat_fd`; AT_SYMLINK_NOFOLLOW stats a link itself.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    let r = unsafe {
        libc::fstatat(
            dir.as_raw_fd(),
            name.as_ptr(),
            &mut st,
            libc::AT_SYMLINK_NOFOLLOW,
        )
    };
    if r != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(st)
}

fn is_link(st: &libc::stat) -> bool {
    st.st_mode & libc::S_IFMT == libc::S_IFLNK
}

/// Whether a link `link` in the directory `dir` (both stat'ed) can only have been put there
/// by root or `user`, and only replaced by them.
pub fn link_trusted(dir: &libc::stat, link: &libc::stat, user: u32) -> bool {
    let ours = |uid: u32| uid == 0 || uid == user;
    let closed = dir.st_mode & 0o022 == 0 || dir.st_mode & libc::S_ISVTX != 0;
    ours(link.st_uid) && ours(dir.st_uid) && closed
}

/// The user whose links are trusted and who owns what is created: the one who ran sudo, else
/// the one running.
fn invoking_uid(owner: Option<(u32, u32)>) -> u32 {
    // SAFETY: getuid has no preconditions.
    owner.map_or_else(|| unsafe { libc::getuid() }, |(uid, _)| uid)
}

impl OutputDir {
    /// Opens `path`, creating what is missing (owned by `owner`, mode 0755 less the umask),
    /// as the module's docs say. Errors are one line, for the user.
    pub fn open(path: &Path, owner: Option<(u32, u32)>) -> Result<OutputDir, String> {
        let mut w = Walk {
            owner,
            user: invoking_uid(owner),
            links: 0,
        };
        let fd = w.walk(None, path, true)?;
        Ok(OutputDir {
            fd,
            path: path.to_path_buf(),
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The directory's descriptor, for `partial`'s signal handler.
    pub fn raw_fd(&self) -> std::os::fd::RawFd {
        self.fd.as_raw_fd()
    }

    /// Creates `name` in the directory, exclusively and never through a link, mode 0644 (less
    /// the umask).
    pub fn create(&self, name: &CStr) -> io::Result<std::fs::File> {
        let flags = libc::O_WRONLY | libc::O_CREAT | libc::O_EXCL | libc::O_NOFOLLOW;
        open_at(Some(&self.fd), name, flags).map(std::fs::File::from)
    }

    /// Removes the file `name` from the directory; whether there was one.
    pub fn unlink(&self, name: &CStr) -> bool {
        // SAFETY: a valid C string and an open directory.
        unsafe { libc::unlinkat(self.fd.as_raw_fd(), name.as_ptr(), 0) == 0 }
    }

    /// Renames `from` over `to`, both in the directory.
    pub fn rename(&self, from: &CStr, to: &CStr) -> io::Result<()> {
        let at = self.fd.as_raw_fd();
        // SAFETY: valid C strings, both in the open directory.
        if unsafe { libc::renameat(at, from.as_ptr(), at, to.as_ptr()) } != 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(())
    }
}

/// The links a walk follows at most, as the kernel's own limit (`ELOOP` past 40).
const MAX_LINKS: u32 = 40;

struct Walk {
    owner: Option<(u32, u32)>,
    user: u32,
    links: u32,
}

impl Walk {
    /// Walks `path` from `from` (None: the working directory, or `/` for an absolute path).
    /// `output`: its last component is the output directory itself, which is never a link.
    fn walk(
        &mut self,
        from: Option<OwnedFd>,
        path: &Path,
        output: bool,
    ) -> Result<OwnedFd, String> {
        let parts: Vec<Component> = path.components().collect();
        if parts.is_empty() {
            return Err("an empty path".into());
        }
        let dir_flags = libc::O_RDONLY | libc::O_DIRECTORY;
        let mut fd = from;
        for (i, part) in parts.iter().enumerate() {
            let last = output && i + 1 == parts.len();
            let name: &OsStr = match part {
                Component::RootDir => {
                    fd = Some(open_at(None, c"/", dir_flags).map_err(|e| e.to_string())?);
                    continue;
                }
                Component::CurDir => OsStr::new("."),
                Component::ParentDir => OsStr::new(".."),
                Component::Normal(n) => n,
                Component::Prefix(_) => return Err("not a Unix path".into()),
            };
            let parent = match fd.take() {
                Some(p) => p,
                None => open_at(None, c".", dir_flags).map_err(|e| e.to_string())?,
            };
            let c = cstr(name).map_err(|e| e.to_string())?;
            fd = Some(self.step(&parent, name, &c, last)?);
        }
        // Every component (there is one at least) left a directory open.
        fd.ok_or_else(|| "an empty path".into())
    }

    /// One component of the walk: `name` in `parent`, created if missing, a link followed
    /// only when trusted (and never as the output directory, `last`), its target walked by
    /// the same rules: a link the user made may point into a directory others control.
    fn step(
        &mut self,
        parent: &OwnedFd,
        name: &OsStr,
        c: &CStr,
        last: bool,
    ) -> Result<OwnedFd, String> {
        let (owner, user) = (self.owner, self.user);
        let shown = name.to_string_lossy();
        let flags = libc::O_RDONLY | libc::O_DIRECTORY | libc::O_NOFOLLOW;
        for _ in 0..RETRIES {
            match open_at(Some(parent), c, flags) {
                Ok(fd) => return Ok(fd),
                Err(e) if e.raw_os_error() == Some(libc::ENOENT) => {
                    // SAFETY: a valid C string.
                    if unsafe { libc::mkdirat(parent.as_raw_fd(), c.as_ptr(), 0o755) } != 0 {
                        let e = io::Error::last_os_error();
                        if e.raw_os_error() == Some(libc::EEXIST) {
                            continue;
                        }
                        return Err(format!("create {shown}: {e}"));
                    }
                    let fd = match open_at(Some(parent), c, flags) {
                        Ok(fd) => fd,
                        // Replaced between the two calls: looked at again.
                        Err(_) => continue,
                    };
                    if let Some((uid, gid)) = owner {
                        // SAFETY: an fd we own.
                        if unsafe { libc::fchown(fd.as_raw_fd(), uid, gid) } != 0 {
                            let e = io::Error::last_os_error();
                            return Err(format!("chown {shown} to the sudo user: {e}"));
                        }
                    }
                    return Ok(fd);
                }
                // O_NOFOLLOW on a link fails with ELOOP; O_DIRECTORY on anything else with ENOTDIR.
                Err(e)
                    if e.raw_os_error() == Some(libc::ELOOP)
                        || e.raw_os_error() == Some(libc::ENOTDIR) =>
                {
                    let st = match stat_at(parent, c) {
                        Ok(st) => st,
                        Err(_) => continue,
                    };
                    if !is_link(&st) {
                        return Err(if last {
                            "exists and is not a directory".into()
                        } else {
                            format!("{shown} is not a directory")
                        });
                    }
                    if last {
                        return Err(
                            "is a symbolic link (refused: give the directory it points to)".into(),
                        );
                    }
                    let dir = stat_fd(parent).map_err(|e| e.to_string())?;
                    if !link_trusted(&dir, &st, user) {
                        return Err(format!(
                        "{shown} is a symbolic link another user could have planted (its owner \
                         uid {}, its directory's {}, mode {:o}): refused",
                        st.st_uid,
                        dir.st_uid,
                        dir.st_mode & 0o7777
                    ));
                    }
                    self.links += 1;
                    if self.links > MAX_LINKS {
                        return Err(format!("{shown}: too many levels of symbolic links"));
                    }
                    let target = read_link_at(parent, c).map_err(|e| format!("{shown}: {e}"))?;
                    let from = if target.is_absolute() {
                        None
                    } else {
                        Some(
                            open_at(Some(parent), c".", libc::O_RDONLY | libc::O_DIRECTORY)
                                .map_err(|e| format!("{shown}: {e}"))?,
                        )
                    };
                    return self.walk(from, &target, false);
                }
                Err(e) => return Err(format!("{shown}: {e}")),
            }
        }
        Err(format!("{shown} kept changing while it was opened"))
    }
}

/// The target of the link `name` in `dir`.
fn read_link_at(dir: &OwnedFd, name: &CStr) -> io::Result<PathBuf> {
    let mut buf = vec![0u8; libc::PATH_MAX as usize];
    // SAFETY: `buf` is writable for its length; readlinkat writes at most that many bytes.
    let n = unsafe {
        libc::readlinkat(
            dir.as_raw_fd(),
            name.as_ptr(),
            buf.as_mut_ptr().cast(),
            buf.len(),
        )
    };
    if n < 0 {
        return Err(io::Error::last_os_error());
    }
    buf.truncate(n as usize);
    Ok(PathBuf::from(OsStr::from_bytes(&buf)))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn st(uid: u32, mode: u32) -> libc::stat {
        let mut s: libc::stat = unsafe { std::mem::zeroed() };
        s.st_uid = uid;
        s.st_mode = mode;
        s
    }

    #[test]
    fn links_only_root_or_the_user_could_have_put_there_are_followed() {
        let link = |uid| st(uid, libc::S_IFLNK | 0o777);
        let dir = |uid, mode| st(uid, libc::S_IFDIR | mode);
        // /var/run -> /run.
        assert!(link_trusted(&dir(0, 0o755), &link(0), 1000));
        // The user's own link in their home, and in /tmp (sticky: only its owner replaces it).
        assert!(link_trusted(&dir(1000, 0o755), &link(1000), 1000));
        assert!(link_trusted(&dir(0, 0o1777), &link(1000), 1000));
        // Another user's link in /tmp, or any link in a directory another user owns or may
        // write without the sticky bit.
        assert!(!link_trusted(&dir(0, 0o1777), &link(65534), 1000));
        assert!(!link_trusted(&dir(65534, 0o755), &link(0), 1000));
        assert!(!link_trusted(&dir(0, 0o777), &link(0), 1000));
        assert!(!link_trusted(&dir(0, 0o775), &link(1000), 1000));
    }
}
