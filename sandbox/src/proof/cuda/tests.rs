//! The CUDA prover without a GPU: its kernels compiled as C++ on the host and held to the
//! blake3 crate (on the official test vectors' inputs) and to `contracts::proof::data`; the
//! device selection; no panic without CUDA. With a GPU (`--ignored`): the CUDA prover's trees
//! against the CPU reference's.

use std::path::{Path, PathBuf};
use std::process::Command;

use gridlease_contracts::proof::data;
use gridlease_protocol::Digest;
use gridlease_protocol::proof::{ProofBackend, ProofChallenge, ProofParams};

use super::*;
use crate::proof::CpuReference;

/// The harness (`kernels_host_test.cpp` including `kernels.cu`) built with the host's C++
/// compiler, or `None` (and a note) where there is none.
fn harness(dir: &Path) -> Option<PathBuf> {
    std::fs::write(dir.join("kernels.cu"), KERNELS).unwrap();
    std::fs::write(
        dir.join("kernels_host_test.cpp"),
        include_str!("../kernels_host_test.cpp"),
    )
    .unwrap();
    let bin = dir.join("kernels_host_test");
    for cxx in ["c++", "g++", "clang++"] {
        let out = Command::new(cxx)
            .args([
                "-std=c++11",
                "-O2",
                "-Wall",
                "-Wextra",
                "-Werror",
                "-fno-strict-aliasing",
                "-o",
            ])
            .arg(&bin)
            .arg(dir.join("kernels_host_test.cpp"))
            .output();
        match out {
            Ok(o) if o.status.success() => return Some(bin),
            Ok(o) => panic!(
                "{cxx} did not compile the kernels: {}",
                String::from_utf8_lossy(&o.stderr)
            ),
            Err(_) => continue,
        }
    }
    eprintln!("no C++ compiler (c++, g++, clang++): the kernels' host test is skipped");
    None
}

fn run(bin: &Path, args: &[String]) -> String {
    let out = Command::new(bin).args(args).output().unwrap();
    assert!(out.status.success(), "{args:?}: {out:?}");
    String::from_utf8(out.stdout).unwrap()
}

fn unhex(s: &str) -> Vec<u8> {
    (0..s.len() / 2)
        .map(|i| u8::from_str_radix(&s[2 * i..2 * i + 2], 16).unwrap())
        .collect()
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

/// The official test vectors' key.
const TEST_KEY: &[u8; 32] = b"whats the Elvish word for friend";
/// The official test vectors' input lengths.
const TEST_LENGTHS: &[u64] = &[
    0, 1, 2, 3, 4, 5, 6, 7, 8, 63, 64, 65, 127, 128, 129, 1023, 1024, 1025, 2048, 2049, 3072, 3073,
    4096, 4097, 5120, 5121, 6144, 6145, 7168, 7169, 8192, 8193, 16384, 31744, 102400,
];

#[test]
fn the_kernels_blake3_reproduces_the_official_test_vectors() {
    let dir = tempfile::tempdir().unwrap();
    let Some(bin) = harness(dir.path()) else {
        return;
    };
    // The official vector for the empty input, verbatim.
    assert_eq!(
        run(&bin, &["hash".into(), "-".into(), "0".into(), "0".into()]).trim(),
        "hash af1349b9f5f9a1a6a0404dea36dcc9499bcb25c9adc112b7cc9a93cae41f3262"
    );
    // Every official input (byte i = i % 251), unkeyed and keyed with the official key,
    // against the blake3 crate (which its own CI holds to the official vectors); with the
    // first bytes as the message prefix and the rest as data at every alignment.
    for &len in TEST_LENGTHS {
        let input: Vec<u8> = (0..len).map(|i| (i % 251) as u8).collect();
        let unkeyed = hex(blake3::hash(&input).as_bytes());
        let keyed = hex(blake3::keyed_hash(TEST_KEY, &input).as_bytes());
        for prefix in [0u64, 1, 2, 3, 5, 23, 28, 32] {
            if prefix > len {
                continue;
            }
            for (key, want) in [("-".to_string(), &unkeyed), (hex(TEST_KEY), &keyed)] {
                let args = [
                    "hash".to_string(),
                    key.clone(),
                    len.to_string(),
                    prefix.to_string(),
                ];
                let got = run(&bin, &args);
                assert_eq!(
                    got.trim(),
                    format!("hash {want}"),
                    "len {len}, prefix {prefix}, key {key}"
                );
            }
        }
    }
}

/// The harness's whole challenge against `contracts::proof::data`, every byte and leaf.
fn check_challenge(
    bin: &Path,
    seed: [u8; 32],
    p: &ProofParams,
    row_batch: u64,
    split: u64,
    page_batch: u64,
) {
    let pages = p.vram_bytes / u64::from(p.page_bytes);
    let args: Vec<String> = [
        "challenge".to_string(),
        hex(&seed),
        p.n.to_string(),
        p.gemms.to_string(),
        p.rows.to_string(),
        p.page_bytes.to_string(),
        pages.to_string(),
        row_batch.to_string(),
        split.to_string(),
        page_batch.to_string(),
    ]
    .into();
    let out = run(bin, &args);
    let n = p.n as usize;
    let b = data::b_matrix(&seed, p.n);
    let (mut rows_seen, mut leaves_seen, mut pages_seen) = (0u64, 0u64, 0u64);
    let mut a = vec![0i8; n];
    for line in out.lines() {
        let parts: Vec<&str> = line.split(' ').collect();
        match parts.as_slice() {
            ["bt", h] => {
                let bt = unhex(h);
                for k in 0..n {
                    for j in 0..n {
                        assert_eq!(bt[j * n + k] as i8, b[k * n + j], "B[{k}][{j}]");
                    }
                }
            }
            ["a", i, h] => {
                let i: u32 = i.parse().unwrap();
                data::a_row(&seed, p.n, i / p.rows, i % p.rows, &mut a);
                let want: Vec<u8> = a.iter().map(|&x| x as u8).collect();
                assert_eq!(unhex(h), want, "row {i} of A");
                rows_seen += 1;
            }
            ["leaf", i, h] => {
                let i: u32 = i.parse().unwrap();
                let want = data::true_row_leaf(&seed, p.n, &b, i / p.rows, i % p.rows);
                assert_eq!(
                    Digest(unhex(h).try_into().unwrap()),
                    want,
                    "leaf of row {i}"
                );
                leaves_seen += 1;
            }
            ["page0", h] => {
                let mut want = vec![0u8; p.page_bytes as usize];
                data::page(&seed, p.page_bytes, 0, &mut want);
                assert_eq!(unhex(h), want, "page 0");
            }
            ["pageleaf", pg, h] => {
                let pg: u64 = pg.parse().unwrap();
                let want = data::true_page_leaf(&seed, p.page_bytes, pg);
                assert_eq!(
                    Digest(unhex(h).try_into().unwrap()),
                    want,
                    "leaf of page {pg}"
                );
                pages_seen += 1;
            }
            other => panic!("unexpected line {other:?}"),
        }
    }
    let rows = u64::from(p.gemms) * u64::from(p.rows);
    assert_eq!((rows_seen, leaves_seen, pages_seen), (rows, rows, pages));
}

#[test]
fn the_kernels_give_the_contracts_bytes_and_leaves() {
    let dir = tempfile::tempdir().unwrap();
    let Some(bin) = harness(dir.path()) else {
        return;
    };
    let p = |n, gemms, rows, page_bytes: u32, pages: u64| ProofParams {
        n,
        gemms,
        rows,
        open_rows: 1,
        vram_bytes: pages * u64::from(page_bytes),
        page_bytes,
        open_pages: 1,
        limit_ms: 0,
    };
    // n = 64: one chunk a row leaf (a root chunk); 256 and 320: two, the last short;
    // 1024: five (the stack merges); pages of 4 KiB (5 chunks) and 20 KiB (21).
    check_challenge(&bin, [1; 32], &p(64, 2, 5, 4096, 6), 3, 2, 4);
    check_challenge(&bin, [2; 32], &p(256, 3, 4, 8192, 5), 5, 0, 2);
    check_challenge(&bin, [3; 32], &p(320, 1, 3, 20480, 3), 1, 3, 1);
    check_challenge(&bin, [4; 32], &p(1024, 2, 2, 4096, 4), 3, 1, 3);
}

/// The kernels' entry points and their parameters' widths in bits (pointers are 64), in the
/// order `cuda.rs` pushes its launch arguments.
const ENTRIES: &[(&str, &[u32])] = &[
    ("gen_bt", &[64, 64, 32, 64]),
    ("gen_a", &[64, 64, 32, 32, 64, 64]),
    ("row_chunks", &[64, 32, 32, 64, 64, 64, 64]),
    ("merge", &[64, 64, 64, 64]),
    ("gen_pages", &[64, 64, 32, 64, 64]),
    ("page_chunks", &[64, 32, 64, 64, 64, 64, 64]),
];

#[test]
fn the_kernels_compile_as_cuda_device_code_where_clang_is_installed() {
    // NVRTC needs a CUDA install; clang's CUDA front end does not (-nocudainc, with the
    // qualifiers NVRTC predefines defined here). This compiles the __global__ wrappers the
    // host harness leaves out, to PTX for sm_80, and checks the entry points' parameters.
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("kernels.cu"), KERNELS).unwrap();
    let ptx = dir.path().join("kernels.ptx");
    let clangs = [
        "clang", "clang-19", "clang-18", "clang-17", "clang-16", "clang-15", "clang-14",
    ];
    let Some(out) = clangs.iter().find_map(|cc| {
        Command::new(cc)
            .args([
                "-x",
                "cuda",
                "--cuda-device-only",
                "--cuda-gpu-arch=sm_80",
                "-nocudainc",
            ])
            .args([
                "-nocudalib",
                "-include",
                "__clang_cuda_builtin_vars.h",
                "-D__CUDACC__",
            ])
            .args([
                "-D__device__=__attribute__((device))",
                "-D__global__=__attribute__((global))",
                "-D__forceinline__=__inline__ __attribute__((always_inline))",
            ])
            .args(["-Wall", "-Wextra", "-Werror", "-O2", "-S", "-o"])
            .arg(&ptx)
            .arg(dir.path().join("kernels.cu"))
            .output()
            .ok()
    }) else {
        eprintln!("no clang: the kernels' CUDA compile check is skipped");
        return;
    };
    assert!(
        out.status.success(),
        "clang did not compile the kernels: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = std::fs::read_to_string(&ptx).unwrap();
    for (name, widths) in ENTRIES {
        let at = text
            .find(&format!(".entry {name}("))
            .unwrap_or_else(|| panic!("no entry {name}"));
        let params = &text[at..at + text[at..].find(')').unwrap()];
        let got: Vec<u32> = params
            .lines()
            .filter_map(|l| l.trim().strip_prefix(".param .u"))
            .map(|l| l[..2].parse().unwrap())
            .collect();
        assert_eq!(&got, widths, "{name}");
    }
}

#[test]
fn uuids_are_written_as_nvml_writes_them() {
    let bytes: [u8; 16] = std::array::from_fn(|i| (i as u8) * 17);
    assert_eq!(
        uuid_text(&bytes),
        "GPU-00112233-4455-6677-8899-aabbccddeeff"
    );
}

#[test]
fn devices_are_selected_by_uuid_and_named_once() {
    let dev = |ordinal: usize, uuid: &str| CudaDevice {
        ordinal,
        uuid: uuid.into(),
        name: "NVIDIA H100 80GB HBM3".into(),
        total_mem: 80 << 30,
    };
    let all = [dev(0, "GPU-aaaa"), dev(1, "GPU-bbbb")];
    let got = select(&all, &["gpu-BBBB".into(), "GPU-aaaa".into()]).unwrap();
    assert_eq!(got.iter().map(|d| d.ordinal).collect::<Vec<_>>(), [1, 0]);
    assert!(matches!(select(&all, &[]), Err(ProverError::NoDevices)));
    assert!(matches!(
        select(&all, &["GPU-cccc".into()]),
        Err(ProverError::UnknownDevice { .. })
    ));
    assert!(matches!(
        select(&all, &["GPU-aaaa".into(), "GPU-AAAA".into()]),
        Err(ProverError::DuplicateDevice { .. })
    ));
}

#[test]
fn work_is_shared_in_contiguous_even_runs() {
    for (total, parts) in [(10u64, 3usize), (7, 7), (2, 5), (0, 2), (1 << 40, 8)] {
        let runs: Vec<_> = (0..parts).map(|i| share(total, parts, i)).collect();
        assert_eq!(runs[0].start, 0);
        assert_eq!(runs[parts - 1].end, total);
        for w in runs.windows(2) {
            assert_eq!(w[0].end, w[1].start);
        }
        let (lo, hi) = runs.iter().fold((u64::MAX, 0), |(lo, hi), r| {
            (lo.min(r.end - r.start), hi.max(r.end - r.start))
        });
        assert!(hi - lo <= 1, "{runs:?}");
    }
}

fn challenge(p: ProofParams, seed: [u8; 32]) -> ProofChallenge {
    ProofChallenge {
        lease_id: gridlease_protocol::LeaseId(Digest([9; 32])),
        params: p,
        backend: ProofBackend::Cuda,
        seed,
        reveal_hash: Digest::default(),
        sent_at: gridlease_protocol::Timestamp(0),
    }
}

#[test]
fn without_cuda_the_prover_answers_an_error_not_a_panic() {
    if check_libraries().is_ok() {
        return; // A CUDA machine: the ignored test below is the one to run.
    }
    let c = challenge(crate::proof::tests::small_params(), [1; 32]);
    let cuda = Cuda::new();
    let uuids = ["GPU-00000000-0000-0000-0000-000000000000".to_string()];
    assert!(matches!(
        cuda.compute(&c, &uuids),
        Err(ProverError::CudaUnavailable { .. })
    ));
    assert!(matches!(
        cuda.measure(&uuids),
        Err(ProverError::CudaUnavailable { .. })
    ));
    assert!(matches!(
        list_devices(),
        Err(ProverError::CudaUnavailable { .. })
    ));
}

/// On a GPU machine: `cargo test -p gridlease-sandbox --lib -- --ignored proof::cuda`.
#[test]
#[ignore = "needs an NVIDIA GPU with CUDA 12 (libcuda, libcublas, libnvrtc)"]
fn on_a_gpu_the_cuda_prover_gives_the_cpu_references_trees() {
    let all = list_devices().unwrap();
    assert!(!all.is_empty(), "no CUDA device");
    let cuda = Cuda::new();
    let cpu = CpuReference::all_cores();
    let one = vec![all[0].uuid.clone()];
    let every: Vec<String> = all.iter().map(|d| d.uuid.clone()).collect();
    let sizes = [
        // Row leaves of one chunk, a batch smaller than the rows, pages of 4 KiB.
        (64u32, 3u32, 50u32, 4096u32, 40u64),
        // Two chunks a row, pages of 1 MiB (1025 chunks).
        (256, 4, 300, 1 << 20, 8),
        // The GPU size: five GEMMs of 70 rows at n = 4096, pages of 1 MiB.
        (4096, 5, 70, 1 << 20, 16),
    ];
    for (n, gemms, rows, page_bytes, pages) in sizes {
        let p = ProofParams {
            n,
            gemms,
            rows,
            open_rows: 1,
            vram_bytes: pages * u64::from(page_bytes),
            page_bytes,
            open_pages: 1,
            limit_ms: 60_000,
        };
        let c = challenge(p, [n as u8; 32]);
        let want = cpu.compute(&c, &[]).unwrap();
        for uuids in [&one, &every] {
            let got = cuda.compute(&c, uuids).unwrap();
            let roots =
                |x: &Computed| -> Vec<Digest> { x.gemm_trees.iter().map(|t| t.root()).collect() };
            assert_eq!(roots(&got), roots(&want), "GEMM roots, n = {n}, {uuids:?}");
            assert_eq!(
                got.vram_tree.root(),
                want.vram_tree.root(),
                "fill root, n = {n}"
            );
            assert_eq!(got.vram_bytes, p.vram_bytes);
        }
    }
    let rate = cuda.measure(&one).unwrap();
    assert!(rate > 1e12, "{rate} MAC/s");
}
