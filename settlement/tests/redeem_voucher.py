"""Redeems a voucher that real gridlease nodes signed, on a real EVM (py-evm through eth-tester),
for the node's end-to-end test (`node/tests/settlement_vouchers.rs`).

    python settlement/tests/redeem_voucher.py addresses
        -> {"chain_id": N, "token": "0x..", "channel_contract": "0x.."}

A fresh chain deploys the test token and the channel contract from the same account at the
same nonces, so they have the same addresses on every fresh chain: the nodes are configured
with them before the lease, and the redeem runs on a fresh chain after it.

    python settlement/tests/redeem_voucher.py redeem --renter-key HEX --provider-key HEX \
        --deposit N --lane 0x.. --amount N [--claim N] --signature 0x..
        -> {"paid": N, "provider": N, "renter": N, "channel": N, "minted": N}

The renter (its wallet key from its node's home) deposits `deposit` token units into its
channel to the provider; the provider (its own wallet key) redeems the voucher; the token
balances after it are printed. Every transaction is signed by the wallet's own key.
"""

import argparse
import json
import sys
from pathlib import Path

from eth_account import Account
from eth_tester import EthereumTester, PyEVMBackend
from web3 import Web3
from web3.logs import DISCARD
from web3.providers.eth_tester import EthereumTesterProvider

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))

import build  # noqa: E402  (settlement/build.py: the pinned compiler)
from conftest import CHALLENGE, TEST_TOKEN, deploy  # noqa: E402


def fresh_chain():
    tester = EthereumTester(PyEVMBackend())
    w3 = Web3(EthereumTesterProvider(tester))
    token = deploy(w3, TEST_TOKEN, 0)
    channels = deploy(w3, build.CONTRACT, token.address, CHALLENGE)
    return tester, w3, token, channels


def wallet(tester, w3, key_hex: str):
    key = bytes.fromhex(key_hex.removeprefix("0x"))
    account = Account.from_key(key)
    tester.add_account("0x" + key.hex())
    w3.eth.wait_for_transaction_receipt(
        w3.eth.send_transaction({"from": w3.eth.accounts[0], "to": account.address, "value": 10**20})
    )
    return account.address


def send(w3, fn, sender):
    return w3.eth.wait_for_transaction_receipt(fn.transact({"from": sender}))


def main() -> int:
    ap = argparse.ArgumentParser()
    sub = ap.add_subparsers(dest="cmd", required=True)
    sub.add_parser("addresses")
    r = sub.add_parser("redeem")
    for flag in ("--renter-key", "--provider-key", "--lane", "--signature"):
        r.add_argument(flag, required=True)
    r.add_argument("--deposit", type=int, required=True)
    r.add_argument("--amount", type=int, required=True)
    r.add_argument("--claim", type=int, help="what the provider claims (default: the amount)")
    args = ap.parse_args()
    tester, w3, token, channels = fresh_chain()
    if args.cmd == "addresses":
        print(json.dumps({"chain_id": w3.eth.chain_id, "token": token.address,
                          "channel_contract": channels.address}))
        return 0
    renter = wallet(tester, w3, args.renter_key)
    provider = wallet(tester, w3, args.provider_key)
    send(w3, token.functions.mint(renter, args.deposit), renter)
    send(w3, token.functions.approve(channels.address, args.deposit), renter)
    send(w3, channels.functions.deposit(provider, args.deposit), renter)
    lane = bytes.fromhex(args.lane.removeprefix("0x"))
    sig = bytes.fromhex(args.signature.removeprefix("0x"))
    claim = args.amount if args.claim is None else args.claim
    rx = send(w3, channels.functions.redeem(renter, lane, args.amount, claim, sig), provider)
    (red,) = channels.events.Redeemed().process_receipt(rx, errors=DISCARD)
    print(json.dumps({
        "paid": red.args.paid,
        "unpaid": red.args.unpaid,
        "provider": token.functions.balanceOf(provider).call(),
        "renter": token.functions.balanceOf(renter).call(),
        "channel": token.functions.balanceOf(channels.address).call(),
        "minted": args.deposit,
    }))
    return 0


if __name__ == "__main__":
    sys.exit(main())
