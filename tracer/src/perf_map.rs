//! JIT perf maps (`/tmp/perf-PID.map`): the names a just-in-time compiler gives the code it
//! writes into anonymous memory (CPython 3.12+ under `-X perf`, the JVM with an agent, V8's
//! `--perf-basic-prof`), the interface `perf` reads
//! (tools/perf/Documentation/jit-interface.txt): one `START SIZE name` line per function,
//! START and SIZE in hex. blazesym reads these only for a live process through its own read
//! of /proc/PID/maps (its parser is private), while gputrace symbolises with maps it took
//! earlier, most often after the process exited: the file is read here, through a descriptor
//! opened while the process ran.

use std::{
    fs::File,
    io::Read,
    os::unix::fs::{MetadataExt, OpenOptionsExt},
    path::{Path, PathBuf},
};

/// Bytes of a perf map read at most: a JVM's can reach tens of MB; past this its later
/// functions stay unnamed rather than gputrace's memory growing with it.
pub const MAX_BYTES: u64 = 64 << 20;

/// A process's JIT functions, sorted by start; of two at one start the later line's.
#[derive(Debug, Default, Clone, PartialEq)]
pub struct PerfMap {
    funcs: Vec<(u64, u64, String)>,
}

impl PerfMap {
    /// Parses a perf map's text; lines that are not `START SIZE name` are skipped (a JIT
    /// writing while it is read leaves a partial last line).
    pub fn parse(text: &str) -> PerfMap {
        let mut funcs: Vec<(u64, u64, String)> = text
            .lines()
            .filter_map(|l| {
                let mut parts = l.splitn(3, ' ');
                let start = u64::from_str_radix(parts.next()?.trim_start_matches("0x"), 16).ok()?;
                let size = u64::from_str_radix(parts.next()?.trim_start_matches("0x"), 16).ok()?;
                let name = parts.next()?.trim();
                (size > 0 && !name.is_empty()).then(|| (start, size, name.to_string()))
            })
            .collect();
        // Code freed and its memory written again gets a new line at the same start: the
        // later one is the code now there (perf takes the latest too).
        funcs.reverse();
        funcs.sort_by_key(|f| f.0);
        funcs.dedup_by_key(|f| f.0);
        PerfMap { funcs }
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

/// Where process `pid` writes its perf map: in its own /tmp, named by the pid it sees itself
/// as (`ns_tgid`, from /proc/PID/status: another in a container).
pub fn path(pid: u32, ns_tgid: u32) -> PathBuf {
    PathBuf::from(format!("/proc/{pid}/root/tmp/perf-{ns_tgid}.map"))
}

/// The innermost pid namespace's id of a process, from its /proc/PID/status text.
pub fn ns_tgid(status: &str) -> Option<u32> {
    let line = status.lines().find(|l| l.starts_with("NStgid:"))?;
    line.split_whitespace().last()?.parse().ok()
}

/// Opens process `pid`'s perf map if it has one that is its own: a regular file (not a link,
/// not a FIFO that would block the read) owned by the process's user or root, and written
/// since the process started. /tmp is everyone's: another user could plant a file under a
/// root job's name (`perf` checks the owner too), and a file left by an earlier process
/// under the same pid names other code.
pub fn open(pid: u32) -> Option<File> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let owner = std::fs::metadata(format!("/proc/{pid}")).ok()?.uid();
    let started = start_realtime_s(crate::procfs::stat(pid)?.starttime)?;
    open_owned(&path(pid, ns_tgid(&status)?), owner, started)
}

/// The wall-clock second a process whose `starttime` (clock ticks since boot) is this
/// started in.
fn start_realtime_s(starttime: u64) -> Option<i64> {
    // SAFETY: sysconf has no preconditions.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    if hz <= 0 {
        return None;
    }
    let start_boot = starttime.checked_mul(1_000_000_000 / hz as u64)?;
    let now_boot = crate::probes::clock_ns(libc::CLOCK_BOOTTIME);
    let now_real = crate::probes::clock_ns(libc::CLOCK_REALTIME);
    let start_real = now_real.checked_sub(now_boot.saturating_sub(start_boot))?;
    Some((start_real / 1_000_000_000) as i64)
}

fn open_owned(path: &Path, owner: u32, started_s: i64) -> Option<File> {
    let f = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK | libc::O_CLOEXEC)
        .open(path)
        .ok()?;
    let m = f.metadata().ok()?;
    // A second of slack: the start is rounded to a clock tick and read off two clocks.
    let fresh = m.mtime() + 1 >= started_s;
    (m.is_file() && (m.uid() == owner || m.uid() == 0) && fresh).then_some(f)
}

/// Reads a perf map through `path` (a held descriptor's /proc/self/fd/N), at most
/// [`MAX_BYTES`] of it.
pub fn read(path: &Path) -> Option<PerfMap> {
    let mut text = String::new();
    File::open(path)
        .ok()?
        .take(MAX_BYTES)
        .read_to_string(&mut text)
        .ok()?;
    Some(PerfMap::parse(&text))
}

#[cfg(test)]
mod tests {
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
        assert_eq!(
            path(4242, 7),
            PathBuf::from("/proc/4242/root/tmp/perf-7.map")
        );
    }

    #[test]
    fn opens_only_a_regular_file_of_the_owner_or_root() {
        let dir = std::env::temp_dir().join(format!("gputrace-perfmap-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join("perf-1.map");
        std::fs::write(&file, "1000 10 f\n").unwrap();
        let me = std::fs::metadata(&file).unwrap().uid();
        let started = start_realtime_s(crate::procfs::stat(std::process::id()).unwrap().starttime)
            .expect("own start");
        let now = std::fs::metadata(&file).unwrap().mtime();
        assert!(started <= now + 1, "started {started}, file written {now}");
        assert!(open_owned(&file, me, started).is_some());
        assert!(
            open_owned(&file, me, now + 60).is_none(),
            "written before the process started"
        );
        if me != 0 {
            assert!(
                open_owned(&file, me + 1, started).is_none(),
                "another user's file"
            );
        } else {
            // Root's files are trusted whoever runs the process.
            assert!(open_owned(&file, 12345, started).is_some());
        }
        let link = dir.join("perf-2.map");
        std::os::unix::fs::symlink(&file, &link).unwrap();
        assert!(
            open_owned(&link, me, started).is_none(),
            "a link is not followed"
        );
        assert!(
            open_owned(&dir, me, started).is_none(),
            "a directory is no map"
        );
        let held = open_owned(&file, me, started).unwrap();
        use std::os::fd::AsRawFd;
        let through = PathBuf::from(format!("/proc/self/fd/{}", held.as_raw_fd()));
        std::fs::write(&file, "1000 10 f\n2000 10 g\n").unwrap();
        assert_eq!(read(&through).unwrap().len(), 2, "read as it is now");
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn opens_none_where_there_is_none() {
        assert!(open(u32::MAX).is_none(), "no such process");
    }
}
