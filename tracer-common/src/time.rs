//! Wall-time categories. Every nanosecond of a traced thread's life in the window is charged to
//! exactly one of these. The ids are shared by the kernel side (which accumulates time per
//! category) and user space (which names them); adding a category is one entry here plus its
//! name, and one rule in the classifier.

/// Category ids. CUDA categories take precedence while a thread is inside a CUDA call.
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Category {
    Cpu = 0,
    Runqueue = 1,
    Io = 2,
    Net = 3,
    Ipc = 4,
    Lock = 5,
    Gil = 6,
    Sleep = 7,
    Poll = 8,
    Other = 9,
    CudaLaunch = 10,
    CudaMemcpy = 11,
    CudaSync = 12,
    CudaMalloc = 13,
    CudaOther = 14,
}

impl Category {
    pub const COUNT: usize = 15;

    pub const ALL: [Category; Category::COUNT] = [
        Category::Cpu,
        Category::Runqueue,
        Category::Io,
        Category::Net,
        Category::Ipc,
        Category::Lock,
        Category::Gil,
        Category::Sleep,
        Category::Poll,
        Category::Other,
        Category::CudaLaunch,
        Category::CudaMemcpy,
        Category::CudaSync,
        Category::CudaMalloc,
        Category::CudaOther,
    ];

    pub fn from_u32(v: u32) -> Option<Category> {
        Category::ALL.get(v as usize).copied()
    }

    /// The name used in reports (`report.json`, terminal, flame graphs).
    pub fn name(self) -> &'static str {
        match self {
            Category::Cpu => "cpu",
            Category::Runqueue => "runqueue",
            Category::Io => "io",
            Category::Net => "net",
            Category::Ipc => "ipc",
            Category::Lock => "lock",
            Category::Gil => "gil",
            Category::Sleep => "sleep",
            Category::Poll => "poll",
            Category::Other => "other",
            Category::CudaLaunch => "cuda_launch",
            Category::CudaMemcpy => "cuda_memcpy",
            Category::CudaSync => "cuda_sync",
            Category::CudaMalloc => "cuda_malloc",
            Category::CudaOther => "cuda_other",
        }
    }

    pub fn is_cuda(self) -> bool {
        (self as u32) >= (Category::CudaLaunch as u32)
    }
}

/// "No CUDA call in progress" in the per-thread override slot.
pub const NO_OVERRIDE: u32 = u32::MAX;
