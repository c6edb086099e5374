"""A real EVM for the channel's tests: py-evm through eth-tester, driven with web3.py.

Each test gets a fresh chain with the channel contract deployed against a test token, a renter
and two providers with known secp256k1 keys (funded with ether and tokens), and a helper that
signs vouchers as a wallet does (EIP-712 typed data through eth-account).
"""

import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
from eth_account import Account
from eth_account.messages import encode_typed_data
from eth_tester import EthereumTester, PyEVMBackend
from web3 import Web3
from web3.providers.eth_tester import EthereumTesterProvider

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

import build  # noqa: E402  (settlement/build.py: the pinned compiler)

CHALLENGE = 3600
TOKENS = 10**12
_compiled: dict = {}


def compiled(path: Path) -> dict:
    if path not in _compiled:
        _compiled[path] = build.compile_file(path)
    return _compiled[path]


def deploy(w3, path: Path, *args, sender=None):
    c = compiled(path)
    factory = w3.eth.contract(abi=c["abi"], bytecode=c["bytecode"])
    tx = factory.constructor(*args).transact({"from": sender or w3.eth.accounts[0]})
    receipt = w3.eth.wait_for_transaction_receipt(tx)
    return w3.eth.contract(address=receipt.contractAddress, abi=c["abi"])


@dataclass
class Wallet:
    address: str
    key: bytes


@dataclass
class Chain:
    w3: Web3
    tester: EthereumTester
    channels: object
    token: object
    renter: Wallet
    provider: Wallet
    other: Wallet

    def now(self) -> int:
        return self.w3.eth.get_block("latest")["timestamp"]

    def travel(self, seconds: int) -> None:
        """Moves the chain's clock forward (the next block is mined that much later)."""
        self.tester.time_travel(self.now() + seconds)

    def send(self, fn, sender: Wallet):
        """Sends a transaction; returns its receipt (raises on a revert)."""
        tx = fn.transact({"from": sender.address})
        return self.w3.eth.wait_for_transaction_receipt(tx)

    def balance(self, who) -> int:
        address = who.address if isinstance(who, Wallet) else who
        return self.token.functions.balanceOf(address).call()

    def epoch(self, renter: Wallet, provider: Wallet) -> int:
        return self.channels.functions.channels(renter.address, provider.address).call()[3]

    def sign(self, renter: Wallet, provider: Wallet, lane: bytes, amount: int, epoch=None,
             contract=None) -> bytes:
        """The renter's EIP-712 voucher for `lane` up to `amount` (cumulative)."""
        epoch = self.epoch(renter, provider) if epoch is None else epoch
        data = {
            "types": {
                "EIP712Domain": [
                    {"name": "name", "type": "string"},
                    {"name": "version", "type": "string"},
                    {"name": "chainId", "type": "uint256"},
                    {"name": "verifyingContract", "type": "address"},
                ],
                "Voucher": [
                    {"name": "renter", "type": "address"},
                    {"name": "provider", "type": "address"},
                    {"name": "epoch", "type": "uint256"},
                    {"name": "lane", "type": "bytes32"},
                    {"name": "cumulativeAmount", "type": "uint256"},
                ],
            },
            "primaryType": "Voucher",
            "domain": {
                "name": "gridlease channels",
                "version": "1",
                "chainId": self.w3.eth.chain_id,
                "verifyingContract": contract or self.channels.address,
            },
            "message": {
                "renter": renter.address,
                "provider": provider.address,
                "epoch": epoch,
                "lane": lane,
                "cumulativeAmount": amount,
            },
        }
        signed = Account.sign_message(encode_typed_data(full_message=data), renter.key)
        return bytes(signed.signature)


def wallet(tester: EthereumTester, w3: Web3, seed: int) -> Wallet:
    key = seed.to_bytes(32, "big")
    account = Account.from_key(key)
    tester.add_account("0x" + key.hex())
    w3.eth.wait_for_transaction_receipt(
        w3.eth.send_transaction(
            {"from": w3.eth.accounts[0], "to": account.address, "value": 10**20}
        )
    )
    return Wallet(account.address, key)


def make_chain(token_path: Path, *token_args) -> Chain:
    tester = EthereumTester(PyEVMBackend())
    w3 = Web3(EthereumTesterProvider(tester))
    token = deploy(w3, token_path, *token_args)
    channels = deploy(w3, build.CONTRACT, token.address, CHALLENGE)
    renter, provider, other = (wallet(tester, w3, s) for s in (0x1001, 0x2002, 0x3003))
    chain = Chain(w3, tester, channels, token, renter, provider, other)
    for who in (renter, other):
        chain.send(token.functions.mint(who.address, TOKENS), who)
        chain.send(token.functions.approve(channels.address, TOKENS), who)
    return chain


TEST_TOKEN = HERE / "contracts" / "TestToken.vy"
NO_RETURN_TOKEN = HERE / "contracts" / "NoReturnToken.vy"


@pytest.fixture
def chain() -> Chain:
    return make_chain(TEST_TOKEN, 0)
