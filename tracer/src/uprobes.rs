//! Attaching the uprobe programs: `uprobe_multi` links where the kernel has them (6.6+), one per
//! program and file (two where the launch gate switches some of the functions), aya's
//! perf-event links (one per offset) elsewhere.
//!
//! Why it matters: closing a perf-event uprobe link takes the program off, waits for a
//! tasks-trace RCU grace period (~100 ms on the development VM), and only then unregisters the
//! uprobe and removes its breakpoint; every probed call meanwhile traps with no program to
//! count it. A `uprobe_multi` link removes its breakpoints first and waits afterwards. On a
//! launch storm (`cargo xtask bench --window-cost`, and a by-hand A/B with a no-op program):
//! closing a perf link cost the storm 120-150 ms of its time, a multi link 0-33 ms; the gate
//! that switches the launch probes on and off under `--max-overhead` pays this at every window.
//! One link per file also means one grace period per file at exit, not one per function.
//!
//! aya 0.14 can neither load a program for these links (they need `expected_attach_type =
//! BPF_TRACE_UPROBE_MULTI` at load time) nor create them, so the programs are relocated by
//! aya-obj (aya's own object layer) against the maps aya created, and loaded and linked with the
//! `bpf` syscall here. `GPUTRACE_UPROBE_MULTI=0` keeps aya's links.

use std::{
    collections::{HashMap, HashSet},
    ffi::CString,
    os::fd::{AsFd, AsRawFd, FromRawFd, OwnedFd},
    path::Path,
    sync::Arc,
};

use anyhow::{bail, Context, Result};
use aya::{
    maps::{Map, MapData},
    programs::{
        uprobe::{UProbeAttachLocation, UProbeAttachPoint, UProbeLink, UProbeScope},
        UProbe,
    },
    Ebpf,
};
use aya_obj::{
    btf::BtfFeatures,
    generated::{
        bpf_attach_type::BPF_TRACE_UPROBE_MULTI, bpf_attr, bpf_cmd, bpf_prog_type,
        BPF_F_UPROBE_MULTI_RETURN,
    },
    Object, ProgramSection,
};

use crate::bpf::{load_error, rejection_message, sys_bpf};

/// One attachment of a program; dropping it detaches.
pub enum Link {
    Perf(UProbeLink),
    Multi(OwnedFd),
}

/// The uprobe programs, loaded for the kind of link this kernel has. Cheap to clone.
#[derive(Clone)]
pub struct Uprobes {
    multi: Option<Arc<HashMap<&'static str, MultiProgram>>>,
    /// Why aya's perf links are used, when they are.
    why_perf: Option<String>,
}

struct MultiProgram {
    fd: OwnedFd,
    ret: bool,
}

impl Uprobes {
    /// Loads `progs` (uprobe programs of `object`, which `ebpf` was loaded from) before any map
    /// is taken out of `ebpf`: the relocation needs every map the object defines.
    pub fn load(ebpf: &mut Ebpf, object: &[u8], progs: &[&'static str]) -> Result<Uprobes> {
        Self::load_beside(ebpf, object, progs, |_| {})
    }

    /// [`Uprobes::load`], while `beside` runs on this thread with `ebpf` (it may load other
    /// programs, and must not take maps out): the `uprobe_multi` programs are relocated and
    /// verified on another, as the verifier takes ~75 ms of CPU for them here.
    pub fn load_beside(
        ebpf: &mut Ebpf,
        object: &[u8],
        progs: &[&'static str],
        beside: impl FnOnce(&mut Ebpf),
    ) -> Result<Uprobes> {
        let multi = if std::env::var("GPUTRACE_UPROBE_MULTI").as_deref() == Ok("0") {
            beside(ebpf);
            Err("GPUTRACE_UPROBE_MULTI=0".to_string())
        } else {
            // The maps' fds are copied first: `beside` has `ebpf` meanwhile.
            let fds = map_fds(ebpf);
            std::thread::scope(|s| {
                let h = s.spawn(|| {
                    load_multi(&fds?, object, progs).and_then(|m| {
                        check_link(&m)?;
                        Ok(m)
                    })
                });
                beside(ebpf);
                h.join()
                    .unwrap_or_else(|_| Err(anyhow::anyhow!("the loading thread panicked")))
            })
            .map_err(|e| format!("{e:#}"))
        };
        let why = match multi {
            Ok(m) => {
                return Ok(Uprobes {
                    multi: Some(Arc::new(m)),
                    why_perf: None,
                })
            }
            Err(why) => why,
        };
        for &prog in progs {
            let p: &mut UProbe = ebpf
                .program_mut(prog)
                .with_context(|| format!("program {prog} missing from the object"))?
                .try_into()?;
            p.load().map_err(|e| load_error(prog, e))?;
        }
        Ok(Uprobes {
            multi: None,
            why_perf: Some(why),
        })
    }

    /// Why aya's perf links are used, if they are.
    pub fn why_perf(&self) -> Option<&str> {
        self.why_perf.as_deref()
    }

    /// Which links are used, for `-v`.
    pub fn describe(&self) -> String {
        match &self.why_perf {
            None => "uprobes on uprobe_multi links".into(),
            Some(why) => format!("uprobes on perf-event links (no uprobe_multi: {why})"),
        }
    }

    /// Attaches `prog` at `points` (file offset, cookie) of `path`; `pid`: only that process,
    /// else every process that maps the file. One link for all points, or one per point.
    pub fn attach(
        &self,
        ebpf: &mut Ebpf,
        prog: &'static str,
        path: &Path,
        points: &[(u64, u64)],
        pid: Option<u32>,
    ) -> Result<Vec<Link>> {
        if points.is_empty() {
            return Ok(Vec::new());
        }
        if let Some(m) = &self.multi {
            let p = m
                .get(prog)
                .with_context(|| format!("program {prog} not loaded"))?;
            let fd = multi_link(p, path, points, pid)
                .with_context(|| format!("attach {prog} to {}", path.display()))?;
            return Ok(vec![Link::Multi(fd)]);
        }
        let p: &mut UProbe = ebpf
            .program_mut(prog)
            .with_context(|| format!("program {prog} missing from the object"))?
            .try_into()?;
        let scope = match pid.and_then(std::num::NonZeroU32::new) {
            Some(pid) => UProbeScope::OneProcess(pid),
            None => UProbeScope::AllProcesses,
        };
        let mut links = Vec::with_capacity(points.len());
        for &(offset, cookie) in points {
            let id = p
                .attach(
                    UProbeAttachPoint {
                        location: UProbeAttachLocation::AbsoluteOffset(offset),
                        cookie: Some(cookie),
                    },
                    path,
                    scope,
                )
                .map_err(|e| explain_refusal_in(e.into()))
                .with_context(|| format!("attach {prog} to {}", path.display()))?;
            links.push(Link::Perf(p.take_link(id)?));
        }
        Ok(links)
    }

    /// A program's run count and run time (ns) from the kernel's BPF statistics: of the copy
    /// loaded here if there is one, else of aya's.
    pub fn runs(&self, ebpf: &Ebpf, prog: &str) -> (u64, u64) {
        match self.multi.as_ref().and_then(|m| m.get(prog)) {
            Some(p) => run_stats(p.fd.as_fd()).unwrap_or((0, 0)),
            None => ebpf
                .program(prog)
                .and_then(|p| p.info().ok())
                .map(|i| (i.run_count(), i.run_time().as_nanos() as u64))
                .unwrap_or((0, 0)),
        }
    }

    /// The programs loaded here rather than by aya (absent from `Ebpf::programs`), with their
    /// run counts and times, and whether each is a return probe.
    pub fn own_programs(&self) -> Vec<(&'static str, bool, u64, u64)> {
        let Some(m) = &self.multi else {
            return Vec::new();
        };
        m.iter()
            .filter_map(|(name, p)| {
                let (n, t) = run_stats(p.fd.as_fd())?;
                Some((*name, p.ret, n, t))
            })
            .collect()
    }
}

/// Closes links together, waiting for all: each close waits for the kernel's grace period, and
/// concurrent closes share it (one after another, a target with many probed libraries held
/// gputrace's exit for seconds).
pub fn close_all(links: Vec<Link>) {
    // Perf links are one per probed function: a target with 64 probed libraries has
    // thousands, and each thread closes its share one after another.
    const THREADS: usize = 256;
    if links.is_empty() {
        return;
    }
    let per = links.len().div_ceil(THREADS);
    let mut links = links.into_iter();
    let mut closers = Vec::new();
    loop {
        let chunk: Vec<Link> = links.by_ref().take(per).collect();
        if chunk.is_empty() {
            break;
        }
        // Without a thread, the chunk is dropped here, one link after another.
        if let Ok(t) = std::thread::Builder::new()
            .name("gputrace-close".into())
            .spawn(move || drop(chunk))
        {
            closers.push(t);
        }
    }
    for c in closers {
        let _ = c.join();
    }
}

/// `run_cnt` and `run_time_ns` of a program (BPF_OBJ_GET_INFO_BY_FD).
fn run_stats(fd: std::os::fd::BorrowedFd<'_>) -> Option<(u64, u64)> {
    // struct bpf_prog_info up to run_cnt (run_time_ns at 192, run_cnt at 200, linux/bpf.h);
    // the kernel fills what fits in info_len.
    let mut info = [0u8; 208];
    let mut attr = unsafe { std::mem::zeroed::<bpf_attr>() };
    attr.info.bpf_fd = fd.as_raw_fd() as u32;
    attr.info.info_len = info.len() as u32;
    attr.info.info = info.as_mut_ptr() as u64;
    sys_bpf(bpf_cmd::BPF_OBJ_GET_INFO_BY_FD, &mut attr).ok()?;
    let at = |o: usize| u64::from_ne_bytes(info[o..o + 8].try_into().unwrap());
    Some((at(200), at(192)))
}

/// The descriptor of a map of `ebpf`, whatever its kind.
fn map_data(m: &Map) -> &MapData {
    match m {
        Map::Array(d)
        | Map::ArrayOfMaps(d)
        | Map::BloomFilter(d)
        | Map::CgroupArray(d)
        | Map::CgroupStorage(d)
        | Map::CgrpStorage(d)
        | Map::CpuMap(d)
        | Map::DevMap(d)
        | Map::DevMapHash(d)
        | Map::HashMap(d)
        | Map::HashOfMaps(d)
        | Map::InodeStorage(d)
        | Map::LpmTrie(d)
        | Map::LruHashMap(d)
        | Map::PerCpuArray(d)
        | Map::PerCpuCgroupStorage(d)
        | Map::PerCpuHashMap(d)
        | Map::PerCpuLruHashMap(d)
        | Map::PerfEventArray(d)
        | Map::ProgramArray(d)
        | Map::Queue(d)
        | Map::ReusePortSockArray(d)
        | Map::RingBuf(d)
        | Map::SockHash(d)
        | Map::SockMap(d)
        | Map::SkStorage(d)
        | Map::Stack(d)
        | Map::StackTraceMap(d)
        | Map::Unsupported(d)
        | Map::XskMap(d) => d,
    }
}

/// Each map's fd by name, for [`load_multi`]'s relocations: copies of aya's, so that they stay
/// open whatever is done with the maps meanwhile.
fn map_fds(ebpf: &Ebpf) -> Result<HashMap<String, OwnedFd>> {
    ebpf.maps()
        .map(|(name, m)| {
            let fd = map_data(m)
                .fd()
                .as_fd()
                .try_clone_to_owned()
                .with_context(|| format!("copy the fd of map {name}"))?;
            Ok((name.to_string(), fd))
        })
        .collect()
}

/// Relocates the object against the maps `fds` holds (what aya did for its own copies) and
/// loads `progs` for uprobe_multi links.
fn load_multi(
    fds: &HashMap<String, OwnedFd>,
    object: &[u8],
    progs: &[&'static str],
) -> Result<HashMap<&'static str, MultiProgram>> {
    let mut obj = Object::parse(object).context("parse the eBPF object")?;
    // The object's BTF, for the programs' function and line info (a callback passed to a
    // helper needs it). A kernel with uprobe_multi links (6.6+) has every BTF kind aya-obj
    // would otherwise rewrite.
    let features = BtfFeatures::new(true, true, true, true, true, true, true, true);
    let btf = match obj
        .fixup_and_sanitize_btf(&features)
        .context("prepare the object's BTF")?
    {
        Some(btf) => Some(load_btf(&btf.to_bytes())?),
        None => None,
    };
    let maps = obj
        .maps
        .iter()
        .map(|(name, m)| {
            let fd = fds
                .get(name)
                .with_context(|| format!("map {name} not created (or taken) yet"))?
                .as_raw_fd();
            Ok((name.clone(), fd, m.clone()))
        })
        .collect::<Result<Vec<_>>>()?;
    let text_sections: HashSet<usize> = obj.functions.keys().map(|(s, _)| *s).collect();
    obj.relocate_maps(
        maps.iter().map(|(n, fd, m)| (n.as_str(), *fd, m)),
        &text_sections,
    )
    .context("relocate the maps")?;
    obj.relocate_calls(&text_sections)
        .context("relocate the calls")?;
    let mut out = HashMap::new();
    for &name in progs {
        let p = obj
            .programs
            .get(name)
            .with_context(|| format!("program {name} missing from the object"))?;
        let ret = match p.section {
            ProgramSection::UProbe { .. } => false,
            ProgramSection::URetProbe { .. } => true,
            _ => bail!("{name} is not a uprobe program"),
        };
        let f = obj
            .functions
            .get(&p.function_key())
            .with_context(|| format!("code of {name} missing from the object"))?;
        let fd = load_program(name, f, &p.license, btf.as_ref())?;
        out.insert(name, MultiProgram { fd, ret });
    }
    Ok(out)
}

fn load_btf(bytes: &[u8]) -> Result<OwnedFd> {
    let mut attr = unsafe { std::mem::zeroed::<bpf_attr>() };
    // SAFETY: plain integers in a zeroed union; bytes outlive the syscall.
    unsafe {
        let u = &mut attr.__bindgen_anon_7;
        u.btf = bytes.as_ptr() as u64;
        u.btf_size = bytes.len() as u32;
    }
    let fd = sys_bpf(bpf_cmd::BPF_BTF_LOAD, &mut attr).context("load the object's BTF")?;
    // SAFETY: a new descriptor the kernel just gave us.
    Ok(unsafe { OwnedFd::from_raw_fd(fd as i32) })
}

fn load_program(
    name: &str,
    f: &aya_obj::Function,
    license: &CString,
    btf: Option<&OwnedFd>,
) -> Result<OwnedFd> {
    let insns = &f.instructions;
    let func_info = f.func_info.func_info_bytes();
    let line_info = f.line_info.line_info_bytes();
    let mut attr = unsafe { std::mem::zeroed::<bpf_attr>() };
    let cname = name.as_bytes();
    // SAFETY: plain integers in a zeroed union; what they point at outlives the syscall.
    unsafe {
        let u = &mut attr.__bindgen_anon_3;
        if let Some(btf) = btf {
            u.prog_btf_fd = btf.as_raw_fd() as u32;
            if f.func_info_rec_size > 0 {
                u.func_info = func_info.as_ptr() as u64;
                u.func_info_cnt = f.func_info.len() as u32;
                u.func_info_rec_size = f.func_info_rec_size as u32;
            }
            if f.line_info_rec_size > 0 {
                u.line_info = line_info.as_ptr() as u64;
                u.line_info_cnt = f.line_info.len() as u32;
                u.line_info_rec_size = f.line_info_rec_size as u32;
            }
        }
        u.prog_type = bpf_prog_type::BPF_PROG_TYPE_KPROBE as u32;
        u.expected_attach_type = BPF_TRACE_UPROBE_MULTI as u32;
        u.insns = insns.as_ptr() as u64;
        u.insn_cnt = insns.len() as u32;
        u.license = license.as_ptr() as u64;
        for (d, s) in u.prog_name.iter_mut().zip(cname.iter().take(15)) {
            *d = *s as _;
        }
    }
    match sys_bpf(bpf_cmd::BPF_PROG_LOAD, &mut attr) {
        // SAFETY: a new descriptor the kernel just gave us.
        Ok(fd) => Ok(unsafe { OwnedFd::from_raw_fd(fd as i32) }),
        Err(e) => {
            // Again with the verifier's log, for the message.
            let mut log = vec![0u8; 1 << 20];
            unsafe {
                let u = &mut attr.__bindgen_anon_3;
                u.log_level = 1;
                u.log_buf = log.as_mut_ptr() as u64;
                u.log_size = log.len() as u32;
            }
            let _ = sys_bpf(bpf_cmd::BPF_PROG_LOAD, &mut attr).map(|fd| {
                // SAFETY: as above; closed at once.
                drop(unsafe { OwnedFd::from_raw_fd(fd as i32) })
            });
            let end = log.iter().position(|b| *b == 0).unwrap_or(log.len());
            let log = String::from_utf8_lossy(&log[..end]);
            bail!("{}", rejection_message(name, &e, &log))
        }
    }
}

fn multi_link(
    p: &MultiProgram,
    path: &Path,
    points: &[(u64, u64)],
    pid: Option<u32>,
) -> Result<OwnedFd> {
    let cpath =
        CString::new(path.as_os_str().as_encoded_bytes()).context("a NUL byte in the path")?;
    let offsets: Vec<u64> = points.iter().map(|p| p.0).collect();
    let cookies: Vec<u64> = points.iter().map(|p| p.1).collect();
    let mut attr = unsafe { std::mem::zeroed::<bpf_attr>() };
    // SAFETY: plain integers in a zeroed union; the arrays and the path outlive the syscall.
    unsafe {
        let l = &mut attr.link_create;
        l.__bindgen_anon_1.prog_fd = p.fd.as_raw_fd() as u32;
        l.attach_type = BPF_TRACE_UPROBE_MULTI as u32;
        let m = &mut l.__bindgen_anon_3.uprobe_multi;
        m.path = cpath.as_ptr() as u64;
        m.offsets = offsets.as_ptr() as u64;
        m.cookies = cookies.as_ptr() as u64;
        m.cnt = points.len() as u32;
        m.flags = if p.ret { BPF_F_UPROBE_MULTI_RETURN } else { 0 };
        m.pid = pid.unwrap_or(0);
    }
    let fd = sys_bpf(bpf_cmd::BPF_LINK_CREATE, &mut attr).map_err(explain_refusal)?;
    // SAFETY: a new descriptor the kernel just gave us.
    Ok(unsafe { OwnedFd::from_raw_fd(fd as i32) })
}

/// The kernel's internal ENOTSUPP (524), which strerror does not know: it will not put a
/// breakpoint on the instruction at an offset (one that is already a breakpoint, or that it
/// cannot single-step).
const ENOTSUPP: i32 = 524;

/// `explain_refusal` for an error whose cause is somewhere down its chain (aya's).
fn explain_refusal_in(e: anyhow::Error) -> anyhow::Error {
    let refused = e.chain().any(|c| {
        c.downcast_ref::<std::io::Error>()
            .and_then(std::io::Error::raw_os_error)
            == Some(ENOTSUPP)
    });
    match refused {
        true => explain_refusal(std::io::Error::from_raw_os_error(ENOTSUPP)),
        false => e,
    }
}

fn explain_refusal(e: std::io::Error) -> anyhow::Error {
    match e.raw_os_error() {
        Some(ENOTSUPP) => anyhow::anyhow!(
            "the kernel will not probe the instruction there (ENOTSUPP: a breakpoint already, \
             or one it cannot single-step)"
        ),
        _ => e.into(),
    }
}

/// A kernel may load the programs and still not create the links (before 6.6 the attach type
/// is not checked at load): one link on this process's own code says.
fn check_link(m: &HashMap<&'static str, MultiProgram>) -> Result<()> {
    let p = m
        .values()
        .find(|p| !p.ret)
        .context("no entry program to try a link with")?;
    let (path, offset) = crate::procfs::own_code(check_link_target as *const () as u64)?;
    let fd = multi_link(p, &path, &[(offset, 0)], Some(std::process::id()))
        .context("the kernel refused a uprobe_multi link")?;
    // Its close waits for a grace period: not on the start-up path.
    let _ = std::thread::Builder::new()
        .name("gputrace-probe".into())
        .spawn(move || drop(fd));
    Ok(())
}

#[inline(never)]
extern "C" fn check_link_target() -> u64 {
    std::hint::black_box(7)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_refused_instruction_is_said_in_words() {
        let e = explain_refusal(std::io::Error::from_raw_os_error(ENOTSUPP));
        assert!(
            format!("{e:#}").contains("will not probe the instruction"),
            "{e:#}"
        );
        let e = explain_refusal(std::io::Error::from_raw_os_error(libc::ENOENT));
        assert!(format!("{e:#}").contains("No such file"), "{e:#}");
        let deep = anyhow::Error::from(std::io::Error::from_raw_os_error(ENOTSUPP))
            .context("perf_event_open");
        let e = explain_refusal_in(deep);
        assert!(format!("{e:#}").contains("ENOTSUPP"), "{e:#}");
    }
}
