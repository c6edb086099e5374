//! The `cuda` prover: the challenge on the leased NVIDIA GPUs through cudarc (dynamic
//! loading). `A` rows, `B` and the VRAM fill are generated on the GPU from the seed (BLAKE3
//! keyed XOF kernels, `kernels.cu`, compiled once with NVRTC), the GEMMs are int8 x int8 ->
//! int32 through cuBLAS (`cublasGemmEx`, tensor cores where the GPU has them), and every row
//! and page is hashed on the GPU: only 32-byte leaves come back to the host.
//!
//! Work is split across the given GPUs: each takes a contiguous run of the rows of all GEMMs
//! (GEMM-major) and a contiguous run of the fill's pages. Rows are computed in batches of at
//! most [`BATCH_BYTES`] of device memory; the fill is allocated whole (that is the proof) and
//! held until the trees are built.
//!
//! Invariant: never panics on a machine without CUDA: the libraries are looked for before any
//! call (cudarc panics otherwise) and everything runs under `catch_unwind` as a second guard.
//! GPUs are selected by NVML UUID (`GPU-...`, as `cuDeviceGetUuid` gives it), never by
//! `CUDA_VISIBLE_DEVICES`.

// cudarc's kernel launches, cuBLAS calls and library probes are `unsafe fn`; each use below
// carries a SAFETY note.
#![allow(unsafe_code)]

use std::collections::HashMap;
use std::ffi::{c_int, c_void};
use std::ops::Range;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::{Arc, Mutex, OnceLock, PoisonError};
use std::time::{Duration, Instant};

use cudarc::cublas::CudaBlas;
use cudarc::cublas::sys::{cublasComputeType_t, cublasGemmAlgo_t, cublasOperation_t, cudaDataType};
use cudarc::driver::sys::CUresult;
use cudarc::driver::{
    CudaContext, CudaFunction, CudaSlice, CudaStream, DevicePtr, DevicePtrMut, DriverError,
    LaunchConfig, PushKernelArg,
};
use cudarc::nvrtc::{CompileOptions, Ptx};
use gridlease_contracts::proof::merkle::Tree;
use gridlease_contracts::proof::params;
use gridlease_protocol::Digest;
use gridlease_protocol::proof::{ProofBackend, ProofChallenge};

use super::{Computed, Prover, ProverError, check_sizes, gemm_trees, note, panic_detail};

/// The kernels' CUDA C source (compiled at run time with NVRTC).
pub const KERNELS: &str = include_str!("kernels.cu");

/// Device memory for one batch of rows (the `A` rows, the `C` rows, the chunk values and the
/// leaves) or of page hashing, besides `B` and the fill.
pub const BATCH_BYTES: u64 = 256 << 20;

/// How long [`Cuda::measure`] computes rows.
pub const MEASURE_FOR: Duration = Duration::from_millis(200);

/// Bytes of a row leaf's message before the row ("gl-proof-v1/row" || gemm || row).
const ROW_PREFIX: u64 = 15 + 4 + 4;
/// Bytes of a page leaf's message before the page ("gl-proof-v1/pageleaf" || page).
const PAGE_PREFIX: u64 = 20 + 8;
/// BLAKE3's chunk.
const CHUNK: u64 = 1024;
/// Threads per block of every kernel launch.
const BLOCK_THREADS: u32 = 256;
/// Most blocks of a launch (the kernels loop over their items with a grid stride).
const MAX_BLOCKS: u64 = 1 << 16;

/// A CUDA device as the driver lists it.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct CudaDevice {
    /// The driver's ordinal (not stable across machines or `CUDA_VISIBLE_DEVICES`).
    pub ordinal: usize,
    /// The UUID as NVML writes it (`GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx`).
    pub uuid: String,
    /// The model name.
    pub name: String,
    /// Total memory, bytes.
    pub total_mem: u64,
}

/// The CUDA prover. Opens a context per GPU on first use and keeps it (with its loaded
/// kernels and cuBLAS handle), so a challenge after [`Prover::measure`] starts at once.
#[derive(Default)]
pub struct Cuda {
    ptx: OnceLock<Result<Ptx, String>>,
    open: Mutex<HashMap<usize, Arc<Mutex<Device>>>>,
}

impl std::fmt::Debug for Cuda {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Cuda").finish_non_exhaustive()
    }
}

/// Checks that the CUDA driver, cuBLAS and NVRTC libraries can be loaded.
pub fn check_libraries() -> Result<(), ProverError> {
    let missing = |detail: &str| ProverError::CudaUnavailable {
        detail: detail.to_string(),
    };
    // SAFETY: each `is_culib_present` only tries to dlopen a library by name and reports
    // whether that worked; nothing is called in it.
    if !unsafe { cudarc::driver::sys::is_culib_present() } {
        return Err(missing(
            "the CUDA driver library (libcuda.so) was not found",
        ));
    }
    // SAFETY: as above, for libcublas.
    if !unsafe { cudarc::cublas::sys::is_culib_present() } {
        return Err(missing("the cuBLAS library (libcublas.so) was not found"));
    }
    // SAFETY: as above, for libnvrtc.
    if !unsafe { cudarc::nvrtc::sys::is_culib_present() } {
        return Err(missing("the NVRTC library (libnvrtc.so) was not found"));
    }
    Ok(())
}

/// `f` under `catch_unwind`: a panic in cudarc (a missing symbol in an old driver) becomes
/// [`ProverError::Panicked`].
fn guarded<T>(f: impl FnOnce() -> Result<T, ProverError>) -> Result<T, ProverError> {
    catch_unwind(AssertUnwindSafe(f)).unwrap_or_else(|p| {
        Err(ProverError::Panicked {
            detail: panic_detail(&*p),
        })
    })
}

/// The UUID's text as NVML writes it.
pub fn uuid_text(bytes: &[u8; 16]) -> String {
    let h = |r: Range<usize>| {
        bytes[r]
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect::<String>()
    };
    format!(
        "GPU-{}-{}-{}-{}-{}",
        h(0..4),
        h(4..6),
        h(6..8),
        h(8..10),
        h(10..16)
    )
}

fn no_device(e: DriverError) -> ProverError {
    ProverError::CudaUnavailable {
        detail: format!("the CUDA driver lists no device: {e}"),
    }
}

/// The CUDA devices of this machine, in the driver's order.
pub fn list_devices() -> Result<Vec<CudaDevice>, ProverError> {
    use cudarc::driver::result;
    check_libraries()?;
    guarded(|| {
        result::init().map_err(no_device)?;
        let count = result::device::get_count().map_err(no_device)?;
        let mut out = Vec::new();
        for ordinal in 0..count.max(0) {
            let drv = |op| {
                move |e: DriverError| ProverError::Driver {
                    op,
                    device: format!("device {ordinal}"),
                    detail: e.to_string(),
                }
            };
            let dev = result::device::get(ordinal).map_err(drv("device_get"))?;
            let uuid = result::device::get_uuid(dev).map_err(drv("device_uuid"))?;
            let name = result::device::get_name(dev).map_err(drv("device_name"))?;
            // SAFETY: `dev` is a device handle the driver just returned for this ordinal.
            let total = unsafe { result::device::total_mem(dev) }.map_err(drv("total_mem"))?;
            out.push(CudaDevice {
                ordinal: ordinal as usize,
                uuid: uuid_text(&uuid.bytes.map(|b| b as u8)),
                name,
                total_mem: total as u64,
            });
        }
        Ok(out)
    })
}

/// The listed devices with these UUIDs (case-insensitive), in the order given.
pub fn select(all: &[CudaDevice], uuids: &[String]) -> Result<Vec<CudaDevice>, ProverError> {
    if uuids.is_empty() {
        return Err(ProverError::NoDevices);
    }
    let mut out: Vec<CudaDevice> = Vec::with_capacity(uuids.len());
    for u in uuids {
        let Some(d) = all.iter().find(|d| d.uuid.eq_ignore_ascii_case(u.trim())) else {
            return Err(ProverError::UnknownDevice { uuid: u.clone() });
        };
        if out.iter().any(|o| o.ordinal == d.ordinal) {
            return Err(ProverError::DuplicateDevice { uuid: u.clone() });
        }
        out.push(d.clone());
    }
    Ok(out)
}

/// `total` split in `parts` contiguous runs as even as can be, run `i`.
fn share(total: u64, parts: usize, i: usize) -> Range<u64> {
    let parts = parts.max(1) as u128;
    let at = |k: usize| (u128::from(total) * k as u128 / parts) as u64;
    at(i)..at(i + 1)
}

impl Cuda {
    /// A prover; nothing is loaded until the first call.
    pub fn new() -> Self {
        Self::default()
    }

    fn ptx(&self) -> Result<Ptx, ProverError> {
        self.ptx
            .get_or_init(|| {
                let opts = CompileOptions {
                    name: Some("kernels.cu".into()),
                    ..CompileOptions::default()
                };
                cudarc::nvrtc::compile_ptx_with_opts(KERNELS, opts).map_err(|e| format!("{e:?}"))
            })
            .clone()
            .map_err(|detail| ProverError::Compile { detail })
    }

    /// The open device (its context, kernels and cuBLAS handle), opened on first use.
    fn device(&self, d: &CudaDevice) -> Result<Arc<Mutex<Device>>, ProverError> {
        let mut open = self.open.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(dev) = open.get(&d.ordinal) {
            return Ok(dev.clone());
        }
        let dev = Arc::new(Mutex::new(Device::open(d, self.ptx()?)?));
        open.insert(d.ordinal, dev.clone());
        Ok(dev)
    }

    /// The devices with these UUIDs, open.
    fn devices(&self, uuids: &[String]) -> Result<Vec<Arc<Mutex<Device>>>, ProverError> {
        if uuids.is_empty() {
            return Err(ProverError::NoDevices);
        }
        let all = list_devices()?;
        select(&all, uuids)?
            .iter()
            .map(|d| self.device(d))
            .collect()
    }

    fn compute_guarded(
        &self,
        c: &ProofChallenge,
        uuids: &[String],
    ) -> Result<Computed, ProverError> {
        let start = Instant::now();
        let p = &c.params;
        if uuids.is_empty() {
            return Err(ProverError::NoDevices);
        }
        let all = list_devices()?;
        let chosen = select(&all, uuids)?;
        let vram: u64 = chosen.iter().map(|d| d.total_mem).sum();
        let pages = check_sizes(p, vram)?;
        let devices = chosen
            .iter()
            .map(|d| self.device(d))
            .collect::<Result<Vec<_>, _>>()?;
        let rows_total = u64::from(p.gemms) * u64::from(p.rows);
        let parts = devices.len();
        // One thread per GPU; each returns its rows' leaves, its pages' leaves and its fill,
        // which stays allocated until the trees below are built.
        let results: Vec<Result<DeviceResult, ProverError>> = std::thread::scope(|s| {
            let workers: Vec<_> = devices
                .iter()
                .enumerate()
                .map(|(i, dev)| {
                    let (rows, pages) = (share(rows_total, parts, i), share(pages, parts, i));
                    s.spawn(move || {
                        guarded(|| {
                            let mut dev = dev.lock().unwrap_or_else(PoisonError::into_inner);
                            dev.run(c, rows, pages)
                        })
                    })
                })
                .collect();
            workers
                .into_iter()
                .map(|w| {
                    w.join().unwrap_or_else(|p| {
                        Err(ProverError::Panicked {
                            detail: panic_detail(&*p),
                        })
                    })
                })
                .collect()
        });
        let mut row_leaves = Vec::new();
        let mut page_leaves = Vec::new();
        let mut fills = Vec::new();
        for r in results {
            let r = r?;
            row_leaves.extend(r.rows);
            page_leaves.extend(r.pages);
            fills.push(r.fill);
        }
        if row_leaves.len() as u64 != rows_total || page_leaves.len() as u64 != pages {
            return Err(ProverError::ShortResult {
                got: (row_leaves.len() + page_leaves.len()) as u64,
                want: rows_total + pages,
            });
        }
        let gemm_trees = gemm_trees(row_leaves, p.rows)?;
        let vram_tree = Tree::new(page_leaves);
        drop(fills);
        let names: Vec<&str> = chosen.iter().map(|d| d.name.as_str()).collect();
        Ok(Computed {
            gemm_trees,
            vram_tree,
            vram_bytes: p.vram_bytes,
            work_ms: start.elapsed().as_millis() as u64,
            note: note(format!("cuda: {}", names.join(", "))),
        })
    }

    fn measure_guarded(&self, uuids: &[String]) -> Result<f64, ProverError> {
        let devices = self.devices(uuids)?;
        let rates: Vec<Result<f64, ProverError>> = std::thread::scope(|s| {
            let workers: Vec<_> = devices
                .iter()
                .map(|dev| {
                    s.spawn(move || {
                        guarded(|| dev.lock().unwrap_or_else(PoisonError::into_inner).measure())
                    })
                })
                .collect();
            workers
                .into_iter()
                .map(|w| {
                    w.join().unwrap_or_else(|p| {
                        Err(ProverError::Panicked {
                            detail: panic_detail(&*p),
                        })
                    })
                })
                .collect()
        });
        rates.into_iter().sum()
    }
}

impl Prover for Cuda {
    fn backend(&self) -> ProofBackend {
        ProofBackend::Cuda
    }

    fn compute(&self, c: &ProofChallenge, devices: &[String]) -> Result<Computed, ProverError> {
        check_libraries()?;
        guarded(|| self.compute_guarded(c, devices))
    }

    /// The challenge's per-row work (generate `A` rows, the int8 GEMM, hash the rows) at
    /// `params::N_GPU` on each GPU for about [`MEASURE_FOR`], after a warm-up; the sum over
    /// the GPUs.
    fn measure(&self, devices: &[String]) -> Result<f64, ProverError> {
        check_libraries()?;
        guarded(|| self.measure_guarded(devices))
    }
}

/// The kernels of `kernels.cu`, loaded into one context.
struct Kernels {
    gen_bt: CudaFunction,
    gen_a: CudaFunction,
    row_chunks: CudaFunction,
    merge: CudaFunction,
    gen_pages: CudaFunction,
    page_chunks: CudaFunction,
}

/// One open GPU.
struct Device {
    label: String,
    ctx: Arc<CudaContext>,
    stream: Arc<CudaStream>,
    blas: CudaBlas,
    k: Kernels,
}

/// What one GPU computed: its run of row leaves, its run of page leaves, and its fill (held
/// by the caller until the trees are built).
struct DeviceResult {
    rows: Vec<Digest>,
    pages: Vec<Digest>,
    fill: Option<CudaSlice<u8>>,
}

/// The launch shape for `items` work items.
fn launch_for(items: u64) -> LaunchConfig {
    let blocks = items
        .div_ceil(u64::from(BLOCK_THREADS))
        .clamp(1, MAX_BLOCKS) as u32;
    LaunchConfig {
        grid_dim: (blocks, 1, 1),
        block_dim: (BLOCK_THREADS, 1, 1),
        shared_mem_bytes: 0,
    }
}

/// BLAKE3 chunks of a message of `len` bytes.
fn chunks(len: u64) -> u64 {
    len.div_ceil(CHUNK).max(1)
}

/// Leaves from the kernels' output words (8 little-endian words a leaf).
fn digests(words: &[u32]) -> Vec<Digest> {
    words
        .chunks_exact(8)
        .map(|w| {
            let mut d = [0u8; 32];
            for (out, word) in d.chunks_exact_mut(4).zip(w) {
                out.copy_from_slice(&word.to_le_bytes());
            }
            Digest(d)
        })
        .collect()
}

/// The seed as the kernels take the key: 8 little-endian words.
fn key_words(seed: &[u8; 32]) -> [u32; 8] {
    let mut k = [0u32; 8];
    for (w, b) in k.iter_mut().zip(seed.chunks_exact(4)) {
        *w = u32::from_le_bytes([b[0], b[1], b[2], b[3]]);
    }
    k
}

/// Buffers for batches of up to `batch` rows.
struct RowBatch {
    n: u32,
    batch: u64,
    nchunks: u64,
    bt: CudaSlice<u8>,
    a: CudaSlice<u8>,
    c: CudaSlice<i32>,
    cvs: CudaSlice<u32>,
    leaves: CudaSlice<u32>,
}

impl Device {
    fn open(d: &CudaDevice, ptx: Ptx) -> Result<Self, ProverError> {
        let label = format!("{} ({})", d.name, d.uuid);
        let drv = |op| {
            let device = label.clone();
            move |e: DriverError| ProverError::Driver {
                op,
                device,
                detail: e.to_string(),
            }
        };
        let ctx = CudaContext::new(d.ordinal).map_err(drv("context"))?;
        let stream = ctx.default_stream();
        let blas = CudaBlas::new(stream.clone()).map_err(|e| ProverError::Cublas {
            op: "create",
            device: label.clone(),
            detail: e.to_string(),
        })?;
        let module = ctx.load_module(ptx).map_err(drv("load_module"))?;
        let f = |name| module.load_function(name).map_err(drv("load_function"));
        let k = Kernels {
            gen_bt: f("gen_bt")?,
            gen_a: f("gen_a")?,
            row_chunks: f("row_chunks")?,
            merge: f("merge")?,
            gen_pages: f("gen_pages")?,
            page_chunks: f("page_chunks")?,
        };
        Ok(Self {
            label,
            ctx,
            stream,
            blas,
            k,
        })
    }

    fn drv(&self, op: &'static str) -> impl FnOnce(DriverError) -> ProverError + '_ {
        move |e| ProverError::Driver {
            op,
            device: self.label.clone(),
            detail: e.to_string(),
        }
    }

    /// This GPU's share of a challenge: flattened rows `rows`, fill pages `pages`.
    fn run(
        &mut self,
        c: &ProofChallenge,
        rows: Range<u64>,
        pages: Range<u64>,
    ) -> Result<DeviceResult, ProverError> {
        self.ctx.bind_to_thread().map_err(self.drv("bind"))?;
        let p = &c.params;
        let key = self
            .stream
            .clone_htod(&key_words(&c.seed))
            .map_err(self.drv("copy_key"))?;
        // The GEMMs first, their buffers freed before the fill is allocated.
        let mut row_leaves = Vec::new();
        if !rows.is_empty() {
            let mut batch = self.row_batch(&key, p.n, rows.end - rows.start)?;
            let mut words = vec![0u32; (batch.batch * 8) as usize];
            let mut first = rows.start;
            while first < rows.end {
                let count = (rows.end - first).min(batch.batch);
                self.rows(&mut batch, &key, p.rows, first, count, &mut words)?;
                row_leaves.extend(digests(&words[..(count * 8) as usize]));
                first += count;
            }
        }
        let (page_leaves, fill) = if pages.is_empty() {
            (Vec::new(), None)
        } else {
            let (leaves, fill) = self.fill(&key, p.page_bytes, pages)?;
            (leaves, Some(fill))
        };
        self.stream.synchronize().map_err(self.drv("synchronize"))?;
        self.ctx.check_err().map_err(self.drv("check"))?;
        Ok(DeviceResult {
            rows: row_leaves,
            pages: page_leaves,
            fill,
        })
    }

    /// `B` (transposed) and buffers for batches of rows: as many rows as [`BATCH_BYTES`]
    /// holds, at most `rows`.
    fn row_batch(&self, key: &CudaSlice<u32>, n: u32, rows: u64) -> Result<RowBatch, ProverError> {
        let n64 = u64::from(n);
        let nchunks = chunks(ROW_PREFIX + 4 * n64);
        let per_row = n64 + 4 * n64 + nchunks * 32 + 32;
        let batch = (BATCH_BYTES / per_row).clamp(1, rows.max(1));
        let s = &self.stream;
        let mut bt = s
            .alloc_zeros::<u8>((n64 * n64) as usize)
            .map_err(self.drv("alloc_b"))?;
        let items = n64 * n64 / 64;
        // SAFETY: gen_bt(u8* bt, const u32* key, u32 n, u64 items) writes bytes j*n + k of bt
        // for k, j < n: inside its n*n bytes; key holds 8 words; the argument types match the
        // kernel's parameters.
        unsafe {
            s.launch_builder(&self.k.gen_bt)
                .arg(&mut bt)
                .arg(key)
                .arg(&n)
                .arg(&items)
                .launch(launch_for(items))
        }
        .map_err(self.drv("gen_bt"))?;
        Ok(RowBatch {
            n,
            batch,
            nchunks,
            bt,
            a: s.alloc_zeros::<u8>((batch * n64) as usize)
                .map_err(self.drv("alloc_a"))?,
            c: s.alloc_zeros::<i32>((batch * n64) as usize)
                .map_err(self.drv("alloc_c"))?,
            cvs: s
                .alloc_zeros::<u32>((batch * nchunks * 8) as usize)
                .map_err(self.drv("alloc_cvs"))?,
            leaves: s
                .alloc_zeros::<u32>((batch * 8) as usize)
                .map_err(self.drv("alloc_leaves"))?,
        })
    }

    /// Rows `first .. first + count` of the flattened row space (`rows_per_gemm` a GEMM):
    /// generate them, multiply by `B`, hash them; their leaves' words into `out`.
    fn rows(
        &self,
        b: &mut RowBatch,
        key: &CudaSlice<u32>,
        rows_per_gemm: u32,
        first: u64,
        count: u64,
        out: &mut [u32],
    ) -> Result<(), ProverError> {
        let s = &self.stream;
        let n = b.n;
        let n64 = u64::from(n);
        let bad = || ProverError::ShortResult {
            got: b.batch,
            want: count,
        };
        let ni = c_int::try_from(n).map_err(|_| bad())?;
        let count_i = c_int::try_from(count).map_err(|_| bad())?;
        if count > b.batch || out.len() < (count * 8) as usize {
            return Err(bad());
        }
        let items = count * n64 / 64;
        // SAFETY: gen_a(u8* a, const u32* key, u32 n, u32 rows, u64 first, u64 items) writes
        // rows 0..count of a (count*n bytes <= batch*n); the argument types match.
        unsafe {
            s.launch_builder(&self.k.gen_a)
                .arg(&mut b.a)
                .arg(key)
                .arg(&n)
                .arg(&rows_per_gemm)
                .arg(&first)
                .arg(&items)
                .launch(launch_for(items))
        }
        .map_err(self.drv("gen_a"))?;
        {
            // C (count x n, row-major) = A B, as cuBLAS's column-major "TN" product:
            // C^T (n x count) = op(Bt)^T ... with Bt (B transposed, row-major) read as a
            // column-major k x m matrix and transposed, A read as column-major k x count.
            let (bt, _rb) = b.bt.device_ptr(s);
            let (a, _ra) = b.a.device_ptr(s);
            let (cm, _rc) = b.c.device_ptr_mut(s);
            let (alpha, beta) = (1i32, 0i32);
            // SAFETY: bt is n*n int8, a holds count*n int8, c holds count*n int32 (count <=
            // batch); m = n, n = count, k = n with lda = ldb = ldc = n match those sizes;
            // alpha and beta are host int32 scalars (the handle's pointer mode is host), as
            // CUBLAS_COMPUTE_32I asks; the handle runs on this stream, which the pointer
            // guards above order against.
            unsafe {
                cudarc::cublas::result::gemm_ex(
                    *self.blas.handle(),
                    cublasOperation_t::CUBLAS_OP_T,
                    cublasOperation_t::CUBLAS_OP_N,
                    ni,
                    count_i,
                    ni,
                    (&alpha as *const i32).cast::<c_void>(),
                    bt as *const c_void,
                    cudaDataType::CUDA_R_8I,
                    ni,
                    a as *const c_void,
                    cudaDataType::CUDA_R_8I,
                    ni,
                    (&beta as *const i32).cast::<c_void>(),
                    cm as *mut c_void,
                    cudaDataType::CUDA_R_32I,
                    ni,
                    cublasComputeType_t::CUBLAS_COMPUTE_32I,
                    cublasGemmAlgo_t::CUBLAS_GEMM_DEFAULT,
                )
            }
            .map_err(|e| ProverError::Cublas {
                op: "gemm_ex (int8)",
                device: self.label.clone(),
                detail: e.to_string(),
            })?;
        }
        let items = count * b.nchunks;
        // SAFETY: row_chunks(const i32* c, u32 n, u32 rows, u64 first, u64 nchunks, u32* cvs,
        // u64 items) reads rows 0..count of c and writes count*nchunks*8 words of cvs (its
        // size for batch rows); the argument types match.
        unsafe {
            s.launch_builder(&self.k.row_chunks)
                .arg(&b.c)
                .arg(&n)
                .arg(&rows_per_gemm)
                .arg(&first)
                .arg(&b.nchunks)
                .arg(&mut b.cvs)
                .arg(&items)
                .launch(launch_for(items))
        }
        .map_err(self.drv("row_chunks"))?;
        self.merge(&b.cvs, b.nchunks, &mut b.leaves, count)?;
        let view = b
            .leaves
            .try_slice(0..(count * 8) as usize)
            .ok_or_else(bad)?;
        s.memcpy_dtoh(&view, &mut out[..(count * 8) as usize])
            .map_err(self.drv("copy_leaves"))
    }

    /// Hashes `count` messages' chunk values (`nchunks` each) in `cvs` into `leaves`.
    fn merge(
        &self,
        cvs: &CudaSlice<u32>,
        nchunks: u64,
        leaves: &mut CudaSlice<u32>,
        count: u64,
    ) -> Result<(), ProverError> {
        if (cvs.len() as u64) < count * nchunks * 8 || (leaves.len() as u64) < count * 8 {
            return Err(ProverError::ShortResult {
                got: leaves.len() as u64 / 8,
                want: count,
            });
        }
        // SAFETY: merge(const u32* cvs, u64 nchunks, u32* leaves, u64 items) reads
        // count*nchunks*8 words of cvs and writes count*8 words of leaves, both checked above;
        // the argument types match.
        unsafe {
            self.stream
                .launch_builder(&self.k.merge)
                .arg(cvs)
                .arg(&nchunks)
                .arg(leaves)
                .arg(&count)
                .launch(launch_for(count))
        }
        .map_err(self.drv("merge"))?;
        Ok(())
    }

    /// The fill's pages `pages` (global indices) on this GPU: allocated whole, generated in
    /// place, hashed in batches. Returns the leaves and the fill (still allocated).
    fn fill(
        &self,
        key: &CudaSlice<u32>,
        page_bytes: u32,
        pages: Range<u64>,
    ) -> Result<(Vec<Digest>, CudaSlice<u8>), ProverError> {
        let s = &self.stream;
        let count = pages.end - pages.start;
        let asked = count * u64::from(page_bytes);
        // The hashing buffers first: the fill takes what is left.
        let nchunks = chunks(PAGE_PREFIX + u64::from(page_bytes));
        let batch = (BATCH_BYTES / (nchunks * 32 + 32)).clamp(1, count);
        let mut cvs = s
            .alloc_zeros::<u32>((batch * nchunks * 8) as usize)
            .map_err(self.drv("alloc_cvs"))?;
        let mut leaves = s
            .alloc_zeros::<u32>((batch * 8) as usize)
            .map_err(self.drv("alloc_leaves"))?;
        // Freed buffers (the GEMMs') go back to the driver at a synchronisation.
        s.synchronize().map_err(self.drv("synchronize"))?;
        let (free, _) = self.ctx.mem_get_info().map_err(self.drv("mem_get_info"))?;
        let free = free as u64;
        let short = || ProverError::VramAlloc {
            asked,
            free,
            device: self.label.clone(),
        };
        if asked > free {
            return Err(short());
        }
        let mut fill = s.alloc_zeros::<u8>(asked as usize).map_err(|e| {
            if e.0 == CUresult::CUDA_ERROR_OUT_OF_MEMORY {
                short()
            } else {
                self.drv("alloc_fill")(e)
            }
        })?;
        let page0 = pages.start;
        let items = asked / 64;
        // SAFETY: gen_pages(u8* fill, const u32* key, u32 page_bytes, u64 page0, u64 items)
        // writes items*64 = asked bytes of fill, its size; the argument types match.
        unsafe {
            s.launch_builder(&self.k.gen_pages)
                .arg(&mut fill)
                .arg(key)
                .arg(&page_bytes)
                .arg(&page0)
                .arg(&items)
                .launch(launch_for(items))
        }
        .map_err(self.drv("gen_pages"))?;
        let mut words = vec![0u32; (batch * 8) as usize];
        let mut out = Vec::with_capacity(count as usize);
        let mut first = 0u64;
        while first < count {
            let run = (count - first).min(batch);
            let items = run * nchunks;
            // SAFETY: page_chunks(const u8* fill, u32 page_bytes, u64 page0, u64 first,
            // u64 nchunks, u32* cvs, u64 items) reads pages first..first+run of fill (within
            // its count pages) and writes run*nchunks*8 words of cvs (run <= batch); the
            // argument types match.
            unsafe {
                s.launch_builder(&self.k.page_chunks)
                    .arg(&fill)
                    .arg(&page_bytes)
                    .arg(&page0)
                    .arg(&first)
                    .arg(&nchunks)
                    .arg(&mut cvs)
                    .arg(&items)
                    .launch(launch_for(items))
            }
            .map_err(self.drv("page_chunks"))?;
            self.merge(&cvs, nchunks, &mut leaves, run)?;
            let view = leaves
                .try_slice(0..(run * 8) as usize)
                .ok_or(ProverError::ShortResult {
                    got: batch,
                    want: run,
                })?;
            s.memcpy_dtoh(&view, &mut words[..(run * 8) as usize])
                .map_err(self.drv("copy_leaves"))?;
            out.extend(digests(&words[..(run * 8) as usize]));
            first += run;
        }
        Ok((out, fill))
    }

    /// Rows a second this GPU computes (generate, multiply, hash) at `params::N_GPU`, times
    /// n^2: multiply-accumulates a second.
    fn measure(&mut self) -> Result<f64, ProverError> {
        self.ctx.bind_to_thread().map_err(self.drv("bind"))?;
        let n = params::N_GPU;
        let key = self
            .stream
            .clone_htod(&key_words(&[0x5a; 32]))
            .map_err(self.drv("copy_key"))?;
        let mut batch = self.row_batch(&key, n, 8192)?;
        let count = batch.batch;
        let mut words = vec![0u32; (count * 8) as usize];
        // Warm-up: the first GEMM picks its kernel, the first launches load the module.
        self.rows(&mut batch, &key, u32::MAX, 0, count, &mut words)?;
        let start = Instant::now();
        let mut done = 0u64;
        while start.elapsed() < MEASURE_FOR && done < 64 * count {
            self.rows(&mut batch, &key, u32::MAX, done, count, &mut words)?;
            done += count;
        }
        self.stream.synchronize().map_err(self.drv("synchronize"))?;
        let secs = start.elapsed().as_secs_f64().max(1e-9);
        Ok(done as f64 * f64::from(n) * f64::from(n) / secs)
    }
}

#[cfg(test)]
mod tests;
