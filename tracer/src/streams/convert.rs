//! Raw timeline records (`tracer_common::timeline::TlEvent`) to the events of `trace.json`:
//! names, reasons and arguments, times relative to the window start. Pure.

use tracer_common::{
    cuda::{Cookie, Shape},
    time::{Category, NO_OVERRIDE},
    timeline::{TlEvent, TL_BLOCK, TL_CUDA, TL_OFFCPU, TL_SYSCALL},
    wall::{ThreadState, NO_SYSCALL, PHASE_ONCPU, PHASE_RUNNABLE},
};

use crate::{
    accounting::{classify, syscall_names},
    cuda::{aggregate::direction_name, errors, table},
    report::timeline::{EventKind, TimelineEvent},
};

/// The event for one record, or None for a record of an unknown kind. Intervals that started
/// before the window are cut at its start. `kernel_frames` are the names of the off-CPU
/// record's kernel stack (innermost first), empty when none was captured.
pub fn convert(
    ev: &TlEvent,
    window_start_ktime: u64,
    kernel_frames: &[&str],
) -> Option<TimelineEvent> {
    let end = ev.start_ns.saturating_add(ev.dur_ns);
    let start = ev.start_ns.max(window_start_ktime);
    let mut out = TimelineEvent {
        ts_ns: start - window_start_ktime,
        dur_ns: end.saturating_sub(start),
        pid: ev.tgid,
        tid: ev.tid,
        kind: EventKind::Instant,
        name: String::new(),
        args: Vec::new(),
    };
    match ev.kind {
        TL_OFFCPU => offcpu(ev, kernel_frames, &mut out),
        TL_SYSCALL => syscall(ev, &mut out),
        TL_CUDA => cuda(ev, &mut out),
        TL_BLOCK => block(ev, &mut out),
        _ => return None,
    }
    Some(out)
}

fn arg(out: &mut TimelineEvent, k: &str, v: impl ToString) {
    out.args.push((k.to_string(), v.to_string()));
}

/// The off-CPU record the switch-in of a thread still off CPU as the window ended (state
/// `st`, at `end`) would have sent, when it is at least `min_ns` long: a job hung in a
/// read, stopped, or blocked in a CUDA sync for the whole trace is the one being looked at,
/// and its track must not be empty. A wait seeded at the attach (`off_ns` 0) began, for the
/// window, where its state did.
pub fn open_wait(tid: u32, st: &ThreadState, end: u64, min_ns: u64) -> Option<TlEvent> {
    if st.phase == PHASE_ONCPU {
        return None;
    }
    let began = if st.off_ns != 0 {
        st.off_ns
    } else {
        st.start_ns
    };
    let dur = end.checked_sub(began)?;
    if began == 0 || dur < min_ns.max(1) {
        return None;
    }
    let woke = if st.phase == PHASE_RUNNABLE && st.off_state & 0xff != 0 {
        st.start_ns
    } else {
        0
    };
    let mut args = [0u64; 9];
    args[0] = st.off_sys_nr as i64 as u64;
    args[1] = st.override_cat as u64;
    args[2] = woke;
    args[3] = st.off_kstack as i64 as u64;
    Some(TlEvent {
        kind: TL_OFFCPU,
        tgid: st.tgid,
        tid,
        a32: st.off_state,
        start_ns: began,
        dur_ns: dur,
        args,
    })
}

/// Off-CPU kernel stack id of a record (negative: none, or not an off-CPU record).
pub fn kernel_stack(ev: &TlEvent) -> i32 {
    if ev.kind == TL_OFFCPU {
        ev.args[3] as i64 as i32
    } else {
        -1
    }
}

/// The reason is what the accounting says: the CUDA call the thread was in, runqueue for a
/// preempted thread, else the classifier's kernel-stack and syscall rules (user-stack rules,
/// the GIL, are left to the report: resolving user stacks per event would be too slow).
fn offcpu(ev: &TlEvent, kernel_frames: &[&str], out: &mut TimelineEvent) {
    out.kind = EventKind::OffCpu;
    let sys_nr = ev.args[0] as i64 as i32;
    let override_cat = ev.args[1] as u32;
    let woke = ev.args[2];
    let state = ev.a32;
    let syscall = (sys_nr != NO_SYSCALL && sys_nr >= 0).then(|| syscall_names::name(sys_nr as i64));
    let (category, reason) = if override_cat != NO_OVERRIDE {
        let c = Category::from_u32(override_cat).unwrap_or(Category::CudaOther);
        (c, syscall.clone().unwrap_or_else(|| "in CUDA call".into()))
    } else if state & 0xff == 0 {
        (Category::Runqueue, "preempted".to_string())
    } else {
        let v = classify::blocked(sys_nr, state, kernel_frames);
        (v.category, v.reason)
    };
    out.name = format!("{} ({reason})", category.name());
    arg(out, "category", category.name());
    arg(out, "reason", reason);
    if let Some(s) = syscall {
        arg(out, "syscall", s);
    }
    arg(out, "state", format!("{state:#x}"));
    if woke != 0 {
        let end = ev.start_ns.saturating_add(ev.dur_ns);
        arg(out, "runqueue_us", end.saturating_sub(woke) / 1000);
    }
}

fn syscall(ev: &TlEvent, out: &mut TimelineEvent) {
    out.kind = EventKind::Syscall;
    out.name = syscall_names::name(ev.a32 as i32 as i64);
    arg(out, "ret", ev.args[0] as i64);
    // Signed, as the kernel takes an fd: AT_FDCWD is -100, not 18446744073709551516.
    arg(out, "arg0", ev.args[1] as i64);
}

fn block(ev: &TlEvent, out: &mut TimelineEvent) {
    out.kind = EventKind::BlockIo;
    let rw = match ev.args[1] {
        0 => "read",
        1 => "write",
        _ => "other",
    };
    // The kernel's dev_t: major in the high 12 bits, minor in the low 20.
    let dev = format!("{}:{}", ev.a32 >> 20, ev.a32 & 0xf_ffff);
    // A burst of requests (see `tracer_common::timeline::BLOCK_BURST_MAX_NS`).
    let requests = ev.args[4].max(1);
    // While requests are sampled (`tracer_common::wall::BLOCK_SAMPLE_MAP`) a burst is of the
    // picked ones, each counted as many as it stands for: its figures are estimates.
    let one_in = ev.args[7];
    out.name = if one_in > 1 {
        format!(
            "{rw} ~{} (~{requests} requests, 1 in {one_in} seen)",
            human_bytes(ev.args[0])
        )
    } else if requests > 1 {
        format!("{rw} {} ({requests} requests)", human_bytes(ev.args[0]))
    } else {
        format!("{rw} {}", human_bytes(ev.args[0]))
    };
    arg(out, "device", dev);
    arg(out, "op", rw);
    arg(out, "bytes", ev.args[0]);
    arg(out, "requests", requests);
    arg(out, "first_sector", ev.args[2]);
    arg(out, "latency_us", ev.args[5] / requests / 1000);
    arg(out, "max_latency_us", ev.args[6] / 1000);
    arg(out, "queued_us", ev.args[3] / requests / 1000);
    if one_in > 1 {
        arg(out, "sampled_one_in", one_in);
    }
}

fn human_bytes(b: u64) -> String {
    if b >= 1 << 20 {
        format!("{:.1} MiB", b as f64 / (1u64 << 20) as f64)
    } else if b >= 1 << 10 {
        format!("{} KiB", b >> 10)
    } else {
        format!("{b} B")
    }
}

fn dims(lo_hi: u64, z: u64) -> String {
    format!("{}x{}x{}", lo_hi as u32, (lo_hi >> 32) as u32, z as u32)
}

fn cuda(ev: &TlEvent, out: &mut TimelineEvent) {
    out.kind = EventKind::Cuda;
    let cookie = Cookie::unpack(ev.args[0]);
    let code = ev.args[1] as i64 as i32;
    let a = &ev.args[2..8];
    let arg7 = ev.args[8];
    let func = table::func(ev.a32);
    out.name = func.map_or_else(|| format!("cuda fn {}", ev.a32), |f| f.name.to_string());
    if let Some(c) = Category::from_u32(cookie.category as u32) {
        arg(out, "category", c.name());
    }
    let copy = |out: &mut TimelineEvent, bytes: u64, dir: u64| {
        arg(out, "bytes", bytes);
        arg(out, "direction", direction_name(dir as u32));
    };
    match Shape::from_u8(cookie.shape) {
        Some(Shape::LaunchRt) => {
            arg(out, "kernel", format!("{:#x}", a[0]));
            arg(out, "grid", dims(a[1], a[2]));
            arg(out, "block", dims(a[3], a[4]));
        }
        Some(Shape::LaunchDrv) => {
            arg(out, "kernel", format!("{:#x}", a[0]));
            arg(
                out,
                "grid",
                format!("{}x{}x{}", a[1] as u32, a[2] as u32, a[3] as u32),
            );
            arg(
                out,
                "block",
                format!("{}x{}x{}", a[4] as u32, a[5] as u32, arg7 as u32),
            );
        }
        Some(Shape::LaunchRtEx | Shape::LaunchDrvEx) => {
            // a3..a5 hold gridX..Z, blockX..Z, two per word.
            arg(out, "kernel", format!("{:#x}", a[1]));
            arg(out, "grid", dims(a[3], a[4]));
            arg(
                out,
                "block",
                format!(
                    "{}x{}x{}",
                    (a[4] >> 32) as u32,
                    a[5] as u32,
                    (a[5] >> 32) as u32
                ),
            );
        }
        Some(Shape::CopyRt) => copy(out, a[2], a[3]),
        Some(Shape::Copy2dRt) => copy(out, a[4].wrapping_mul(a[5]), arg7),
        Some(Shape::Copy3dRt) => copy(out, a[3], a[4]),
        Some(Shape::CopyBytes3) => copy(out, a[2], cookie.dir as u64),
        Some(Shape::CopyBytes5) => copy(out, a[4], cookie.dir as u64),
        Some(Shape::AllocOut) => arg(out, "bytes", a[1]),
        Some(Shape::AllocPitch) => arg(out, "bytes_min", a[2].wrapping_mul(a[3])),
        Some(Shape::Free) => arg(out, "ptr", format!("{:#x}", a[0])),
        _ => {}
    }
    if func.is_some_and(|f| {
        matches!(f.shape, Shape::CopyRt) && f.flags & tracer_common::cuda::FLAG_ASYNC != 0
    }) {
        arg(out, "stream", format!("{:#x}", a[4]));
    }
    let layer = func.map_or(table::Layer::Runtime, |f| f.layer);
    arg(out, "return", errors::name(layer, code));
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cuda::table::FUNCS;

    fn rec(kind: u32, a32: u32, start_ns: u64, dur_ns: u64, args: &[u64]) -> TlEvent {
        let mut ev = TlEvent {
            kind,
            tgid: 10,
            tid: 11,
            a32,
            start_ns,
            dur_ns,
            ..TlEvent::ZERO
        };
        ev.args[..args.len()].copy_from_slice(args);
        ev
    }

    fn get<'a>(e: &'a TimelineEvent, k: &str) -> Option<&'a str> {
        e.args.iter().find(|(n, _)| n == k).map(|(_, v)| v.as_str())
    }

    fn fid(name: &str) -> u32 {
        FUNCS.iter().position(|f| f.name == name).unwrap() as u32
    }

    #[test]
    fn sleep_is_classified_without_stacks() {
        let nr = syscall_names::nr("clock_nanosleep").unwrap() as u64;
        // Interruptible sleep (1), woken 1 ms before it ran again.
        let ev = rec(
            TL_OFFCPU,
            1,
            5_000_000,
            20_000_000,
            &[nr, NO_OVERRIDE as u64, 24_000_000],
        );
        let e = convert(&ev, 1_000_000, &[]).unwrap();
        assert_eq!((e.ts_ns, e.dur_ns), (4_000_000, 20_000_000));
        assert_eq!((e.pid, e.tid, e.kind), (10, 11, EventKind::OffCpu));
        assert_eq!(e.name, "sleep (clock_nanosleep)");
        assert_eq!(get(&e, "runqueue_us"), Some("1000"));
    }

    #[test]
    fn a_wait_under_way_at_the_end_is_drawn_to_it() {
        use tracer_common::wall::PHASE_BLOCKED;
        let nr = syscall_names::nr("read").unwrap();
        // Switched out at 5 ms into a read; the window ends at 30 ms.
        let mut st = ThreadState::new(1, 11, 10, PHASE_BLOCKED);
        st.off_ns = 5_000_000;
        st.start_ns = 5_000_000;
        st.off_state = 1;
        st.off_sys_nr = nr as i32;
        let ev = open_wait(11, &st, 30_000_000, 1_000_000).unwrap();
        assert_eq!(
            (ev.start_ns, ev.dur_ns, ev.tgid, ev.tid),
            (5_000_000, 25_000_000, 10, 11)
        );
        let e = convert(&ev, 1_000_000, &[]).unwrap();
        assert_eq!(e.kind, EventKind::OffCpu);
        assert!(e.name.contains("(read)"), "{}", e.name);
        // Stopped (SIGSTOP) since it was seeded at the window's start (no switch-out seen).
        let mut stopped = ThreadState::new(1, 11, 10, PHASE_BLOCKED);
        stopped.start_ns = 1_000_000;
        stopped.off_state = 4;
        stopped.off_sys_nr = NO_SYSCALL;
        let ev = open_wait(11, &stopped, 30_000_000, 1_000_000).unwrap();
        assert_eq!((ev.start_ns, ev.dur_ns), (1_000_000, 29_000_000));
        // On CPU, or shorter than the threshold: nothing.
        let running = ThreadState::new(1, 11, 10, PHASE_ONCPU);
        assert!(open_wait(11, &running, 30_000_000, 1_000_000).is_none());
        assert!(open_wait(11, &st, 5_500_000, 1_000_000).is_none());
        // Woken, waiting for a CPU since 29 ms.
        st.phase = PHASE_RUNNABLE;
        st.start_ns = 29_000_000;
        let ev = open_wait(11, &st, 30_000_000, 1_000_000).unwrap();
        assert_eq!(ev.args[2], 29_000_000);
    }

    #[test]
    fn preempted_and_cuda_overrides() {
        let ev = rec(TL_OFFCPU, 0, 10, 5, &[u64::MAX, NO_OVERRIDE as u64, 0]);
        assert_eq!(convert(&ev, 0, &[]).unwrap().name, "runqueue (preempted)");
        let futex = syscall_names::nr("futex").unwrap() as u64;
        let ev = rec(TL_OFFCPU, 1, 10, 5, &[futex, Category::CudaSync as u64, 0]);
        assert_eq!(convert(&ev, 0, &[]).unwrap().name, "cuda_sync (futex)");
        let ev = rec(TL_OFFCPU, 2, 10, 5, &[u64::MAX, NO_OVERRIDE as u64, 0]);
        assert_eq!(convert(&ev, 0, &[]).unwrap().name, "io (D state)");
    }

    #[test]
    fn kernel_stack_decides_like_the_accounting() {
        let read = syscall_names::nr("read").unwrap() as u64;
        let ev = rec(TL_OFFCPU, 1, 0, 5, &[read, NO_OVERRIDE as u64, 0, 7]);
        assert_eq!(kernel_stack(&ev), 7);
        assert_eq!(convert(&ev, 0, &[]).unwrap().name, "io (read)");
        let e = convert(&ev, 0, &["schedule", "anon_pipe_read", "vfs_read"]).unwrap();
        assert_eq!(e.name, "ipc (read)");
        assert_eq!(kernel_stack(&rec(TL_SYSCALL, 0, 0, 5, &[0, 0, 0, 7])), -1);
    }

    #[test]
    fn interval_started_before_the_window_is_cut() {
        let ev = rec(TL_SYSCALL, 0, 100, 1_000, &[3, 0]);
        let e = convert(&ev, 600, &[]).unwrap();
        assert_eq!((e.ts_ns, e.dur_ns, e.name.as_str()), (0, 500, "read"));
        assert_eq!(get(&e, "ret"), Some("3"));
        let ev = rec(TL_SYSCALL, 0, 100, 100, &[0, 0]);
        assert_eq!(convert(&ev, 600, &[]).unwrap().dur_ns, 0);
    }

    #[test]
    fn cuda_copy_and_launch_arguments() {
        let f = fid("cudaMemcpy");
        let ev = rec(
            TL_CUDA,
            f,
            0,
            1_000,
            &[table::cookie(f as usize), 0, 0xd0, 0xa0, 4096, 2],
        );
        let e = convert(&ev, 0, &[]).unwrap();
        assert_eq!((e.kind, e.name.as_str()), (EventKind::Cuda, "cudaMemcpy"));
        assert_eq!(get(&e, "bytes"), Some("4096"));
        assert_eq!(get(&e, "direction"), Some("D2H"));
        assert_eq!(get(&e, "category"), Some("cuda_memcpy"));
        assert_eq!(
            get(&e, "return"),
            Some(errors::name(table::Layer::Runtime, 0).as_str())
        );

        let f = fid("cudaLaunchKernel");
        let grid = 128 | (2 << 32);
        let block = 256 | (1 << 32);
        let ev = rec(
            TL_CUDA,
            f,
            0,
            30_000,
            &[table::cookie(f as usize), 0, 0xbeef, grid, 1, block, 1, 0],
        );
        let e = convert(&ev, 0, &[]).unwrap();
        assert_eq!(get(&e, "grid"), Some("128x2x1"));
        assert_eq!(get(&e, "block"), Some("256x1x1"));
        assert_eq!(get(&e, "kernel"), Some("0xbeef"));
    }

    #[test]
    fn failing_sync_says_its_error() {
        let f = fid("cudaDeviceSynchronize");
        let ev = rec(TL_CUDA, f, 0, 10, &[table::cookie(f as usize), 700]);
        let e = convert(&ev, 0, &[]).unwrap();
        assert_eq!(get(&e, "category"), Some("cuda_sync"));
        assert_eq!(
            get(&e, "return"),
            Some(errors::name(table::Layer::Runtime, 700).as_str())
        );
        assert_ne!(
            get(&e, "return"),
            Some(errors::name(table::Layer::Runtime, 0).as_str())
        );
    }

    #[test]
    fn block_request() {
        let dev = (8 << 20) | 16;
        let ev = rec(
            TL_BLOCK,
            dev,
            0,
            2_000_000,
            &[1 << 20, 1, 2048, 3_000, 1, 2_000_000, 2_000_000],
        );
        let e = convert(&ev, 0, &[]).unwrap();
        assert_eq!(
            (e.kind, e.name.as_str()),
            (EventKind::BlockIo, "write 1.0 MiB")
        );
        assert_eq!(get(&e, "device"), Some("8:16"));
        assert_eq!(get(&e, "requests"), Some("1"));
        assert_eq!(get(&e, "latency_us"), Some("2000"));
        assert_eq!(get(&e, "queued_us"), Some("3"));
        assert!(convert(&rec(99, 0, 0, 0, &[]), 0, &[]).is_none());
    }

    #[test]
    fn block_burst_says_its_requests_and_their_latencies() {
        // 4 reads of 32 KiB over 1 ms: 400 us of latency in all, the longest 150 us.
        let ev = rec(
            TL_BLOCK,
            (8 << 20) | 16,
            0,
            1_000_000,
            &[4 << 15, 0, 64, 8_000, 4, 400_000, 150_000],
        );
        let e = convert(&ev, 0, &[]).unwrap();
        assert_eq!(e.name, "read 128 KiB (4 requests)");
        assert_eq!(e.dur_ns, 1_000_000);
        assert_eq!(get(&e, "requests"), Some("4"));
        assert_eq!(get(&e, "latency_us"), Some("100"));
        assert_eq!(get(&e, "max_latency_us"), Some("150"));
        assert_eq!(get(&e, "queued_us"), Some("2"));
        assert_eq!(get(&e, "first_sector"), Some("64"));
        assert_eq!(get(&e, "sampled_one_in"), None);
    }

    #[test]
    fn a_sampled_burst_says_it_is_an_estimate() {
        // Two reads of 32 KiB counted 1 in 16: they stand for 32 of 1 MiB.
        let ev = rec(
            TL_BLOCK,
            (8 << 20) | 16,
            0,
            2_000_000,
            &[32 << 15, 0, 64, 0, 32, 3_200_000, 120_000, 16],
        );
        let e = convert(&ev, 0, &[]).unwrap();
        assert_eq!(e.name, "read ~1.0 MiB (~32 requests, 1 in 16 seen)");
        assert_eq!(get(&e, "requests"), Some("32"));
        assert_eq!(get(&e, "latency_us"), Some("100"));
        assert_eq!(get(&e, "sampled_one_in"), Some("16"));
    }
}
