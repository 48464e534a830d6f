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
}

/// The CUDA libraries in `maps` of process `pid`, each once.
pub fn scan(pid: u32, maps: &[Mapping]) -> Vec<Found> {
    let mut out: Vec<Found> = Vec::new();
    for m in maps.iter().filter(|m| m.is_file()) {
        let Some(layer) = classify(&m.path) else {
            continue;
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
        });
    }
    out
}

/// A library named on the command line (`--libcudart`, `--libcuda`).
pub fn from_path(path: &Path, layer: Layer) -> Result<Found> {
    let md = fs::metadata(path).with_context(|| format!("CUDA library {}", path.display()))?;
    Ok(Found {
        layer,
        path: path.display().to_string(),
        inode: md.ino(),
        open_path: path.to_path_buf(),
    })
}

/// File offsets (what a uprobe is attached at) of the defined functions among `names`.
pub fn symbol_offsets(path: &Path, names: &[&str]) -> Result<HashMap<String, u64>> {
    let data = fs::read(path).with_context(|| format!("read {}", path.display()))?;
    let obj = object::File::parse(&*data)
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
}
