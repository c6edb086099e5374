# pragma version 0.4.3
"""
@title gridlease payment channels
@license Apache-2.0
@notice Unidirectional ERC-20 payment channels from renters to providers. A renter deposits
        once per provider; every lease is a lane of that channel; the renter signs cumulative
        vouchers (EIP-712) as it pays by the second; the provider redeems a lane's last voucher
        and is paid the difference from what that lane already redeemed, up to the amount it
        claims (at most the voucher's: a prepaid voucher authorises more than was used, and
        the provider claims what the lease's statement owes). A renter ends a
        channel with a close that waits out a challenge period, during which the provider can
        still redeem; after it the unredeemed deposit returns to the renter.

        No admin keys, no upgrades, no fees: the token and the challenge period are fixed at
        deployment.

        Re-entrancy: every function that moves tokens is `@nonreentrant` (one lock for the whole
        contract), and each writes its state before it calls the token. Token quirks: transfers
        accept tokens that return nothing (`default_return_value`); a deposit credits what the
        contract's balance actually grew by (fee-on-transfer tokens); a token whose balances
        change on their own (rebasing) is not supported.

        Epochs: a channel's epoch grows each time the renter withdraws. Vouchers name the epoch,
        so a voucher signed before a close is void after it.
"""

from ethereum.ercs import IERC20

struct Channel:
    # Tokens deposited in this epoch (what the contract actually received).
    deposit: uint256
    # Tokens paid to the provider in this epoch (all lanes).
    redeemed: uint256
    # When the renter's close ends (0: the channel is not closing).
    closes_at: uint256
    # Grows at every withdrawal; vouchers of another epoch do not verify.
    epoch: uint256

struct Voucher:
    renter: address
    lane: bytes32
    # What the renter signed: the most this lane can ever be paid.
    cumulative_amount: uint256
    # What the provider takes on this lane in all, at most `cumulative_amount`.
    claim: uint256
    signature: Bytes[65]

event Deposited:
    renter: indexed(address)
    provider: indexed(address)
    epoch: uint256
    amount: uint256
    deposit: uint256

event Redeemed:
    renter: indexed(address)
    provider: indexed(address)
    lane: indexed(bytes32)
    epoch: uint256
    cumulative_amount: uint256
    claim: uint256
    paid: uint256
    unpaid: uint256

event CloseStarted:
    renter: indexed(address)
    provider: indexed(address)
    epoch: uint256
    closes_at: uint256

event Withdrawn:
    renter: indexed(address)
    provider: indexed(address)
    epoch: uint256
    refund: uint256

TOKEN: public(immutable(IERC20))
CHALLENGE_PERIOD: public(immutable(uint256))

channels: public(HashMap[address, HashMap[address, Channel]])
# renter -> provider -> epoch -> lane -> tokens paid on that lane.
lane_redeemed: public(HashMap[address, HashMap[address, HashMap[uint256, HashMap[bytes32, uint256]]]])

MAX_BATCH: constant(uint256) = 32
# secp256k1's group order divided by two: signatures with a larger s are refused (EIP-2).
HALF_N: constant(uint256) = 57896044618658097711785492504343953926418782139537452191302581570759080747168

DOMAIN_TYPEHASH: constant(bytes32) = keccak256(
    "EIP712Domain(string name,string version,uint256 chainId,address verifyingContract)"
)
VOUCHER_TYPEHASH: constant(bytes32) = keccak256(
    "Voucher(address renter,address provider,uint256 epoch,bytes32 lane,uint256 cumulativeAmount)"
)
NAME_HASH: constant(bytes32) = keccak256("gridlease channels")
VERSION_HASH: constant(bytes32) = keccak256("1")


@deploy
def __init__(token: IERC20, challenge_period: uint256):
    assert token.address != empty(address), "no token"
    assert challenge_period > 0, "no challenge period"
    TOKEN = token
    CHALLENGE_PERIOD = challenge_period


@view
@external
def domain_separator() -> bytes32:
    return self._domain_separator()


@view
@internal
def _domain_separator() -> bytes32:
    # Computed at each use: a chain that forks gets its own id.
    return keccak256(abi_encode(DOMAIN_TYPEHASH, NAME_HASH, VERSION_HASH, chain.id, self))


@view
@external
def voucher_digest(
    renter: address, provider: address, epoch: uint256, lane: bytes32, cumulative_amount: uint256
) -> bytes32:
    return self._digest(renter, provider, epoch, lane, cumulative_amount)


@view
@internal
def _digest(
    renter: address, provider: address, epoch: uint256, lane: bytes32, cumulative_amount: uint256
) -> bytes32:
    struct_hash: bytes32 = keccak256(
        abi_encode(VOUCHER_TYPEHASH, renter, provider, epoch, lane, cumulative_amount)
    )
    return keccak256(concat(b"\x19\x01", self._domain_separator(), struct_hash))


@pure
@internal
def _recover(digest: bytes32, signature: Bytes[65]) -> address:
    assert len(signature) == 65, "signature is not 65 bytes"
    r: uint256 = convert(slice(signature, 0, 32), uint256)
    s: uint256 = convert(slice(signature, 32, 32), uint256)
    v: uint256 = convert(slice(signature, 64, 1), uint256)
    assert v == 27 or v == 28, "bad signature v"
    assert s <= HALF_N, "malleable signature"
    return ecrecover(digest, v, r, s)


@external
@nonreentrant
def deposit(provider: address, amount: uint256):
    """
    @notice Opens the channel from the caller to `provider`, or tops it up. Refused while the
            channel is closing (withdraw first).
    """
    assert provider != empty(address) and provider != msg.sender, "bad provider"
    assert amount > 0, "nothing to deposit"
    c: Channel = self.channels[msg.sender][provider]
    assert c.closes_at == 0, "channel is closing"
    before: uint256 = staticcall TOKEN.balanceOf(self)
    assert extcall TOKEN.transferFrom(msg.sender, self, amount, default_return_value=True), "transfer failed"
    received: uint256 = staticcall TOKEN.balanceOf(self) - before
    assert received > 0, "nothing received"
    c.deposit += received
    self.channels[msg.sender][provider] = c
    log Deposited(renter=msg.sender, provider=provider, epoch=c.epoch, amount=received, deposit=c.deposit)


@internal
def _redeem(provider: address, v: Voucher) -> uint256:
    c: Channel = self.channels[v.renter][provider]
    assert c.deposit > 0, "no channel"
    assert c.closes_at == 0 or block.timestamp < c.closes_at, "channel closed"
    signer: address = self._recover(
        self._digest(v.renter, provider, c.epoch, v.lane, v.cumulative_amount), v.signature
    )
    assert signer == v.renter and signer != empty(address), "not signed by the renter"
    assert v.claim <= v.cumulative_amount, "claim beyond the voucher"
    already: uint256 = self.lane_redeemed[v.renter][provider][c.epoch][v.lane]
    assert v.claim > already, "nothing new on this lane"
    owed: uint256 = v.claim - already
    pay: uint256 = min(owed, c.deposit - c.redeemed)
    assert pay > 0, "channel is empty"
    self.lane_redeemed[v.renter][provider][c.epoch][v.lane] = already + pay
    self.channels[v.renter][provider].redeemed = c.redeemed + pay
    log Redeemed(
        renter=v.renter,
        provider=provider,
        lane=v.lane,
        epoch=c.epoch,
        cumulative_amount=v.cumulative_amount,
        claim=v.claim,
        paid=pay,
        unpaid=owed - pay,
    )
    return pay


@external
@nonreentrant
def redeem(
    renter: address, lane: bytes32, cumulative_amount: uint256, claim: uint256, signature: Bytes[65]
) -> uint256:
    """
    @notice The caller (the provider) redeems `renter`'s voucher for `lane`, signed for
            `cumulative_amount`: it is paid `claim` (at most the voucher's amount) beyond what
            the lane already redeemed, as far as the deposit goes (the rest stays redeemable
            after a top-up). Returns what it was paid.
    """
    pay: uint256 = self._redeem(
        msg.sender,
        Voucher(
            renter=renter,
            lane=lane,
            cumulative_amount=cumulative_amount,
            claim=claim,
            signature=signature,
        ),
    )
    assert extcall TOKEN.transfer(msg.sender, pay, default_return_value=True), "transfer failed"
    return pay


@external
@nonreentrant
def redeem_batch(vouchers: DynArray[Voucher, MAX_BATCH]) -> uint256:
    """
    @notice Redeems several vouchers (any renters, any lanes) in one transaction, paying the
            total once. Any voucher that fails fails the whole batch.
    """
    total: uint256 = 0
    for v: Voucher in vouchers:
        total += self._redeem(msg.sender, v)
    assert total > 0, "nothing to redeem"
    assert extcall TOKEN.transfer(msg.sender, total, default_return_value=True), "transfer failed"
    return total


@external
def start_close(provider: address):
    """
    @notice The caller (the renter) starts closing its channel to `provider`: the provider
            can redeem until `CHALLENGE_PERIOD` seconds from now; then `withdraw` returns the rest.
    """
    c: Channel = self.channels[msg.sender][provider]
    assert c.deposit > 0, "no channel"
    assert c.closes_at == 0, "already closing"
    c.closes_at = block.timestamp + CHALLENGE_PERIOD
    self.channels[msg.sender][provider] = c
    log CloseStarted(renter=msg.sender, provider=provider, epoch=c.epoch, closes_at=c.closes_at)


@external
@nonreentrant
def withdraw(provider: address) -> uint256:
    """
    @notice After the challenge period, returns what the provider did not redeem to the caller
            (the renter) and ends the epoch: its vouchers are void. Returns the refund.
    """
    c: Channel = self.channels[msg.sender][provider]
    assert c.closes_at != 0, "not closing"
    assert block.timestamp >= c.closes_at, "challenge period not over"
    refund: uint256 = c.deposit - c.redeemed
    self.channels[msg.sender][provider] = Channel(deposit=0, redeemed=0, closes_at=0, epoch=c.epoch + 1)
    if refund > 0:
        assert extcall TOKEN.transfer(msg.sender, refund, default_return_value=True), "transfer failed"
    log Withdrawn(renter=msg.sender, provider=provider, epoch=c.epoch, refund=refund)
    return refund
