"""Gas of each channel operation on py-evm (the numbers in docs/billing.md).

    target/settlement-venv/bin/python settlement/gas.py
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent / "tests"))

from conftest import CHALLENGE, TEST_TOKEN, make_chain  # noqa: E402


def main() -> None:
    c = make_chain(TEST_TOKEN, 0)
    r, p = c.renter, c.provider
    f = c.channels.functions
    rows = []

    def gas(what, fn, who):
        rows.append((what, c.send(fn, who).gasUsed))

    gas("deposit (opens the channel)", f.deposit(p.address, 1_000_000), r)
    gas("deposit (top-up)", f.deposit(p.address, 1_000_000), r)
    lane = b"\x01" * 32
    gas("redeem (a lane's first)", f.redeem(r.address, lane, 1_000, 1_000, c.sign(r, p, lane, 1_000)), p)
    gas("redeem (the same lane again)", f.redeem(r.address, lane, 2_000, 2_000, c.sign(r, p, lane, 2_000)), p)
    batch = []
    for i in range(2, 12):
        lane = bytes([i]) * 32
        batch.append((r.address, lane, 1_000, 1_000, c.sign(r, p, lane, 1_000)))
    receipt = c.send(f.redeem_batch(batch), p)
    rows.append(("redeem_batch of 10 new lanes, per voucher", receipt.gasUsed // 10))
    gas("start_close", f.start_close(p.address), r)
    c.travel(CHALLENGE)
    gas("withdraw", f.withdraw(p.address), r)
    print("| operation | gas |")
    print("|---|---|")
    for what, used in rows:
        print(f"| {what} | {used:,} |")


if __name__ == "__main__":
    main()
