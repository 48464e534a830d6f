//! Finding the CUDA libraries a process really loaded (pip wheels, conda, renamed copies such as
//! `libcudart-d0da41ae.so.11.0`) from its memory maps, and the file offsets of their exported
//! functions.

use std::{
    collections::HashMap,
    fs,
    os::unix::fs::MetadataExt,
    path::{Path, PathBuf},
};

use anyhow::{Context, Result};
use object::{Object, ObjectSection, ObjectSymbol};
use tracer_common::cuda::{RtText, RT_TEXT_RANGES};

use super::table::Layer;
use crate::procfs::{self, Mapping};

/// The layer a library file name belongs to, if it is a CUDA runtime or driver library.
pub fn classify(path: &str) -> Option<Layer> {
    let base = Path::new(path).file_name()?.to_str()?;
    if !base.contains(".so") {
        return None;
    }
    if base.starts_with("libcudart.so") || base.starts_with("libcudart-") {
        Some(Layer::Runtime)
    } else if base.starts_with("libcuda.so") || base.starts_with("libcuda-") {
        Some(Layer::Driver)
    } else {
        None
    }
}

/// One CUDA library file mapped by a process.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Found {
    pub layer: Layer,
    /// The path as the process sees it.
    pub path: String,
    pub inode: u64,
    /// A path this process can open: the same path when it is the same file here, otherwise
    /// the process's /proc/PID/map_files link (another mount namespace, a deleted file).
    pub open_path: PathBuf,
    /// Not a libcudart but an object with its own (statically linked) runtime.
    pub embedded: bool,
}

/// The CUDA libraries in `maps` of process `pid`, each once. Other executable objects are
/// asked `embedded(open_path)` (once each: the caller caches) whether they carry their own
/// CUDA runtime; those are returned as runtime libraries too.
pub fn scan(
    pid: u32,
    maps: &[Mapping],
    mut embedded: impl FnMut(u64, &str, &Path) -> bool,
) -> Vec<Found> {
    let mut out: Vec<Found> = Vec::new();
    let pid = procfs::mm_pid(pid);
    for m in maps.iter().filter(|m| m.is_file()) {
        let (layer, is_embedded) = match classify(&m.path) {
            Some(l) => (l, false),
            None if m.is_exec() => {
                if !embedded(m.inode, &m.path, &procfs::map_file_path(pid, m)) {
                    continue;
                }
                (Layer::Runtime, true)
            }
            None => continue,
        };
        if out.iter().any(|f| f.inode == m.inode && f.path == m.path) {
            continue;
        }
        let same_here = fs::metadata(&m.path).is_ok_and(|md| md.ino() == m.inode);
        let open_path = if same_here {
            PathBuf::from(&m.path)
        } else {
            procfs::map_file_path(pid, m)
        };
        out.push(Found {
            layer,
            path: m.path.clone(),
            inode: m.inode,
            open_path,
            embedded: is_embedded,
        });
    }
    out
}

/// Where the shared runtimes among `runtimes` have their code in a process with maps `maps`,
/// for the entry program (`tracer_common::cuda::RT_TEXT_MAP`): the executable mappings of each
/// one that is a libcudart of its own. A runtime linked into a bigger object (libtorch_cuda,
/// NCCL) is left out: that object's other code may call the driver's launch directly, and
/// such a launch must still count. The first `RT_TEXT_RANGES` ranges are kept.
pub fn runtime_text<'a>(maps: &[Mapping], runtimes: impl IntoIterator<Item = &'a Found>) -> RtText {
    let mut text = RtText::default();
    let mut n = 0;
    for f in runtimes
        .into_iter()
        .filter(|f| f.layer == Layer::Runtime && !f.embedded)
    {
        for m in maps
            .iter()
            .filter(|m| m.is_exec() && m.inode == f.inode && m.path == f.path)
        {
            if n == RT_TEXT_RANGES {
                return text;
            }
            text.start[n] = m.start;
            text.end[n] = m.end;
            n += 1;
        }
    }
    text
}

/// A library named on the command line (`--libcudart`, `--libcuda`).
pub fn from_path(path: &Path, layer: Layer) -> Result<Found> {
    // The real path, as /proc/PID/maps will show it: a symlink (libcudart.so ->
    // libcudart.so.12.4.127) must not make the same file look like a second library.
    let real =
        fs::canonicalize(path).with_context(|| format!("CUDA library {}", path.display()))?;
    let md = fs::metadata(&real).with_context(|| format!("CUDA library {}", path.display()))?;
    Ok(Found {
        layer,
        path: real.display().to_string(),
        inode: md.ino(),
        open_path: real,
        embedded: false,
    })
}

/// A read-only private mapping of a whole file: libcuda is ~100 MB and libtorch_cuda ~1 GB, of
/// which parsing the symbol tables touches a small part.
struct Mmap {
    ptr: *mut libc::c_void,
    len: usize,
}

impl Mmap {
    fn open(path: &Path) -> Result<Mmap> {
        let file = fs::File::open(path).with_context(|| format!("open {}", path.display()))?;
        let len = file.metadata()?.len() as usize;
        if len == 0 {
            anyhow::bail!("{} is empty", path.display());
        }
        use std::os::fd::AsRawFd;
        // SAFETY: a fresh private read-only mapping of a file we opened; unmapped in Drop.
        let ptr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ,
                libc::MAP_PRIVATE,
                file.as_raw_fd(),
                0,
            )
        };
        if ptr == libc::MAP_FAILED {
            return Err(std::io::Error::last_os_error())
                .with_context(|| format!("mmap {}", path.display()));
        }
        Ok(Mmap { ptr, len })
    }

    fn bytes(&self) -> &[u8] {
        // SAFETY: the mapping is `len` bytes long and lives as long as `self`.
        unsafe { std::slice::from_raw_parts(self.ptr as *const u8, self.len) }
    }
}

impl Drop for Mmap {
    fn drop(&mut self) {
        // SAFETY: ptr/len come from a successful mmap.
        unsafe { libc::munmap(self.ptr, self.len) };
    }
}

/// True when `path` defines (not imports) one of the runtime's launch functions: a library
/// with its own copy of the CUDA runtime (static cudart), which must be probed by itself.
pub fn embeds_runtime(path: &Path) -> bool {
    const MARKERS: &[&str] = &["cudaLaunchKernel", "cudaMemcpy", "cudaMalloc"];
    symbol_offsets(path, MARKERS).is_ok_and(|o| !o.is_empty())
}

/// File offsets (what a uprobe is attached at) of the defined functions among `names`.
pub fn symbol_offsets(path: &Path, names: &[&str]) -> Result<HashMap<String, u64>> {
    let map = Mmap::open(path)?;
    let obj = object::File::parse(map.bytes())
        .with_context(|| format!("{} is not an ELF object", path.display()))?;
    let mut out = HashMap::new();
    for sym in obj.dynamic_symbols().chain(obj.symbols()) {
        if sym.is_undefined() {
            continue;
        }
        let Ok(name) = sym.name() else { continue };
        // Versioned duplicates (name@VERSION) name the same code.
        let name = name.split('@').next().unwrap_or(name);
        if out.contains_key(name) || !names.contains(&name) {
            continue;
        }
        let Some(section) = sym
            .section_index()
            .and_then(|i| obj.section_by_index(i).ok())
        else {
            continue;
        };
        let Some((file_off, _)) = section.file_range() else {
            continue;
        };
        out.insert(
            name.to_string(),
            sym.address() - section.address() + file_off,
        );
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn classifies_library_names() {
        let r = Some(Layer::Runtime);
        let d = Some(Layer::Driver);
        assert_eq!(classify("/usr/lib/libcudart.so.12"), r);
        assert_eq!(
            classify("/venv/site-packages/nvidia/cuda_runtime/lib/libcudart.so.12.9.79"),
            r
        );
        assert_eq!(classify("/x/torch/lib/libcudart-d0da41ae.so.11.0"), r);
        assert_eq!(classify("/usr/lib/x86_64-linux-gnu/libcuda.so.1"), d);
        assert_eq!(
            classify("/usr/lib/x86_64-linux-gnu/libcuda.so.535.104.05"),
            d
        );
        assert_eq!(classify("/usr/lib/libcudnn.so.9"), None);
        assert_eq!(classify("/usr/lib/libcudart_static.a"), None);
        assert_eq!(classify("/usr/lib/libcuda_stub.txt"), None);
    }

    #[test]
    fn finds_offsets_of_own_libc_functions() {
        // libc is mapped into every test process: its `malloc` must resolve to an offset that
        // lies inside an executable mapping of libc.
        let maps = procfs::read_maps(std::process::id()).unwrap();
        let libc = maps
            .iter()
            .find(|m| m.is_file() && m.path.contains("libc.so"))
            .expect("libc mapped");
        let offs = symbol_offsets(Path::new(&libc.path), &["malloc", "no_such_fn"]).unwrap();
        let off = offs["malloc"];
        assert!(!offs.contains_key("no_such_fn"));
        assert!(maps.iter().any(|m| m.path == libc.path
            && m.is_exec()
            && m.offset <= off
            && off < m.offset + (m.end - m.start)));
    }

    #[test]
    fn runtime_text_is_the_shared_runtimes_code_only() {
        let maps = parse_test_maps(
            "7f0000000000-7f0000010000 r--p 00000000 08:01 11 /w/libcudart.so.12\n\
             7f0000010000-7f0000080000 r-xp 00010000 08:01 11 /w/libcudart.so.12\n\
             7f0000080000-7f0000090000 r--p 00080000 08:01 11 /w/libcudart.so.12\n\
             7f1000000000-7f1000100000 r-xp 00000000 08:01 12 /w/libcuda.so.1\n\
             7f2000000000-7f2000100000 r-xp 00000000 08:01 13 /w/libtorch_cuda.so\n\
             7f3000000000-7f3000001000 r-xp 00000000 08:01 14 /w/old/libcudart.so.12\n",
        );
        let lib = |layer, inode, path: &str, embedded| Found {
            layer,
            path: path.into(),
            inode,
            open_path: path.into(),
            embedded,
        };
        let found = [
            lib(Layer::Runtime, 11, "/w/libcudart.so.12", false),
            lib(Layer::Driver, 12, "/w/libcuda.so.1", false),
            lib(Layer::Runtime, 13, "/w/libtorch_cuda.so", true),
        ];
        let text = runtime_text(&maps, &found);
        // The runtime's executable mapping only: not its data, not the driver, not the object
        // with a runtime inside, not another file at another path.
        assert_eq!(text.start, [0x7f00_0001_0000, 0, 0, 0]);
        assert_eq!(text.end, [0x7f00_0008_0000, 0, 0, 0]);
        assert!(text.holds(0x7f00_0001_0000));
        assert!(text.holds(0x7f00_0007_ffff));
        assert!(!text.holds(0x7f00_0008_0000));
        assert!(!text.holds(0x7f00_0000_ffff));
        assert!(!text.holds(0x7f10_0000_0010));
        assert!(!text.holds(0));
        assert_eq!(runtime_text(&maps, &found[1..]), RtText::default());
        // More ranges than fit: the first ones are kept.
        let many: String = (0..6)
            .map(|i| {
                format!(
                    "{:x}-{:x} r-xp 00000000 08:01 11 /w/libcudart.so.12\n",
                    0x1000 * (2 * i + 1),
                    0x1000 * (2 * i + 2)
                )
            })
            .collect();
        let text = runtime_text(&parse_test_maps(&many), &found[..1]);
        assert_eq!(text.start, [0x1000, 0x3000, 0x5000, 0x7000]);
        assert_eq!(text.end[3], 0x8000);
    }

    fn parse_test_maps(text: &str) -> Vec<Mapping> {
        procfs::parse_maps(text)
    }
}
