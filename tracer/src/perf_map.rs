//! JIT perf maps (`/tmp/perf-PID.map`): the names a just-in-time compiler gives the code it
//! writes into anonymous memory (CPython 3.12+ under `-X perf`, the JVM with an agent, V8's
//! `--perf-basic-prof`), the interface `perf` reads
//! (tools/perf/Documentation/jit-interface.txt): one `START SIZE name` line per function,
//! START and SIZE in hex. blazesym reads these only for a live process through its own read
//! of /proc/PID/maps (its parser is private), while gputrace symbolises with maps it took
//! earlier, most often after the process exited: the file is read here, through a descriptor
//! opened while the process ran.

use std::{
    ffi::CString,
    fs::File,
    io::{Read, Seek, SeekFrom},
    os::{
        fd::{AsRawFd, FromRawFd, OwnedFd},
        unix::fs::MetadataExt,
    },
    path::Path,
    time::{Duration, SystemTime},
};

/// Bytes of a perf map read at most: a JVM's can reach tens of MB; past this its later
/// functions stay unnamed rather than gputrace's memory growing with it.
pub const MAX_BYTES: u64 = 16 << 20;

/// A process's JIT functions, sorted by start; of two at one start the later line's. `read`:
/// the bytes of the file taken so far (whole lines), so that a JIT still writing is read on
/// from there.
#[derive(Debug, Default, Clone, PartialEq)]
pub struct PerfMap {
    funcs: Vec<(u64, u64, String)>,
    read: u64,
}

/// The functions of whole lines of `text`, in file order; lines that are not
/// `START SIZE name` are skipped.
fn lines(text: &str) -> Vec<(u64, u64, String)> {
    text.lines()
        .filter_map(|l| {
            let mut parts = l.splitn(3, ' ');
            let start = u64::from_str_radix(parts.next()?.trim_start_matches("0x"), 16).ok()?;
            let size = u64::from_str_radix(parts.next()?.trim_start_matches("0x"), 16).ok()?;
            let name = parts.next()?.trim();
            (size > 0 && !name.is_empty()).then(|| (start, size, name.to_string()))
        })
        .collect()
}

impl PerfMap {
    /// The map of a perf map's text.
    pub fn parse(text: &str) -> PerfMap {
        let mut m = PerfMap::default();
        m.add(lines(text));
        m
    }

    /// Adds functions read after those held. Code freed and its memory written again gets a
    /// new line at the same start: the later one is the code now there (perf takes the
    /// latest too).
    fn add(&mut self, mut newer: Vec<(u64, u64, String)>) {
        newer.reverse();
        newer.append(&mut self.funcs);
        // Stable: of one start, the latest line stays first, and is the one kept.
        newer.sort_by_key(|f| f.0);
        newer.dedup_by_key(|f| f.0);
        self.funcs = newer;
    }

    /// Reads what `path` (a held descriptor's /proc/self/fd/N) holds past what was read, up
    /// to its last whole line and [`MAX_BYTES`] in all: a line the JIT is still writing is
    /// read next time. A file that shrank was written anew: read again from its start.
    pub fn update(&mut self, path: &Path) -> std::io::Result<()> {
        let mut f = File::open(path)?;
        let len = f.metadata()?.len();
        if len < self.read {
            *self = PerfMap::default();
        }
        if len == self.read || self.read >= MAX_BYTES {
            return Ok(());
        }
        f.seek(SeekFrom::Start(self.read))?;
        let mut bytes = Vec::new();
        f.take(MAX_BYTES - self.read).read_to_end(&mut bytes)?;
        let Some(end) = bytes.iter().rposition(|&b| b == b'\n') else {
            return Ok(());
        };
        // A name is the JIT's to write: bytes that are not UTF-8 are replaced, not a reason
        // to lose the file's other names.
        self.add(lines(&String::from_utf8_lossy(&bytes[..=end])));
        self.read += end as u64 + 1;
        Ok(())
    }

    /// The function covering `addr`.
    pub fn find(&self, addr: u64) -> Option<&str> {
        let i = self.funcs.partition_point(|f| f.0 <= addr);
        let (start, size, name) = self.funcs.get(i.checked_sub(1)?)?;
        (addr - start < *size).then_some(name.as_str())
    }

    pub fn len(&self) -> usize {
        self.funcs.len()
    }

    pub fn is_empty(&self) -> bool {
        self.funcs.is_empty()
    }
}

/// The innermost pid namespace's id of a process, from its /proc/PID/status text.
pub fn ns_tgid(status: &str) -> Option<u32> {
    let line = status.lines().find(|l| l.starts_with("NStgid:"))?;
    line.split_whitespace().last()?.parse().ok()
}

/// Opens `name` under the directory `dir`, with `flags`, following no symlink of its own.
fn open_at(dir: &OwnedFd, name: &str, flags: i32) -> Option<OwnedFd> {
    let c = CString::new(name).ok()?;
    // SAFETY: a valid C string and an open directory; the fd returned is ours.
    let fd = unsafe { libc::openat(dir.as_raw_fd(), c.as_ptr(), flags | libc::O_CLOEXEC) };
    // SAFETY: a new descriptor nothing else owns.
    (fd >= 0).then(|| unsafe { OwnedFd::from_raw_fd(fd) })
}

fn read_at(dir: &OwnedFd, name: &str) -> Option<String> {
    let mut s = String::new();
    File::from(open_at(dir, name, libc::O_RDONLY)?)
        .read_to_string(&mut s)
        .ok()?;
    Some(s)
}

/// Opens process `pid`'s perf map if it has one that is its own: a regular file with one link
/// (not a symlink, not a FIFO that would block the read, not a hard link to another file),
/// owned by the process's user or root, and made since the process started. /tmp is
/// everyone's: another user could plant a file under a root job's name (`perf` checks the
/// owner too), and a file left by an earlier process under the same pid names other code
/// (CPython appends to one it finds). Looked up in the process's own root (a container's
/// /tmp), its symlinks resolved inside that root, and /proc/PID read through one descriptor,
/// which a later process under the pid cannot take over.
///
/// `ns_tgid`: the pid the process sees itself as, if an earlier look found it (else filled
/// in): then a process with no perf map (most) costs one failed lookup, not eight syscalls.
pub fn open(pid: u32, ns_tgid_seen: &mut Option<u32>) -> Option<File> {
    if let Some(ns) = *ns_tgid_seen {
        // Only a hint (a symlinked /tmp resolves outside the container here): the file is
        // opened below as it should be.
        if std::fs::symlink_metadata(format!("/proc/{pid}/root/tmp/perf-{ns}.map")).is_err() {
            return None;
        }
    }
    let proc_dir = File::open(format!("/proc/{pid}")).ok()?;
    let owner = proc_dir.metadata().ok()?.uid();
    let proc_dir = OwnedFd::from(proc_dir);
    let ns = ns_tgid(&read_at(&proc_dir, "status")?)?;
    // The quick look goes through gputrace's own resolution: not where the process's /tmp
    // is a symlink (a container's), which would resolve outside its root every time.
    let tmp_is_dir = std::fs::symlink_metadata(format!("/proc/{pid}/root/tmp"))
        .is_ok_and(|m| m.file_type().is_dir());
    if tmp_is_dir {
        *ns_tgid_seen = Some(ns);
    }
    let started = start_time(crate::procfs::parse_stat(&read_at(&proc_dir, "stat")?)?.starttime)?;
    let name = format!("tmp/perf-{ns}.map");
    let root = open_at(&proc_dir, "root", libc::O_PATH | libc::O_DIRECTORY)?;
    let f = File::from(open_in_root(&root, &name)?);
    let m = f.metadata().ok()?;
    let made = m.created().or_else(|_| m.modified()).ok()?;
    let ok = m.is_file()
        && m.nlink() == 1
        && (m.uid() == owner || m.uid() == 0)
        && made_since(made, m.created().is_ok(), started);
    ok.then_some(f)
}

/// Opens `name` inside the root directory `root` (openat2's `RESOLVE_IN_ROOT`: an absolute
/// symlink in a container's tree resolves in that tree, never gputrace's), read-only,
/// non-blocking, never through a symlink of its own or a magic link.
fn open_in_root(root: &OwnedFd, name: &str) -> Option<OwnedFd> {
    open_within(
        root,
        name,
        libc::O_RDONLY | libc::O_NOFOLLOW | libc::O_NONBLOCK,
    )
}

/// Opens `name` (relative, or absolute: from `root` all the same) inside directory `root`
/// with open flags `flags` (and `O_CLOEXEC`), by openat2's `RESOLVE_IN_ROOT`: `..` and the
/// symlinks on the way, an absolute one too, resolve as if `root` were `/`, never to a file
/// outside it, nor through a magic link (/proc's).
pub fn open_within(root: &OwnedFd, name: &str, flags: i32) -> Option<OwnedFd> {
    let c = CString::new(name).ok()?;
    // SAFETY: an all-zero open_how is valid; the fields are set below.
    let mut how: libc::open_how = unsafe { std::mem::zeroed() };
    how.flags = (flags | libc::O_CLOEXEC) as u64;
    how.resolve = libc::RESOLVE_IN_ROOT | libc::RESOLVE_NO_MAGICLINKS;
    // SAFETY: valid pointers to a C string and an open_how of the size given.
    let fd = unsafe {
        libc::syscall(
            libc::SYS_openat2,
            root.as_raw_fd(),
            c.as_ptr(),
            &how as *const libc::open_how,
            std::mem::size_of::<libc::open_how>(),
        )
    };
    // SAFETY: a new descriptor nothing else owns.
    (fd >= 0).then(|| unsafe { OwnedFd::from_raw_fd(fd as i32) })
}

/// When a process whose `starttime` (clock ticks since boot) is this started, on the wall
/// clock (`procfs::start_floor_ktime`, moved from the monotonic clock).
fn start_time(starttime: u64) -> Option<SystemTime> {
    let ago =
        crate::probes::ktime_now().saturating_sub(crate::procfs::start_floor_ktime(starttime)?);
    SystemTime::now().checked_sub(Duration::from_nanos(ago))
}

/// Whether a file made at `made` (its birth time where `born`, else its last write) was made
/// by a process that started at `started`: the start is rounded down to a clock tick (10 ms)
/// and read off two clocks; a last write is in whole seconds on some filesystems.
fn made_since(made: SystemTime, born: bool, started: SystemTime) -> bool {
    let slack = if born {
        Duration::from_millis(20)
    } else {
        Duration::from_secs(1)
    };
    made + slack >= started
}

#[cfg(test)]
mod tests {
    use std::io::Write;

    use super::*;

    #[test]
    fn parses_and_finds() {
        let m = PerfMap::parse(
            "7f0000001000 40 py::step:/job/train.py\n\
             7f0000001040 20 [jit] a b c\n\
             garbage line\n\
             7f0000002000 0 empty\n\
             7f00000030",
        );
        assert_eq!(m.len(), 2);
        assert_eq!(m.find(0x7f00_0000_1000), Some("py::step:/job/train.py"));
        assert_eq!(m.find(0x7f00_0000_103f), Some("py::step:/job/train.py"));
        // Names may hold spaces: the rest of the line.
        assert_eq!(m.find(0x7f00_0000_1050), Some("[jit] a b c"));
        assert_eq!(
            m.find(0x7f00_0000_1060),
            None,
            "past the last function's end"
        );
        assert_eq!(m.find(0x7f00_0000_0fff), None, "before the first");
        assert!(PerfMap::parse("").is_empty());
    }

    #[test]
    fn the_latest_line_at_a_start_wins() {
        let m = PerfMap::parse("1000 10 old\n2000 10 other\n1000 20 new\n");
        assert_eq!(m.find(0x1018), Some("new"));
        assert_eq!(m.find(0x2000), Some("other"));
    }

    #[test]
    fn ns_tgid_is_the_innermost() {
        assert_eq!(ns_tgid("Name:\tx\nNStgid:\t4242\t7\n"), Some(7));
        assert_eq!(ns_tgid("Name:\tx\nNStgid:\t4242\n"), Some(4242));
        assert_eq!(ns_tgid("Name:\tx\n"), None);
    }

    fn scratch(name: &str) -> std::path::PathBuf {
        let dir = std::env::temp_dir().join(format!("gputrace-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        dir
    }

    /// A JIT that writes on: read from where the last read ended, a partial line left for the
    /// next read, bytes that are not UTF-8 kept as what they are; a file written anew read
    /// from its start.
    #[test]
    fn reads_on_as_the_jit_writes() {
        let dir = scratch("perfmap-update");
        let path = dir.join("perf-1.map");
        let mut f = std::fs::File::create(&path).unwrap();
        f.write_all(b"1000 10 first\n2000 10 sec").unwrap();
        let mut m = PerfMap::default();
        m.update(&path).unwrap();
        assert_eq!((m.len(), m.find(0x2000)), (1, None), "a partial line waits");
        f.write_all(b"ond\n3000 10 caf\xe9\n1000 10 again\n")
            .unwrap();
        m.update(&path).unwrap();
        assert_eq!(m.find(0x2000), Some("second"));
        assert_eq!(m.find(0x3000), Some("caf\u{fffd}"));
        assert_eq!(m.find(0x1000), Some("again"), "the later line at a start");
        m.update(&path).unwrap();
        assert_eq!(m.len(), 3, "nothing new: nothing read twice");
        std::fs::write(&path, "4000 10 anew\n").unwrap();
        m.update(&path).unwrap();
        assert_eq!(
            (m.len(), m.find(0x4000), m.find(0x2000)),
            (1, Some("anew"), None)
        );
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn opens_only_a_plain_file_made_since_the_start() {
        let dir = scratch("perfmap-open");
        let root = OwnedFd::from(File::open(&dir).unwrap());
        std::fs::write(dir.join("perf-1.map"), "1000 10 f\n").unwrap();
        assert!(open_in_root(&root, "perf-1.map").is_some());
        std::os::unix::fs::symlink(dir.join("perf-1.map"), dir.join("perf-2.map")).unwrap();
        assert!(
            open_in_root(&root, "perf-2.map").is_none(),
            "a link is not followed"
        );
        std::fs::hard_link(dir.join("perf-1.map"), dir.join("perf-3.map")).unwrap();
        let f = File::from(open_in_root(&root, "perf-3.map").unwrap());
        assert_eq!(
            f.metadata().unwrap().nlink(),
            2,
            "open() refuses it by its links"
        );
        // An absolute link stays inside the root it is resolved in.
        std::fs::create_dir_all(dir.join("tmp")).unwrap();
        std::os::unix::fs::symlink("/perf-1.map", dir.join("tmp/perf-4.map")).unwrap();
        assert!(
            open_in_root(&root, "tmp/perf-4.map").is_none(),
            "O_NOFOLLOW"
        );
        std::fs::remove_dir_all(dir.join("tmp")).unwrap();
        std::os::unix::fs::symlink("/", dir.join("tmp")).unwrap();
        assert!(
            open_in_root(&root, "tmp/perf-1.map").is_some(),
            "a symlinked /tmp resolves inside the root"
        );

        let own = start_time(crate::procfs::stat(std::process::id()).unwrap().starttime)
            .expect("own start");
        let now = SystemTime::now();
        assert!(own <= now);
        assert!(made_since(now, true, own));
        assert!(!made_since(own - Duration::from_millis(100), true, own));
        assert!(made_since(own - Duration::from_millis(100), false, own));
        assert!(!made_since(own - Duration::from_secs(5), false, own));
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn opens_none_where_there_is_none() {
        let mut ns = None;
        assert!(open(u32::MAX, &mut ns).is_none(), "no such process");
        assert_eq!(ns, None);
        // gputrace's tests write no perf map of their own: the first look learns the pid it
        // sees itself as (its own here), the next only looks for the file.
        let me = std::process::id();
        assert!(open(me, &mut ns).is_none());
        assert_eq!(ns, Some(me));
        assert!(open(me, &mut ns).is_none());
    }
}
