#!/usr/bin/env bash
# GPU check: on a machine with an NVIDIA GPU, build and run gridlease's GPU inventory (NVML),
# benchmark (cudarc/cuBLAS) and proof-of-GPU challenge (the CUDA prover, checked by the
# contracts' rules on the CPU), and - if PyTorch is importable - the same GEMMs in PyTorch for
# comparison. Prints one JSON object on stdout:
#
#   {"inventory": [...], "benchmark": {...}, "challenge": {...} | null, "torch": {...} | null,
#    "ratio": {...} | null}
#
# Usage: scripts/gpu-check.sh [--device D] [--n N] [--repeats R]
# Exit code: 0 on success, 2 when there is no GPU / no CUDA (the message is on stderr), 1 when
# the challenge did not pass (its JSON says why).
# See docs/gpu.md.
set -euo pipefail
cd "$(dirname "$0")/.."

device=0
n=8192
repeats=7
while [ $# -gt 0 ]; do
  case "$1" in
    --device) device="$2"; shift 2 ;;
    --n) n="$2"; shift 2 ;;
    --repeats) repeats="$2"; shift 2 ;;
    *) echo "usage: $0 [--device D] [--n N] [--repeats R]" >&2; exit 64 ;;
  esac
done

# CUDA numbers devices as NVML does (by PCI bus), so --device D is the inventory's entry D.
export CUDA_DEVICE_ORDER=PCI_BUS_ID

echo "building gridlease-gpu-bench (release)..." >&2
cargo build --release --locked -q -p gridlease-sandbox --bin gridlease-gpu-bench >&2
bin=target/release/gridlease-gpu-bench

inventory=$("$bin" inventory)
benchmark=$("$bin" bench --device "$device" --n "$n" --repeats "$repeats")

# The proof-of-GPU challenge on the same GPU, named by its UUID (sandbox/src/proof/cuda.rs).
uuid=$(python3 -c 'import json, sys; print(json.loads(sys.argv[1])[int(sys.argv[2])]["uuid"])' "$inventory" "$device")
echo "running the proof-of-GPU challenge on $uuid..." >&2
challenge_rc=0
challenge=$("$bin" challenge --gpus "$uuid") || challenge_rc=$?
[ -n "$challenge" ] || challenge=null

torch=null
if python3 -c 'import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)' 2>/dev/null; then
  echo "running the PyTorch matmul comparison..." >&2
  torch=$(python3 - "$device" "$n" "$repeats" <<'PY'
import json, statistics, sys
import torch

device, n, repeats = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
# Same conditions as the cuBLAS benchmark: plain fp32 (no TF32), fp16 with fp32 accumulate.
torch.backends.cuda.matmul.allow_tf32 = False
torch.backends.cuda.matmul.allow_fp16_reduced_precision_reduction = False
dev = torch.device("cuda", device)
gemms, warmup = 5, 3

def rate(dtype):
    a = torch.randn(n, n, device=dev, dtype=dtype)
    b = torch.randn(n, n, device=dev, dtype=dtype)
    for _ in range(warmup):
        torch.matmul(a, b)
    torch.cuda.synchronize(dev)
    ms = []
    for _ in range(repeats):
        e0 = torch.cuda.Event(enable_timing=True)
        e1 = torch.cuda.Event(enable_timing=True)
        e0.record()
        for _ in range(gemms):
            torch.matmul(a, b)
        e1.record()
        e1.synchronize()
        ms.append(e0.elapsed_time(e1))
    return 2.0 * n**3 * gemms / (statistics.median(ms) / 1e3) / 1e9

print(json.dumps({
    "torch_version": torch.__version__,
    "device": torch.cuda.get_device_name(dev),
    "n": n,
    "fp32_gflops": int(rate(torch.float32)),
    "fp16_gflops": int(rate(torch.float16)),
}))
PY
)
else
  echo "PyTorch with CUDA not importable; skipping the comparison" >&2
fi

python3 - "$inventory" "$benchmark" "$challenge" "$torch" <<'PY' 2>/dev/null || printf '{"inventory": %s, "benchmark": %s, "challenge": %s, "torch": %s, "ratio": null}\n' "$inventory" "$benchmark" "$challenge" "$torch"
import json, sys
inv, bench, challenge, torch = (json.loads(a) for a in sys.argv[1:5])
ratio = None
if torch:
    ratio = {k: round(bench[k] / torch[k], 3) for k in ("fp32_gflops", "fp16_gflops") if torch.get(k)}
print(json.dumps({"inventory": inv, "benchmark": bench, "challenge": challenge, "torch": torch, "ratio": ratio}, indent=2))
PY
if [ "$challenge_rc" -ne 0 ]; then
  echo "the proof-of-GPU challenge did not pass (exit $challenge_rc)" >&2
  exit 1
fi
