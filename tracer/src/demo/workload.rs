//! The demo's synthetic training job, run as hidden roles of the gputrace binary itself
//! (`gputrace demo --role trainer|loader`), so nothing needs installing:
//!
//! - the trainer (main thread, named `trainer`) takes batches from its data-loader workers'
//!   pipes in turn, copies each to the "GPU", launches the step's kernels and synchronises,
//!   all through the stand-in libcudart.so.12 (preloaded by the demo, as a real job maps the
//!   runtime when it starts);
//! - each data-loader worker (a child process named `dataloader`) reads the data set's files
//!   and writes batches into its pipe (its stdout).

use std::{
    io::{Read, Write},
    path::Path,
    process::{Child, ChildStdout, Command, Stdio},
    time::{Duration, Instant},
};

use anyhow::{bail, Context, Result};

use super::{
    cudart::{Cudart, KERNELS},
    dataset::{self, AlignedBuf},
    profile::{Mode, Profile},
};

fn set_thread_name(name: &str) {
    let c = std::ffi::CString::new(name).unwrap();
    unsafe { libc::prctl(libc::PR_SET_NAME, c.as_ptr() as libc::c_ulong, 0, 0, 0) };
}

struct Worker {
    child: Child,
    pipe: ChildStdout,
}

fn spawn_workers(mode: Mode, fixed: bool, p: &Profile, data_dir: &Path) -> Result<Vec<Worker>> {
    let exe = std::env::current_exe().context("find the gputrace binary")?;
    (0..p.workers)
        .map(|i| {
            let mut cmd = Command::new(&exe);
            cmd.args(["demo", "--role", "loader", "--mode", mode.name()]);
            if fixed {
                cmd.arg("--fixed");
            }
            let mut child = cmd
                .arg("--data-dir")
                .arg(data_dir)
                .args(["--worker", &i.to_string()])
                // The runtime is the trainer's; workers never touch CUDA.
                .env_remove("LD_PRELOAD")
                .stdin(Stdio::null())
                .stdout(Stdio::piped())
                .spawn()
                .context("start a data-loader worker")?;
            let pipe = child.stdout.take().context("worker pipe")?;
            Ok(Worker { child, pipe })
        })
        .collect()
}

/// The per-step host work a training script does between batches (collating the batch into
/// the input tensor); named so that it shows in the CPU profile.
#[inline(never)]
fn collate_batch(batch: &[u8], host_input: &mut [u8]) -> u64 {
    let n = batch.len().min(host_input.len());
    host_input[..n].copy_from_slice(&batch[..n]);
    batch.iter().step_by(64).map(|&b| b as u64).sum()
}

pub fn trainer(mode: Mode, fixed: bool, seconds: u64, data_dir: &Path, lib: &Path) -> Result<()> {
    set_thread_name("trainer");
    let p = mode.profile_with(fixed);
    let cuda = Cudart::open(lib)?;
    cuda.set_device(0)?;
    let mut workers = spawn_workers(mode, fixed, &p, data_dir)?;

    let dev_input = cuda.malloc(p.h2d_bytes as usize)?;
    let dev_loss = cuda.malloc(4)?;
    let mut host_input = vec![1u8; p.h2d_bytes as usize];
    let mut batch = vec![0u8; p.batch_bytes as usize];
    let (grid, block) = p.launch_dims();

    let start = Instant::now();
    let cpu_start = thread_cpu_ns();
    let deadline = start + Duration::from_secs(seconds);
    let mut steps: u64 = 0;
    let mut checksum: u64 = 0;
    while Instant::now() < deadline {
        let w = (steps % workers.len() as u64) as usize;
        workers[w]
            .pipe
            .read_exact(&mut batch)
            .context("read a batch from a data-loader worker")?;
        checksum = checksum.wrapping_add(collate_batch(&batch, &mut host_input));
        if p.h2d_sync {
            cuda.memcpy_h2d(&dev_input, &host_input)?;
        } else {
            cuda.memcpy_h2d_async(&dev_input, &host_input)?;
        }
        for k in 0..p.kernels {
            cuda.launch(KERNELS[k as usize % KERNELS.len()], grid, block)?;
        }
        // `loss.item()`: a small read-back, then the step ends on a device-wide barrier.
        let mut loss = [0u8; 4];
        cuda.memcpy_d2h_async(&mut loss, &dev_loss)?;
        cuda.stream_synchronize()?;
        cuda.device_synchronize()?;
        // The caching allocator occasionally grows: a real cudaMalloc/cudaFree pair.
        if steps % 50 == 49 {
            let tmp = cuda.malloc(1 << 20)?;
            cuda.free(tmp)?;
        }
        steps += 1;
    }
    let elapsed = start.elapsed().as_secs_f64();
    let cpu = thread_cpu_ns().saturating_sub(cpu_start) as f64 / 1e9;
    cuda.free(dev_input)?;
    cuda.free(dev_loss)?;
    // Closing the pipes ends the workers (their next write fails with EPIPE).
    let mut failed = 0;
    for w in workers.drain(..) {
        let Worker { mut child, pipe } = w;
        drop(pipe);
        match child.wait() {
            Ok(s) if s.success() => {}
            _ => failed += 1,
        }
    }
    // The CPU time too: probe traps are charged to the probed thread, and on a shared host it
    // moves less than wall time with the neighbours' load (`cargo xtask bench` compares both).
    eprintln!(
        "demo trainer: {steps} steps in {elapsed:.2} s ({:.1} steps/s, {:.2} ms/step, {:.3} ms \
         CPU/step; checksum {:x})",
        steps as f64 / elapsed,
        1e3 * elapsed / steps.max(1) as f64,
        1e3 * cpu / steps.max(1) as f64,
        checksum & 0xffff
    );
    if failed > 0 {
        bail!("{failed} data-loader worker(s) failed");
    }
    Ok(())
}

/// Decodes a batch (a hash over every 8th byte of what was read), as a real loader decodes
/// and augments: some CPU per batch, small next to the disk reads of the data-bound mode.
#[inline(never)]
fn decode_batch(raw: &[u8], out: &mut [u8]) {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for (i, o) in out.iter_mut().enumerate().step_by(8) {
        h = (h ^ raw[(i * 31) % raw.len()] as u64).wrapping_mul(0x100_0000_01b3);
        *o = h as u8;
    }
}

pub fn loader(mode: Mode, fixed: bool, data_dir: &Path, worker: u32) -> Result<()> {
    set_thread_name("dataloader");
    let p = mode.profile_with(fixed);
    let (files, file_size) = p.dataset();
    let mut buf = AlignedBuf::new(p.read_chunk as usize);
    let mut batch = vec![0u8; p.batch_bytes as usize];
    let mut out = std::io::stdout().lock();
    let mut file = worker % files;
    let mut offset: u64 = 0;
    loop {
        let mut read = 0u64;
        while read < p.read_per_batch {
            let path = dataset::file_path(data_dir, file);
            let (f, direct) = dataset::open(&path, p.direct_io)?;
            while read < p.read_per_batch && offset < file_size {
                let n = dataset::read_at(&f, buf.as_mut_slice(), offset)? as u64;
                if n == 0 {
                    break;
                }
                let filled = (read as usize).min(batch.len());
                let take = (batch.len() - filled).min(n as usize);
                batch[filled..filled + take].copy_from_slice(&buf.as_mut_slice()[..take]);
                read += n;
                offset += n;
            }
            if p.direct_io && !direct {
                // No O_DIRECT here: evict what we read, so the next epoch reads the disk again.
                dataset::drop_cache(&f);
            }
            if offset >= file_size {
                offset = 0;
                file = (file + p.workers) % files;
            }
        }
        let raw = batch.clone();
        decode_batch(&raw, &mut batch);
        match out.write_all(&batch).and_then(|_| out.flush()) {
            Ok(()) => {}
            // The trainer finished and closed our pipe.
            Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => return Ok(()),
            Err(e) => return Err(e).context("send a batch to the trainer"),
        }
    }
}

/// CPU time of the calling thread (ns), user and system.
fn thread_cpu_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes one timespec through a valid pointer.
    let r = unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    if r != 0 {
        return 0;
    }
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}
