//! The demo's stand-in CUDA runtime: the library bytes built by build.rs, written out as
//! `libcudart.so.12`, and the trainer's typed handle to its functions (looked up with dlsym, as
//! PyTorch's dlopen'd libtorch_cuda would find them).

use std::{
    ffi::{c_void, CStr, CString},
    os::unix::{ffi::OsStrExt, fs::OpenOptionsExt},
    path::{Path, PathBuf},
};

use anyhow::{bail, Context, Result};

/// The compiled assets/fake_cudart.c; empty when build.rs had no working C compiler.
static LIBRARY: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/libcudart.so.12"));
pub const LIB_NAME: &str = "libcudart.so.12";

/// Writes the library into `dir` and returns its path.
pub fn write_library(dir: &Path) -> Result<PathBuf> {
    if LIBRARY.is_empty() {
        bail!(
            "this gputrace was built without a working C compiler, so it carries no stand-in \
             CUDA runtime for the demo; rebuild it where `cc` works"
        );
    }
    let path = dir.join(LIB_NAME);
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o755)
        .open(&path)
        .with_context(|| format!("create {}", path.display()))?;
    std::io::Write::write_all(&mut f, LIBRARY)
        .with_context(|| format!("write {}", path.display()))?;
    Ok(path)
}

#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct Dim3 {
    pub x: u32,
    pub y: u32,
    pub z: u32,
}

pub const H2D: i32 = 1;
pub const D2H: i32 = 2;

type LaunchFn =
    unsafe extern "C" fn(*const c_void, Dim3, Dim3, *mut *mut c_void, usize, *mut c_void) -> i32;
type MemcpyFn = unsafe extern "C" fn(*mut c_void, *const c_void, usize, i32) -> i32;
type MemcpyAsyncFn =
    unsafe extern "C" fn(*mut c_void, *const c_void, usize, i32, *mut c_void) -> i32;
type SyncFn = unsafe extern "C" fn() -> i32;
type StreamSyncFn = unsafe extern "C" fn(*mut c_void) -> i32;
type MallocFn = unsafe extern "C" fn(*mut *mut c_void, usize) -> i32;
type FreeFn = unsafe extern "C" fn(*mut c_void) -> i32;
type SetDeviceFn = unsafe extern "C" fn(i32) -> i32;

/// Memory from cudaMalloc (host memory in the stand-in); copies are bounded by its length.
pub struct DeviceBuffer {
    ptr: *mut c_void,
    len: usize,
}

/// The runtime functions the trainer calls, resolved from the loaded library.
pub struct Cudart {
    launch: LaunchFn,
    memcpy: MemcpyFn,
    memcpy_async: MemcpyAsyncFn,
    device_sync: SyncFn,
    stream_sync: StreamSyncFn,
    malloc: MallocFn,
    free: FreeFn,
    set_device: SetDeviceFn,
}

fn dlerror() -> String {
    let e = unsafe { libc::dlerror() };
    if e.is_null() {
        "unknown error".into()
    } else {
        unsafe { CStr::from_ptr(e) }.to_string_lossy().into_owned()
    }
}

impl Cudart {
    pub fn open(path: &Path) -> Result<Cudart> {
        let c = CString::new(path.as_os_str().as_bytes()).context("library path")?;
        // SAFETY: the library has no initialisers beyond libc's; the handle is never closed,
        // so the function pointers below stay valid for the life of the process.
        let handle = unsafe { libc::dlopen(c.as_ptr(), libc::RTLD_NOW | libc::RTLD_GLOBAL) };
        if handle.is_null() {
            bail!("dlopen {}: {}", path.display(), dlerror());
        }
        let sym = |name: &str| -> Result<*mut c_void> {
            let n = CString::new(name).unwrap();
            let p = unsafe { libc::dlsym(handle, n.as_ptr()) };
            if p.is_null() {
                bail!("{} has no {name}: {}", path.display(), dlerror());
            }
            Ok(p)
        };
        // SAFETY: each symbol is the C function of that name in assets/fake_cudart.c, whose
        // signature (that of the real CUDA runtime) the type spells out.
        unsafe {
            Ok(Cudart {
                launch: std::mem::transmute::<*mut c_void, LaunchFn>(sym("cudaLaunchKernel")?),
                memcpy: std::mem::transmute::<*mut c_void, MemcpyFn>(sym("cudaMemcpy")?),
                memcpy_async: std::mem::transmute::<*mut c_void, MemcpyAsyncFn>(sym(
                    "cudaMemcpyAsync",
                )?),
                device_sync: std::mem::transmute::<*mut c_void, SyncFn>(sym(
                    "cudaDeviceSynchronize",
                )?),
                stream_sync: std::mem::transmute::<*mut c_void, StreamSyncFn>(sym(
                    "cudaStreamSynchronize",
                )?),
                malloc: std::mem::transmute::<*mut c_void, MallocFn>(sym("cudaMalloc")?),
                free: std::mem::transmute::<*mut c_void, FreeFn>(sym("cudaFree")?),
                set_device: std::mem::transmute::<*mut c_void, SetDeviceFn>(sym("cudaSetDevice")?),
            })
        }
    }

    fn check(what: &str, rc: i32) -> Result<()> {
        if rc != 0 {
            bail!("{what} returned CUDA error {rc}");
        }
        Ok(())
    }

    pub fn set_device(&self, dev: i32) -> Result<()> {
        Self::check("cudaSetDevice", unsafe { (self.set_device)(dev) })
    }

    pub fn malloc(&self, bytes: usize) -> Result<DeviceBuffer> {
        let mut p = std::ptr::null_mut();
        Self::check("cudaMalloc", unsafe { (self.malloc)(&mut p, bytes) })?;
        Ok(DeviceBuffer { ptr: p, len: bytes })
    }

    pub fn free(&self, buf: DeviceBuffer) -> Result<()> {
        Self::check("cudaFree", unsafe { (self.free)(buf.ptr) })
    }

    /// Synchronous (pageable) host-to-device copy of `src` to the start of `dst`.
    pub fn memcpy_h2d(&self, dst: &DeviceBuffer, src: &[u8]) -> Result<()> {
        let n = src.len().min(dst.len);
        Self::check("cudaMemcpy", unsafe {
            (self.memcpy)(dst.ptr, src.as_ptr().cast(), n, H2D)
        })
    }

    pub fn memcpy_h2d_async(&self, dst: &DeviceBuffer, src: &[u8]) -> Result<()> {
        let n = src.len().min(dst.len);
        Self::check("cudaMemcpyAsync", unsafe {
            (self.memcpy_async)(dst.ptr, src.as_ptr().cast(), n, H2D, std::ptr::null_mut())
        })
    }

    /// Reads the start of `src` back into `out` (like `loss.item()`).
    pub fn memcpy_d2h_async(&self, out: &mut [u8], src: &DeviceBuffer) -> Result<()> {
        let n = out.len().min(src.len);
        Self::check("cudaMemcpyAsync", unsafe {
            (self.memcpy_async)(
                out.as_mut_ptr().cast(),
                src.ptr,
                n,
                D2H,
                std::ptr::null_mut(),
            )
        })
    }

    pub fn launch(&self, kernel: Kernel, grid: [u32; 3], block: [u32; 3]) -> Result<()> {
        let d = |v: [u32; 3]| Dim3 {
            x: v[0],
            y: v[1],
            z: v[2],
        };
        Self::check("cudaLaunchKernel", unsafe {
            (self.launch)(
                kernel as *const c_void,
                d(grid),
                d(block),
                std::ptr::null_mut(),
                0,
                std::ptr::null_mut(),
            )
        })
    }

    pub fn device_synchronize(&self) -> Result<()> {
        Self::check("cudaDeviceSynchronize", unsafe { (self.device_sync)() })
    }

    pub fn stream_synchronize(&self) -> Result<()> {
        Self::check("cudaStreamSynchronize", unsafe {
            (self.stream_sync)(std::ptr::null_mut())
        })
    }
}

/// A kernel's host stub: what `cudaLaunchKernel` gets as `func`, and what gputrace resolves to
/// the kernel's name.
pub type Kernel = extern "C" fn() -> u64;

// Host stubs named like the kernels a PyTorch step launches. Distinct bodies, so that LLVM's
// function merging cannot fold them into one address (and one name).
macro_rules! kernel_stubs {
    ($($name:ident = $n:literal),* $(,)?) => {
        $(
            #[no_mangle]
            #[inline(never)]
            pub extern "C" fn $name() -> u64 {
                std::hint::black_box($n)
            }
        )*
        /// The step's kernels, in launch order.
        pub const KERNELS: &[Kernel] = &[$($name),*];
    };
}

kernel_stubs! {
    ampere_sgemm_128x64_tn = 1,
    vectorized_elementwise_kernel = 2,
    layer_norm_fwd_kernel = 3,
    softmax_warp_forward = 4,
    ampere_sgemm_64x64_nn = 5,
    reduce_kernel = 6,
    multi_tensor_apply_adam = 7,
}
