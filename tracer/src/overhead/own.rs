//! What gputrace's own process costs the machine: the CPU its threads take (the event loop,
//! the passes over exited processes, symbolisation, the report) and the memory it holds. Its
//! probes run in the traced threads and are priced apart (the rest of `overhead`); this is the
//! part that competes with the job for CPUs, which the budget does not cap.

use crate::report::model::overhead::OwnCost;

/// What the process had used by an instant: `getrusage(RUSAGE_SELF)`, all of gputrace's
/// threads and none of a command it launched (a child).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Usage {
    pub cpu_ns: u64,
    pub peak_rss_bytes: u64,
}

impl Usage {
    /// Now; zeros when the kernel would not say (then nothing is reported, see [`own_cost`]).
    pub fn now() -> Usage {
        // SAFETY: a plain syscall filling a local struct.
        let ru = unsafe {
            let mut ru: libc::rusage = std::mem::zeroed();
            if libc::getrusage(libc::RUSAGE_SELF, &mut ru) != 0 {
                return Usage::default();
            }
            ru
        };
        let ns = |t: libc::timeval| t.tv_sec as u64 * 1_000_000_000 + t.tv_usec as u64 * 1_000;
        Usage {
            cpu_ns: ns(ru.ru_utime) + ns(ru.ru_stime),
            // Linux gives kilobytes.
            peak_rss_bytes: ru.ru_maxrss.max(0) as u64 * 1024,
        }
    }
}

/// Kernel memory gputrace's BPF maps hold now: what the kernel charges each (`memlock` in the
/// map's fdinfo: all of a preallocated map; of one allocated as it fills, what is in use from
/// Linux 6.4, its whole size before), each map once however many fds it has.
pub fn kernel_maps_bytes() -> u64 {
    let Ok(dir) = std::fs::read_dir("/proc/self/fdinfo") else {
        return 0;
    };
    let mut seen = std::collections::HashSet::new();
    dir.flatten()
        .filter_map(|e| std::fs::read_to_string(e.path()).ok())
        .filter_map(|info| map_memlock(&info))
        .filter(|&(id, _)| seen.insert(id))
        .map(|(_, bytes)| bytes)
        .sum()
}

/// A BPF map's id and `memlock` from its fdinfo text; None for any other fd.
fn map_memlock(info: &str) -> Option<(u64, u64)> {
    let field = |name: &str| {
        info.lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|v| v.trim().parse::<u64>().ok())
    };
    field("map_type:")?;
    Some((field("map_id:")?, field("memlock:")?))
}

/// The cost from three readings: as the window opened (everything before is loading and
/// attaching), as it ended, and once the report was made. None when the readings failed.
pub fn own_cost(
    opened: Usage,
    ended: Usage,
    reported: Usage,
    window_ns: u64,
    cpus: u32,
    (kernel_maps_bytes, maps_as_used): (u64, bool),
) -> Option<OwnCost> {
    if reported.cpu_ns == 0 && reported.peak_rss_bytes == 0 {
        return None;
    }
    let window_cpu_ns = ended.cpu_ns.saturating_sub(opened.cpu_ns);
    Some(OwnCost {
        attach_cpu_ns: opened.cpu_ns,
        window_cpu_ns,
        report_cpu_ns: reported.cpu_ns.saturating_sub(ended.cpu_ns),
        cpu_share: window_cpu_ns as f64 / window_ns.max(1) as f64,
        cpus: cpus.max(1),
        peak_rss_window_bytes: ended.peak_rss_bytes,
        peak_rss_bytes: reported.peak_rss_bytes.max(ended.peak_rss_bytes),
        kernel_maps_bytes,
        maps_as_used,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn usage(cpu_ms: u64, rss_mb: u64) -> Usage {
        Usage {
            cpu_ns: cpu_ms * 1_000_000,
            peak_rss_bytes: rss_mb << 20,
        }
    }

    #[test]
    fn the_window_is_priced_apart_from_the_attach_and_the_report() {
        let c = own_cost(
            usage(300, 60),
            usage(4_300, 164),
            usage(5_100, 280),
            40_000_000_000,
            2,
            (156 << 20, true),
        )
        .unwrap();
        assert_eq!(c.attach_cpu_ns, 300_000_000);
        assert_eq!(c.window_cpu_ns, 4_000_000_000);
        assert_eq!(c.report_cpu_ns, 800_000_000);
        assert!((c.cpu_share - 0.1).abs() < 1e-9, "{}", c.cpu_share);
        assert_eq!(c.cpus, 2);
        assert_eq!(c.peak_rss_window_bytes, 164 << 20);
        assert_eq!(c.peak_rss_bytes, 280 << 20);
        assert_eq!(c.kernel_maps_bytes, 156 << 20);
        assert!(c.maps_as_used);
    }

    #[test]
    fn failed_readings_report_nothing() {
        let z = Usage::default();
        assert_eq!(own_cost(z, z, z, 1_000, 2, (0, false)), None);
    }

    #[test]
    fn a_maps_fdinfo_gives_its_id_and_kernel_memory() {
        let info = "pos:\t0\nflags:\t02000002\nmnt_id:\t16\nino:\t1057\nmap_type:\t1\n\
                    key_size:\t16\nvalue_size:\t312\nmax_entries:\t65536\nmap_flags:\t0x0\n\
                    map_extra:\t0x0\nmemlock:\t25691776\nmap_id:\t4242\nfrozen:\t0\n";
        assert_eq!(map_memlock(info), Some((4242, 25_691_776)));
        // A file's, a program's: not maps.
        assert_eq!(
            map_memlock("pos:\t0\nflags:\t02\nmnt_id:\t21\nino:\t5\n"),
            None
        );
        assert_eq!(
            map_memlock("prog_type:\t5\nprog_jited:\t1\nmemlock:\t4096\nprog_id:\t9\n"),
            None
        );
    }

    #[test]
    fn this_process_reads_its_own_usage() {
        let before = Usage::now();
        // Burn a little CPU so the clock moves past its 1 µs resolution.
        let mut x = 0u64;
        for i in 0..2_000_000u64 {
            x = x.wrapping_mul(31).wrapping_add(std::hint::black_box(i));
        }
        std::hint::black_box(x);
        let after = Usage::now();
        assert!(after.cpu_ns > before.cpu_ns, "{before:?} {after:?}");
        assert!(after.peak_rss_bytes > 1 << 20, "{after:?}");
    }
}
