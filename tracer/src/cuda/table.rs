//! Every probed CUDA function: its layer, time category, and how its arguments are read
//! ([`Shape`]). The row's index is the function id the kernel side reports.

use tracer_common::{
    cuda::{
        Cookie, Shape, DIR_D2D, DIR_D2H, DIR_DEFAULT, DIR_H2D, DIR_NONE, FLAG_ASYNC, FLAG_NO_RESULT,
    },
    time::Category,
};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Layer {
    Runtime,
    Driver,
}

impl Layer {
    pub fn name(self) -> &'static str {
        match self {
            Layer::Runtime => "runtime",
            Layer::Driver => "driver",
        }
    }
}

#[derive(Debug, Clone, Copy)]
pub struct Func {
    pub name: &'static str,
    pub layer: Layer,
    pub category: Category,
    pub shape: Shape,
    pub dir: u8,
    pub flags: u8,
}

impl Func {
    /// Allocates or frees page-locked host memory (`cudaMallocHost`, `cudaHostAlloc`,
    /// `cuMemAllocHost`): not GPU memory, and not in the GPU memory figures.
    pub fn is_host_memory(&self) -> bool {
        matches!(
            self.name,
            "cudaMallocHost"
                | "cudaHostAlloc"
                | "cudaFreeHost"
                | "cuMemAllocHost_v2"
                | "cuMemFreeHost"
        )
    }

    pub fn is_launch(&self) -> bool {
        matches!(
            self.shape,
            Shape::LaunchRt | Shape::LaunchRtEx | Shape::LaunchDrv | Shape::LaunchDrvEx
        )
    }
}

const fn f(
    name: &'static str,
    layer: Layer,
    category: Category,
    shape: Shape,
    dir: u8,
    flags: u8,
) -> Func {
    Func {
        name,
        layer,
        category,
        shape,
        dir,
        flags,
    }
}

use Category::{CudaLaunch as L, CudaMalloc as M, CudaMemcpy as C, CudaOther as O, CudaSync as S};
use Layer::{Driver as D, Runtime as R};
use Shape::*;

const N: u8 = DIR_NONE;
const A: u8 = FLAG_ASYNC;

pub static FUNCS: &[Func] = &[
    // Runtime: launches.
    f("cudaLaunchKernel", R, L, LaunchRt, N, 0),
    f("cudaLaunchKernel_ptsz", R, L, LaunchRt, N, 0),
    f("cudaLaunchKernelExC", R, L, LaunchRtEx, N, 0),
    f("cudaLaunchKernelExC_ptsz", R, L, LaunchRtEx, N, 0),
    f("cudaLaunchCooperativeKernel", R, L, LaunchRt, N, 0),
    f("cudaLaunchCooperativeKernel_ptsz", R, L, LaunchRt, N, 0),
    f("cudaGraphLaunch", R, L, Plain, N, 0),
    f("cudaGraphLaunch_ptsz", R, L, Plain, N, 0),
    // Runtime: copies and memsets.
    f("cudaMemcpy", R, C, CopyRt, N, 0),
    f("cudaMemcpy_ptds", R, C, CopyRt, N, 0),
    f("cudaMemcpyAsync", R, C, CopyRt, N, A),
    f("cudaMemcpyAsync_ptsz", R, C, CopyRt, N, A),
    f("cudaMemcpy2D", R, C, Copy2dRt, N, 0),
    f("cudaMemcpy2DAsync", R, C, Copy2dRt, N, A),
    f("cudaMemcpy3D", R, C, Copy3dRt, N, 0),
    f("cudaMemcpy3DAsync", R, C, Copy3dRt, N, A),
    f("cudaMemcpyPeer", R, C, CopyBytes5, DIR_D2D, 0),
    f("cudaMemcpyPeerAsync", R, C, CopyBytes5, DIR_D2D, A),
    f("cudaMemset", R, C, Plain, N, 0),
    f("cudaMemsetAsync", R, C, Plain, N, A),
    f("cudaMemset2D", R, C, Plain, N, 0),
    f("cudaMemset2DAsync", R, C, Plain, N, A),
    // Runtime: memory.
    f("cudaMalloc", R, M, AllocOut, N, 0),
    f("cudaMallocAsync", R, M, AllocOut, N, 0),
    f("cudaMallocHost", R, M, AllocOut, N, 0),
    f("cudaHostAlloc", R, M, AllocOut, N, 0),
    f("cudaMallocManaged", R, M, AllocOut, N, 0),
    f("cudaMallocPitch", R, M, AllocPitch, N, 0),
    f("cudaFree", R, M, Free, N, 0),
    f("cudaFreeAsync", R, M, Free, N, 0),
    f("cudaFreeHost", R, M, Free, N, 0),
    // Runtime: synchronisation.
    f("cudaDeviceSynchronize", R, S, Plain, N, 0),
    f("cudaStreamSynchronize", R, S, Plain, N, 0),
    f("cudaStreamSynchronize_ptsz", R, S, Plain, N, 0),
    f("cudaEventSynchronize", R, S, Plain, N, 0),
    f("cudaStreamWaitEvent", R, S, Plain, N, 0),
    f("cudaStreamWaitEvent_ptsz", R, S, Plain, N, 0),
    // Runtime: kernel registration (names host stubs; returns void).
    f("__cudaRegisterFunction", R, O, Register, N, FLAG_NO_RESULT),
    // Driver: launches.
    f("cuLaunchKernel", D, L, LaunchDrv, N, 0),
    f("cuLaunchKernel_ptsz", D, L, LaunchDrv, N, 0),
    f("cuLaunchKernelEx", D, L, LaunchDrvEx, N, 0),
    f("cuLaunchKernelEx_ptsz", D, L, LaunchDrvEx, N, 0),
    f("cuLaunchCooperativeKernel", D, L, LaunchDrv, N, 0),
    f("cuLaunchCooperativeKernel_ptsz", D, L, LaunchDrv, N, 0),
    f("cuGraphLaunch", D, L, Plain, N, 0),
    f("cuGraphLaunch_ptsz", D, L, Plain, N, 0),
    // Driver: copies.
    f("cuMemcpy", D, C, CopyBytes3, DIR_DEFAULT, 0),
    f("cuMemcpyAsync", D, C, CopyBytes3, DIR_DEFAULT, A),
    f("cuMemcpyHtoD_v2", D, C, CopyBytes3, DIR_H2D, 0),
    f("cuMemcpyDtoH_v2", D, C, CopyBytes3, DIR_D2H, 0),
    f("cuMemcpyDtoD_v2", D, C, CopyBytes3, DIR_D2D, 0),
    f("cuMemcpyHtoDAsync_v2", D, C, CopyBytes3, DIR_H2D, A),
    f("cuMemcpyDtoHAsync_v2", D, C, CopyBytes3, DIR_D2H, A),
    f("cuMemcpyDtoDAsync_v2", D, C, CopyBytes3, DIR_D2D, A),
    f("cuMemcpyHtoD_v2_ptds", D, C, CopyBytes3, DIR_H2D, 0),
    f("cuMemcpyDtoH_v2_ptds", D, C, CopyBytes3, DIR_D2H, 0),
    f("cuMemcpyHtoDAsync_v2_ptsz", D, C, CopyBytes3, DIR_H2D, A),
    f("cuMemcpyDtoHAsync_v2_ptsz", D, C, CopyBytes3, DIR_D2H, A),
    f("cuMemcpyPeer", D, C, CopyBytes5, DIR_D2D, 0),
    f("cuMemcpyPeerAsync", D, C, CopyBytes5, DIR_D2D, A),
    f("cuMemcpy2D_v2", D, C, Plain, N, 0),
    f("cuMemcpy2DAsync_v2", D, C, Plain, N, A),
    f("cuMemcpy3D_v2", D, C, Plain, N, 0),
    f("cuMemcpy3DAsync_v2", D, C, Plain, N, A),
    f("cuMemsetD8_v2", D, C, Plain, N, 0),
    f("cuMemsetD32_v2", D, C, Plain, N, 0),
    f("cuMemsetD8Async", D, C, Plain, N, A),
    f("cuMemsetD32Async", D, C, Plain, N, A),
    // Driver: memory.
    f("cuMemAlloc_v2", D, M, AllocOut, N, 0),
    f("cuMemAllocAsync", D, M, AllocOut, N, 0),
    f("cuMemAllocHost_v2", D, M, AllocOut, N, 0),
    f("cuMemAllocManaged", D, M, AllocOut, N, 0),
    f("cuMemAllocPitch_v2", D, M, AllocPitch, N, 0),
    f("cuMemFree_v2", D, M, Free, N, 0),
    f("cuMemFreeAsync", D, M, Free, N, 0),
    f("cuMemFreeHost", D, M, Free, N, 0),
    // Driver: synchronisation.
    f("cuCtxSynchronize", D, S, Plain, N, 0),
    f("cuStreamSynchronize", D, S, Plain, N, 0),
    f("cuStreamSynchronize_ptsz", D, S, Plain, N, 0),
    f("cuEventSynchronize", D, S, Plain, N, 0),
    f("cuStreamWaitEvent", D, S, Plain, N, 0),
    // Driver: modules and kernel names.
    f("cuModuleGetFunction", D, O, NameOut, N, 0),
    f("cuLibraryGetKernel", D, O, NameOut, N, 0),
    f("cuKernelGetFunction", D, O, AliasOut, N, 0),
    f("cuModuleLoad", D, O, Plain, N, 0),
    f("cuModuleLoadData", D, O, Plain, N, 0),
    f("cuModuleLoadDataEx", D, O, Plain, N, 0),
    f("cuModuleLoadFatBinary", D, O, Plain, N, 0),
    f("cuLibraryLoadData", D, O, Plain, N, 0),
];

pub fn func(fid: u32) -> Option<&'static Func> {
    FUNCS.get(fid as usize)
}

/// The probed function called `name`, as reports and libraries' lists name them.
pub fn by_name(name: &str) -> Option<&'static Func> {
    FUNCS.iter().find(|f| f.name == name)
}

pub fn cookie(fid: usize) -> u64 {
    let f = &FUNCS[fid];
    Cookie {
        fid: fid as u16,
        shape: f.shape as u8,
        category: f.category as u8,
        dir: f.dir,
        flags: f.flags,
    }
    .pack()
}

/// Ids of one layer's functions.
pub fn of_layer(layer: Layer) -> impl Iterator<Item = usize> {
    FUNCS
        .iter()
        .enumerate()
        .filter(move |(_, f)| f.layer == layer)
        .map(|(i, _)| i)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pinned_host_memory_is_told_apart() {
        for n in [
            "cudaMallocHost",
            "cudaHostAlloc",
            "cudaFreeHost",
            "cuMemAllocHost_v2",
        ] {
            assert!(by_name(n).unwrap().is_host_memory(), "{n}");
        }
        for n in [
            "cudaMalloc",
            "cudaFree",
            "cudaMallocManaged",
            "cuMemAlloc_v2",
        ] {
            assert!(!by_name(n).unwrap().is_host_memory(), "{n}");
        }
    }

    #[test]
    fn names_are_unique_and_ids_fit() {
        let mut names: Vec<&str> = FUNCS.iter().map(|f| f.name).collect();
        names.sort_unstable();
        let before = names.len();
        names.dedup();
        assert_eq!(names.len(), before, "duplicate function in the table");
        assert!(FUNCS.len() < u16::MAX as usize);
        for (i, f) in FUNCS.iter().enumerate() {
            let c = Cookie::unpack(cookie(i));
            assert_eq!(c.fid as usize, i);
            assert_eq!(Shape::from_u8(c.shape), Some(f.shape));
            assert_eq!(
                f.name.starts_with("cu") && !f.name.starts_with("cuda"),
                f.layer == D
            );
        }
    }
}
