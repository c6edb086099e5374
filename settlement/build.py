"""Compiles the settlement contracts with the pinned Vyper and writes their ABI and bytecode.

    python settlement/build.py            # writes settlement/build/GridleaseChannels.json
    python settlement/build.py --check    # exits 1 when the committed file is stale

The JSON holds the compiler version and the source's SHA-256 beside the ABI and the deployment
bytecode, so a deployed contract can be matched to this source (compile it again with the same
Vyper and compare the bytecode).
"""

import hashlib
import json
import sys
from pathlib import Path

import vyper

VYPER_VERSION = "0.4.3"
HERE = Path(__file__).resolve().parent
CONTRACT = HERE / "contracts" / "GridleaseChannels.vy"
OUT = HERE / "build" / "GridleaseChannels.json"


def compile_file(path: Path) -> dict:
    """ABI and deployment bytecode of one Vyper source."""
    if vyper.__version__ != VYPER_VERSION:
        raise SystemExit(f"vyper {VYPER_VERSION} is pinned; {vyper.__version__} is installed")
    source = path.read_text()
    out = vyper.compile_code(source, contract_path=str(path.name), output_formats=["abi", "bytecode"])
    return {
        "contract": path.stem,
        "vyper": VYPER_VERSION,
        "source_sha256": hashlib.sha256(source.encode()).hexdigest(),
        "abi": out["abi"],
        "bytecode": out["bytecode"],
    }


def render(artifact: dict) -> str:
    return json.dumps(artifact, indent=1, sort_keys=True) + "\n"


def main() -> int:
    text = render(compile_file(CONTRACT))
    if "--check" in sys.argv[1:]:
        if not OUT.exists() or OUT.read_text() != text:
            print(f"{OUT} is stale: run python settlement/build.py", file=sys.stderr)
            return 1
        return 0
    OUT.parent.mkdir(exist_ok=True)
    OUT.write_text(text)
    print(f"wrote {OUT}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
