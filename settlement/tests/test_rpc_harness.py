"""The JSON-RPC harness answers as a chain node does: the channel deployed and used with signed
raw transactions over HTTP (what a node's wallet sends), and bad requests answered, not fatal.
"""

import json
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest
from eth_account import Account
from web3 import Web3

from conftest import TEST_TOKEN, compiled

import build

HARNESS = Path(__file__).resolve().parent.parent / "rpc_harness.py"


@pytest.fixture
def rpc():
    proc = subprocess.Popen(
        [sys.executable, str(HARNESS), "--port", "0"],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        line = proc.stdout.readline().strip()
        assert line.startswith("listening http://127.0.0.1:"), line
        yield line.split(" ", 1)[1]
    finally:
        proc.kill()
        proc.wait()


def post(url: str, body: bytes) -> object:
    req = urllib.request.Request(url, data=body, headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=30) as r:
        return json.loads(r.read())


def call(url: str, method: str, *params):
    answer = post(url, json.dumps({"jsonrpc": "2.0", "id": 1, "method": method, "params": list(params)}).encode())
    assert "error" not in answer, answer
    return answer["result"]


def send(w3: Web3, key: bytes, tx: dict) -> dict:
    """Signs `tx` with `key` and sends it raw, as a wallet does; returns the receipt."""
    sender = Account.from_key(key).address
    tx = dict(tx)
    tx.setdefault("nonce", w3.eth.get_transaction_count(sender))
    tx.setdefault("chainId", w3.eth.chain_id)
    tx.setdefault("gas", 1_500_000)
    tx.setdefault("maxFeePerGas", 2 * 10**9)
    tx.setdefault("maxPriorityFeePerGas", 10**9)
    signed = Account.sign_transaction(tx, key)
    h = w3.eth.send_raw_transaction(signed.raw_transaction)
    receipt = w3.eth.wait_for_transaction_receipt(h)
    assert receipt.status == 1, receipt
    return receipt


def test_the_channel_over_json_rpc_with_raw_transactions(rpc):
    renter_key, provider_key = (0x1001).to_bytes(32, "big"), (0x2002).to_bytes(32, "big")
    renter, provider = Account.from_key(renter_key).address, Account.from_key(provider_key).address
    for who in (renter, provider):
        call(rpc, "harness_fund", who, hex(10**19))
    w3 = Web3(Web3.HTTPProvider(rpc))
    assert int(call(rpc, "eth_chainId"), 16) == w3.eth.chain_id

    def deploy(path, *args):
        c = compiled(path)
        built = w3.eth.contract(abi=c["abi"], bytecode=c["bytecode"]).constructor(*args).build_transaction(
            {"from": renter, "gas": 3_000_000}
        )
        receipt = send(w3, renter_key, {"data": built["data"], "value": 0, "gas": 3_000_000})
        return w3.eth.contract(address=receipt.contractAddress, abi=c["abi"])

    token = deploy(TEST_TOKEN, 0)
    channels = deploy(build.CONTRACT, token.address, 3600)

    def tx(fn, key):
        return send(w3, key, fn.build_transaction({"from": Account.from_key(key).address, "gas": 500_000}))

    tx(token.functions.mint(renter, 10_000), renter_key)
    tx(token.functions.approve(channels.address, 10_000), renter_key)
    tx(channels.functions.deposit(provider, 10_000), renter_key)
    # The voucher as the node's Rust side signs it (same EIP-712 digest, checked there).
    digest = channels.functions.voucher_digest(renter, provider, 0, b"\x07" * 32, 2_500).call()
    sig = Account._sign_hash(digest, renter_key).signature
    tx(channels.functions.redeem(renter, b"\x07" * 32, 2_500, 2_500, bytes(sig)), provider_key)
    assert token.functions.balanceOf(provider).call() == 2_500
    # Logs are there for a node watching the channel.
    logs = w3.eth.get_logs({"address": channels.address, "fromBlock": 0})
    assert len(logs) == 2  # Deposited, Redeemed
    # The clock moves for challenge periods.
    before = w3.eth.get_block("latest")["timestamp"]
    call(rpc, "harness_timeTravel", 3600)
    call(rpc, "harness_fund", renter, hex(1))  # mines a block at the new time
    assert w3.eth.get_block("latest")["timestamp"] >= before + 3600


def test_bad_requests_are_answered_and_the_harness_goes_on(rpc):
    assert post(rpc, b"{not json")["error"]["code"] == -32700
    assert post(rpc, b"[]")["error"]["code"] == -32600
    assert post(rpc, json.dumps({"id": 1, "method": "eth_chainId"}).encode())["error"]["code"] == -32600
    answer = post(rpc, json.dumps({"jsonrpc": "2.0", "id": 2, "method": "eth_noSuchMethod", "params": []}).encode())
    assert "error" in answer and answer["id"] == 2
    answer = post(rpc, json.dumps({"jsonrpc": "2.0", "id": 3, "method": "harness_fund", "params": ["0x12"]}).encode())
    assert "error" in answer
    batch = [{"jsonrpc": "2.0", "id": i, "method": "eth_chainId", "params": []} for i in (7, 8)]
    answers = post(rpc, json.dumps(batch).encode())
    assert [a["id"] for a in answers] == [7, 8]
    assert int(call(rpc, "eth_blockNumber"), 16) >= 0
