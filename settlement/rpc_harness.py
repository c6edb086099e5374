"""A standard Ethereum JSON-RPC endpoint over a real EVM (py-evm through eth-tester), for tests
that drive the channel contract the way a node does: over HTTP, with signed raw transactions.

    target/settlement-venv/bin/python settlement/rpc_harness.py [--port 0]

It listens on 127.0.0.1 only and prints one line, `listening http://127.0.0.1:PORT`, once it
answers. Requests are JSON-RPC 2.0 objects or batches. The `eth_*`, `net_*` and `web3_*`
methods are web3.py's mapping onto eth-tester (what a chain node answers, for the calls a
wallet makes: `eth_chainId`, `eth_getTransactionCount`, `eth_estimateGas`, `eth_gasPrice`,
`eth_sendRawTransaction`, `eth_getTransactionReceipt`, `eth_call`, `eth_getLogs`,
`eth_getBalance`, `eth_blockNumber`, ...). Every transaction is mined at once. Two test-only
methods move the chain:

- `harness_fund(address, wei)`: sends ether from a pre-funded account;
- `harness_timeTravel(seconds)`: the next block is mined that many seconds later;
- `harness_mint(address, amount)`: with `--deploy-test-channels`, mints the test token.

With `--deploy-test-channels SECONDS` it first deploys the test token
(`settlement/tests/contracts/TestToken.vy`, never deployed anywhere else) and the channel
contract with that challenge period, and prints one line of JSON before the `listening` line:
`{"chain_id": N, "token": "0x..", "channel_contract": "0x.."}`.

Requests are served one at a time (eth-tester is not thread-safe); a body over 1 MiB is
refused.
"""

import argparse
import json
import sys
import threading
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path

from eth_tester import EthereumTester, PyEVMBackend
from web3 import Web3
from web3.providers.eth_tester import EthereumTesterProvider

MAX_BODY = 1 << 20
HERE = Path(__file__).resolve().parent


class Chain:
    def __init__(self) -> None:
        self.tester = EthereumTester(PyEVMBackend())
        self.provider = EthereumTesterProvider(self.tester)
        # The harness's own calls (funding) through web3 as usual.
        self.w3 = Web3(self.provider)
        # Requests as they come: only the provider's own middleware, which maps JSON-RPC's
        # names and formats (camelCase, hex quantities) onto eth-tester's and back.
        raw = Web3(self.provider, middleware=[])
        self.request = self.provider.request_func(raw, raw.middleware_onion)
        self.lock = threading.Lock()
        self.token = None

    def harness_fund(self, address: str, wei) -> str:
        tx = self.w3.eth.send_transaction(
            {"from": self.w3.eth.accounts[0], "to": Web3.to_checksum_address(address),
             "value": int(wei, 0) if isinstance(wei, str) else int(wei)}
        )
        return tx.to_0x_hex()

    def deploy_test_channels(self, challenge: int) -> dict:
        """Deploys the test token and the channel contract (the pinned compiler's build)."""
        sys.path.insert(0, str(HERE / "tests"))
        sys.path.insert(0, str(HERE))
        import build  # noqa: E402  (settlement/build.py: the pinned compiler)
        from conftest import TEST_TOKEN, deploy  # noqa: E402

        self.token = deploy(self.w3, TEST_TOKEN, 0)
        channels = deploy(self.w3, build.CONTRACT, self.token.address, challenge)
        return {"chain_id": self.w3.eth.chain_id, "token": self.token.address,
                "channel_contract": channels.address}

    def harness_mint(self, address: str, amount) -> str:
        if self.token is None:
            raise ValueError("no test token: start the harness with --deploy-test-channels")
        amount = int(amount, 0) if isinstance(amount, str) else int(amount)
        tx = self.token.functions.mint(Web3.to_checksum_address(address), amount).transact(
            {"from": self.w3.eth.accounts[0]})
        return tx.to_0x_hex()

    def harness_timeTravel(self, seconds) -> int:
        now = self.w3.eth.get_block("latest")["timestamp"]
        target = now + (int(seconds, 0) if isinstance(seconds, str) else int(seconds))
        self.tester.time_travel(target)
        return target

    def call(self, request):
        if not isinstance(request, dict) or request.get("jsonrpc") != "2.0" or "method" not in request:
            return error(None, -32600, "not a JSON-RPC 2.0 request")
        rid = request.get("id")
        method = request["method"]
        params = request.get("params") or []
        if not isinstance(method, str) or not isinstance(params, list):
            return error(rid, -32602, "params must be a list")
        if method in ("eth_call", "eth_estimateGas") and params and isinstance(params[0], dict):
            # The execution API names a call's payload `input` (what alloy and geth send);
            # eth-tester still knows only the older `data`.
            call = dict(params[0])
            if "input" in call:
                call.setdefault("data", call.pop("input"))
            params = [call, *params[1:]]
        # Every transaction is mined at once, so the pending block is the latest one (eth-tester
        # does not take the name).
        params = ["latest" if p == "pending" else p for p in params]
        with self.lock:
            try:
                if method in ("harness_fund", "harness_timeTravel", "harness_mint"):
                    return {"jsonrpc": "2.0", "id": rid, "result": getattr(self, method)(*params)}
                response = self.request(method, params)
            except Exception as e:  # a bad request is the caller's error, never the end of the harness
                return error(rid, -32000, f"{type(e).__name__}: {e}")
        if "error" in response:
            err = response["error"]
            if isinstance(err, str):
                err = {"code": -32000, "message": err}
            return {"jsonrpc": "2.0", "id": rid, "error": err}
        result = to_json(response.get("result"))
        if method == "eth_getTransactionReceipt" and isinstance(result, dict):
            complete_receipt(result)
        if method == "eth_getLogs" and isinstance(result, list):
            for log in result:
                complete_log(log)
        return {"jsonrpc": "2.0", "id": rid, "result": result}


def complete_log(log: dict) -> None:
    """The fields the execution API gives a log that eth-tester leaves out."""
    log.setdefault("removed", False)


def complete_receipt(receipt: dict) -> None:
    """A receipt as the execution API shapes it: eth-tester leaves out `logsBloom` (computed
    here as a node does: three bits per address and topic, from their Keccak-256) and the logs'
    `removed`."""
    bloom = 0
    for log in receipt.get("logs") or []:
        complete_log(log)
        items = [log["address"]] + list(log.get("topics") or [])
        for item in items:
            digest = Web3.keccak(hexstr=item)
            for i in (0, 2, 4):
                bloom |= 1 << (((digest[i] << 8) | digest[i + 1]) & 2047)
    receipt.setdefault("logsBloom", "0x" + bloom.to_bytes(256, "big").hex())


def to_json(value):
    """web3's results as JSON-RPC puts them: bytes as 0x-hex, integers as 0x-quantities."""
    if isinstance(value, (bytes, bytearray)):
        return "0x" + bytes(value).hex()
    if isinstance(value, (bool, float, str)) or value is None:
        return value
    if isinstance(value, int):
        return hex(value)
    if isinstance(value, dict):
        return {k: to_json(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [to_json(v) for v in value]
    return str(value)


def error(rid, code: int, message: str) -> dict:
    return {"jsonrpc": "2.0", "id": rid, "error": {"code": code, "message": message}}


def handler_for(chain: Chain):
    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            if length <= 0 or length > MAX_BODY:
                return self.answer(413 if length > MAX_BODY else 411,
                                   error(None, -32600, "a body of 1 byte to 1 MiB"))
            try:
                request = json.loads(self.rfile.read(length))
            except ValueError:
                return self.answer(200, error(None, -32700, "not JSON"))
            if isinstance(request, list):
                if not request:
                    return self.answer(200, error(None, -32600, "an empty batch"))
                return self.answer(200, [chain.call(r) for r in request])
            return self.answer(200, chain.call(request))

        def answer(self, status: int, body) -> None:
            data = json.dumps(body).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, *args) -> None:
            pass

    return Handler


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, default=0, help="TCP port on 127.0.0.1 (0: any)")
    parser.add_argument("--deploy-test-channels", type=int, metavar="SECONDS",
                        help="deploy the test token and the channel contract with this challenge period")
    args = parser.parse_args()
    chain = Chain()
    if args.deploy_test_channels is not None:
        print(json.dumps(chain.deploy_test_channels(args.deploy_test_channels)), flush=True)
    server = HTTPServer(("127.0.0.1", args.port), handler_for(chain))
    print(f"listening http://127.0.0.1:{server.server_address[1]}", flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    return 0


if __name__ == "__main__":
    sys.exit(main())
