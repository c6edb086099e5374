# pragma version 0.4.3
"""
@title An ERC-20 for the channel's tests only (never deployed anywhere else)
@notice Anyone can mint. `fee_bps` burns that share of every transfer (a fee-on-transfer
        token). With `reenter_target` set, every transfer first calls it with `reenter_data`
        (a hostile token calling back into the channel) and records whether that call succeeded.
"""

from ethereum.ercs import IERC20

implements: IERC20

event Transfer:
    sender: indexed(address)
    receiver: indexed(address)
    value: uint256

event Approval:
    owner: indexed(address)
    spender: indexed(address)
    value: uint256

balanceOf: public(HashMap[address, uint256])
allowance: public(HashMap[address, HashMap[address, uint256]])
totalSupply: public(uint256)
fee_bps: public(uint256)
reenter_target: public(address)
reenter_data: public(Bytes[512])
reentries: public(uint256)
reentries_succeeded: public(uint256)


@deploy
def __init__(fee_bps: uint256):
    assert fee_bps < 10000
    self.fee_bps = fee_bps


@external
def mint(to: address, amount: uint256):
    self.balanceOf[to] += amount
    self.totalSupply += amount
    log Transfer(sender=empty(address), receiver=to, value=amount)


@external
def set_reentry(target: address, data: Bytes[512]):
    self.reenter_target = target
    self.reenter_data = data


@internal
def _move(sender: address, receiver: address, amount: uint256):
    if self.reenter_target != empty(address):
        self.reentries += 1
        ok: bool = raw_call(self.reenter_target, self.reenter_data, revert_on_failure=False)
        if ok:
            self.reentries_succeeded += 1
    fee: uint256 = amount * self.fee_bps // 10000
    self.balanceOf[sender] -= amount
    self.balanceOf[receiver] += amount - fee
    self.totalSupply -= fee
    log Transfer(sender=sender, receiver=receiver, value=amount - fee)


@external
def transfer(receiver: address, amount: uint256) -> bool:
    self._move(msg.sender, receiver, amount)
    return True


@external
def transferFrom(sender: address, receiver: address, amount: uint256) -> bool:
    self.allowance[sender][msg.sender] -= amount
    self._move(sender, receiver, amount)
    return True


@external
def approve(spender: address, amount: uint256) -> bool:
    self.allowance[msg.sender][spender] = amount
    log Approval(owner=msg.sender, spender=spender, value=amount)
    return True
