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
- `harness_timeTravel(seconds)`: the next block is mined that many seconds later.

Requests are served one at a time (eth-tester is not thread-safe); a body over 1 MiB is
refused.
"""

import argparse
import json
import sys
import threading
from http.server import BaseHTTPRequestHandler, HTTPServer

from eth_tester import EthereumTester, PyEVMBackend
from web3 import Web3
from web3.providers.eth_tester import EthereumTesterProvider

MAX_BODY = 1 << 20


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

    def harness_fund(self, address: str, wei) -> str:
        tx = self.w3.eth.send_transaction(
            {"from": self.w3.eth.accounts[0], "to": Web3.to_checksum_address(address),
             "value": int(wei, 0) if isinstance(wei, str) else int(wei)}
        )
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
        with self.lock:
            try:
                if method in ("harness_fund", "harness_timeTravel"):
                    return {"jsonrpc": "2.0", "id": rid, "result": getattr(self, method)(*params)}
                response = self.request(method, params)
            except Exception as e:  # a bad request is the caller's error, never the end of the harness
                return error(rid, -32000, f"{type(e).__name__}: {e}")
        if "error" in response:
            err = response["error"]
            if isinstance(err, str):
                err = {"code": -32000, "message": err}
            return {"jsonrpc": "2.0", "id": rid, "error": err}
        return {"jsonrpc": "2.0", "id": rid, "result": to_json(response.get("result"))}


def to_json(value):
    """web3's results as JSON-RPC puts them: bytes as 0x-hex, integers as 0x-quantities."""
    if isinstance(value, (bytes, bytearray)):
        return "0x" + bytes(value).hex()
    if isinstance(value, bool) or value is None or isinstance(value, str):
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
    args = parser.parse_args()
    chain = Chain()
    server = HTTPServer(("127.0.0.1", args.port), handler_for(chain))
    print(f"listening http://127.0.0.1:{server.server_address[1]}", flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    return 0


if __name__ == "__main__":
    sys.exit(main())
