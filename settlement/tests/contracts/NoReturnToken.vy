# pragma version 0.4.3
"""
@title An ERC-20 whose transfers return nothing (as USDT's do), for the channel's tests only
"""

balanceOf: public(HashMap[address, uint256])
allowance: public(HashMap[address, HashMap[address, uint256]])


@external
def mint(to: address, amount: uint256):
    self.balanceOf[to] += amount


@external
def transfer(receiver: address, amount: uint256):
    self.balanceOf[msg.sender] -= amount
    self.balanceOf[receiver] += amount


@external
def transferFrom(sender: address, receiver: address, amount: uint256):
    self.allowance[sender][msg.sender] -= amount
    self.balanceOf[sender] -= amount
    self.balanceOf[receiver] += amount


@external
def approve(spender: address, amount: uint256):
    self.allowance[msg.sender][spender] = amount
