"""The payment channel on a real EVM (py-evm): deposits, redeems, closes, the refusals, token
quirks, and the two properties that make it safe for both sides, checked over random sequences.
"""

import pytest
from eth_account import Account
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from eth_tester.exceptions import TransactionFailed
from web3.exceptions import ContractLogicError
from web3.logs import DISCARD

from conftest import CHALLENGE, NO_RETURN_TOKEN, TEST_TOKEN, TOKENS, Chain, make_chain

LANE_A = b"\x0a" * 32
LANE_B = b"\x0b" * 32


# What a reverted transaction raises through web3's eth-tester provider.
REVERTED = (ContractLogicError, TransactionFailed)


def reverts(chain: Chain, fn, sender, reason: str):
    with pytest.raises(REVERTED) as e:
        chain.send(fn, sender)
    assert reason in str(e.value), str(e.value)


def redeem(chain, lane, amount, sig, provider=None, renter=None, claim=None):
    renter = renter or chain.renter
    claim = amount if claim is None else claim
    return chain.channels.functions.redeem(renter.address, lane, amount, claim, sig), (
        provider or chain.provider
    )


def events(chain, name, receipt):
    # The token's own logs (transfers) are not the channel's: left out.
    return getattr(chain.channels.events, name)().process_receipt(receipt, errors=DISCARD)


def test_deposit_redeem_the_last_voucher_and_close(chain):
    c, r, p = chain, chain.renter, chain.provider
    rx = c.send(c.channels.functions.deposit(p.address, 1_000_000), r)
    (dep,) = events(c, "Deposited", rx)
    assert (dep.args.amount, dep.args.deposit, dep.args.epoch) == (1_000_000, 1_000_000, 0)
    # The renter signs as it pays (cumulative); only the last voucher is redeemed.
    for amount in (100, 250_000, 400_000):
        last = c.sign(r, p, LANE_A, amount)
    fn, who = redeem(c, LANE_A, 400_000, last)
    rx = c.send(fn, who)
    (red,) = events(c, "Redeemed", rx)
    assert (red.args.paid, red.args.unpaid, red.args.cumulative_amount) == (400_000, 0, 400_000)
    assert c.balance(p) == 400_000
    # A second lease on the same channel is another lane.
    b = c.sign(r, p, LANE_B, 100_000)
    c.send(*redeem(c, LANE_B, 100_000, b))
    assert c.balance(p) == 500_000
    # The renter closes; after the challenge period the rest comes back.
    rx = c.send(c.channels.functions.start_close(p.address), r)
    (close,) = events(c, "CloseStarted", rx)
    assert close.args.closes_at == c.now() + CHALLENGE
    reverts(c, c.channels.functions.withdraw(p.address), r, "challenge period not over")
    c.travel(CHALLENGE)
    rx = c.send(c.channels.functions.withdraw(p.address), r)
    (w,) = events(c, "Withdrawn", rx)
    assert w.args.refund == 500_000
    assert c.balance(r) == TOKENS - 500_000
    assert c.balance(c.channels.address) == 0
    assert c.channels.functions.channels(r.address, p.address).call() == (0, 0, 0, 1)


def test_the_digest_is_standard_eip712(chain):
    c = chain
    from eth_account.messages import encode_typed_data  # noqa: F401  (used through c.sign)
    sig = c.sign(c.renter, c.provider, LANE_A, 7)
    digest = c.channels.functions.voucher_digest(
        c.renter.address, c.provider.address, 0, LANE_A, 7
    ).call()
    assert Account._recover_hash(digest, signature=sig) == c.renter.address


def test_refusals(chain):
    c, r, p, o = chain, chain.renter, chain.provider, chain.other
    c.send(c.channels.functions.deposit(p.address, 1_000_000), r)
    v200 = c.sign(r, p, LANE_A, 200)
    v300 = c.sign(r, p, LANE_A, 300)
    c.send(*redeem(c, LANE_A, 300, v300))
    # A double redeem, and an older voucher after a newer one.
    reverts(c, *redeem(c, LANE_A, 300, v300), "nothing new on this lane")
    reverts(c, *redeem(c, LANE_A, 200, v200), "nothing new on this lane")
    # A voucher for another lane, another amount, another channel (another provider asks).
    reverts(c, *redeem(c, LANE_B, 300, v300), "not signed by the renter")
    reverts(c, *redeem(c, LANE_A, 900, v300), "not signed by the renter")
    c.send(c.channels.functions.deposit(o.address, 1_000), r)
    reverts(c, *redeem(c, LANE_A, 400, c.sign(r, p, LANE_A, 400), provider=o),
            "not signed by the renter")
    # A voucher of another contract (its domain) is void here.
    other_contract = "0x" + "11" * 20
    reverts(c, *redeem(c, LANE_A, 400, c.sign(r, p, LANE_A, 400, contract=other_contract)),
            "not signed by the renter")
    # A forged signature: someone else's key, a high-s twin, a bad v, a short one.
    forged = c.sign(o, p, LANE_A, 400)
    reverts(c, *redeem(c, LANE_A, 400, forged), "not signed by the renter")
    good = c.sign(r, p, LANE_A, 400)
    n = 0xFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFEBAAEDCE6AF48A03BBFD25E8CD0364141
    s = int.from_bytes(good[32:64], "big")
    twin = good[:32] + (n - s).to_bytes(32, "big") + bytes([55 - good[64]])  # 27 <-> 28
    reverts(c, *redeem(c, LANE_A, 400, twin), "malleable signature")
    reverts(c, *redeem(c, LANE_A, 400, good[:64] + b"\x05"), "bad signature v")
    reverts(c, *redeem(c, LANE_A, 400, good[:64]), "signature is not 65 bytes")
    # No channel at all (the other renter never deposited to this provider).
    reverts(c, *redeem(c, LANE_A, 5, c.sign(o, p, LANE_A, 5), renter=o), "no channel")
    # A redeem after the close: the challenge period is over.
    c.send(c.channels.functions.start_close(p.address), r)
    c.send(*redeem(c, LANE_A, 400, good))  # still in time
    c.travel(CHALLENGE)
    reverts(c, *redeem(c, LANE_B, 50, c.sign(r, p, LANE_B, 50)), "channel closed")
    # Top-ups wait for the withdrawal; after it, the old epoch's vouchers are void.
    reverts(c, c.channels.functions.deposit(p.address, 10), r, "channel is closing")
    c.send(c.channels.functions.withdraw(p.address), r)
    c.send(c.channels.functions.deposit(p.address, 1_000), r)
    reverts(c, *redeem(c, LANE_B, 50, c.sign(r, p, LANE_B, 50, epoch=0)), "not signed by the renter")
    c.send(*redeem(c, LANE_B, 50, c.sign(r, p, LANE_B, 50)))
    # Only the renter closes or withdraws its own channel.
    reverts(c, c.channels.functions.withdraw(p.address), o, "not closing")


def test_a_voucher_beyond_the_deposit_is_paid_in_part_then_in_full_after_a_top_up(chain):
    c, r, p = chain, chain.renter, chain.provider
    c.send(c.channels.functions.deposit(p.address, 1_000), r)
    v = c.sign(r, p, LANE_A, 1_500)
    rx = c.send(*redeem(c, LANE_A, 1_500, v))
    (red,) = events(c, "Redeemed", rx)
    assert (red.args.paid, red.args.unpaid) == (1_000, 500)
    reverts(c, *redeem(c, LANE_A, 1_500, v), "channel is empty")
    c.send(c.channels.functions.deposit(p.address, 2_000), r)
    rx = c.send(*redeem(c, LANE_A, 1_500, v))
    (red,) = events(c, "Redeemed", rx)
    assert (red.args.paid, red.args.unpaid) == (500, 0)
    assert c.balance(p) == 1_500


def test_a_batch_pays_several_lanes_at_once(chain):
    c, r, p = chain, chain.renter, chain.provider
    c.send(c.channels.functions.deposit(p.address, 10_000), r)
    lanes = [bytes([i]) * 32 for i in range(1, 6)]
    batch = [
        (r.address, lane, 100 * i, 100 * i, c.sign(r, p, lane, 100 * i))
        for i, lane in enumerate(lanes, 1)
    ]
    rx = c.send(c.channels.functions.redeem_batch(batch), p)
    assert len(events(c, "Redeemed", rx)) == 5
    assert c.balance(p) == 1_500
    # One stale voucher fails the whole batch.
    reverts(c, c.channels.functions.redeem_batch(batch[:1]), p, "nothing new on this lane")


def test_a_provider_claims_what_was_used_of_a_prepaid_voucher_and_never_beyond_it(chain):
    c, r, p = chain, chain.renter, chain.provider
    c.send(c.channels.functions.deposit(p.address, 10_000), r)
    # A prepaid voucher authorises 5,000; the lease used 3,200 of it: the provider claims that.
    v = c.sign(r, p, LANE_A, 5_000)
    rx = c.send(*redeem(c, LANE_A, 5_000, v, claim=3_200))
    (red,) = events(c, "Redeemed", rx)
    assert (red.args.cumulative_amount, red.args.claim, red.args.paid) == (5_000, 3_200, 3_200)
    assert c.balance(p) == 3_200
    # Never beyond what the renter signed; a later, larger claim on the same voucher takes the
    # difference only.
    reverts(c, *redeem(c, LANE_A, 5_000, v, claim=5_001), "claim beyond the voucher")
    reverts(c, *redeem(c, LANE_A, 5_000, v, claim=3_200), "nothing new on this lane")
    rx = c.send(*redeem(c, LANE_A, 5_000, v, claim=5_000))
    assert events(c, "Redeemed", rx)[0].args.paid == 1_800
    assert c.balance(p) == 5_000
    # The claim is the provider's, never the renter's: a claim does not make a voucher valid.
    reverts(c, *redeem(c, LANE_B, 9_000, v, claim=100), "not signed by the renter")


def test_tokens_that_return_nothing_or_take_a_fee():
    c = make_chain(NO_RETURN_TOKEN)
    r, p = c.renter, c.provider
    c.send(c.channels.functions.deposit(p.address, 1_000), r)
    c.send(*redeem(c, LANE_A, 600, c.sign(r, p, LANE_A, 600)))
    assert c.balance(p) == 600
    # A 1 % fee on every transfer: the channel credits what it received.
    c = make_chain(TEST_TOKEN, 100)
    r, p = c.renter, c.provider
    rx = c.send(c.channels.functions.deposit(p.address, 10_000), r)
    (dep,) = events(c, "Deposited", rx)
    assert dep.args.amount == 9_900
    c.send(*redeem(c, LANE_A, 9_900, c.sign(r, p, LANE_A, 9_900)))
    assert c.balance(c.channels.address) == 0


def test_a_token_that_calls_back_cannot_reenter(chain):
    c, r, p = chain, chain.renter, chain.provider
    c.send(c.channels.functions.deposit(p.address, 1_000), r)
    c.send(c.channels.functions.start_close(p.address), r)
    c.travel(CHALLENGE)
    # During the withdrawal's transfer, the token calls withdraw again (a second refund).
    call = c.channels.functions.withdraw(p.address)._encode_transaction_data()
    c.send(c.token.functions.set_reentry(c.channels.address, bytes.fromhex(call[2:])), r)
    c.send(c.channels.functions.withdraw(p.address), r)
    assert c.token.functions.reentries().call() >= 1
    assert c.token.functions.reentries_succeeded().call() == 0
    assert c.balance(r) == TOKENS
    assert c.balance(c.channels.address) == 0


OPS = st.lists(
    st.one_of(
        st.tuples(st.just("sign"), st.integers(0, 2), st.integers(1, 4_000)),
        st.tuples(st.just("redeem"), st.integers(0, 2), st.integers(0, 50), st.integers(0, 100)),
        st.tuples(st.just("deposit"), st.integers(1, 5_000)),
        st.tuples(st.just("close")),
        st.tuples(st.just("travel"), st.integers(1, 2 * CHALLENGE)),
        st.tuples(st.just("withdraw")),
    ),
    max_size=25,
)


@settings(max_examples=25, deadline=None, database=None,
          suppress_health_check=[HealthCheck.too_slow])
@given(ops=OPS)
def test_never_paid_more_than_signed_never_losing_more_than_the_latest_voucher(ops):
    """For any sequence of vouchers (signed in increasing amounts per lane), redeems of any of
    them (stale ones too) claiming any share of them (or more), top-ups, closes, waits and withdrawals: per epoch and lane, the
    provider is never paid more than the largest amount the renter signed; the renter never
    loses more than the sum of its latest vouchers; and the contract holds exactly what it owes.
    """
    c = make_chain(TEST_TOKEN, 0)
    r, p = c.renter, c.provider
    lanes = [bytes([0xA0 + i]) * 32 for i in range(3)]
    signed = {}  # (epoch, lane) -> [(amount, signature), ...] in signing order
    paid = {}  # (epoch, lane) -> paid according to the events
    c.send(c.channels.functions.deposit(p.address, 1_000), r)
    deposited, refunded = 1_000, 0
    for op in ops:
        epoch = c.epoch(r, p)
        try:
            if op[0] == "sign":
                key = (epoch, lanes[op[1]])
                prev = signed.get(key, [])
                amount = (prev[-1][0] if prev else 0) + op[2]
                signed[key] = prev + [(amount, c.sign(r, p, lanes[op[1]], amount))]
            elif op[0] == "redeem":
                vs = signed.get((epoch, lanes[op[1]]))
                if vs:
                    amount, sig = vs[op[2] % len(vs)]
                    # The provider claims any share of it (or, past 100 %, more: refused).
                    claim = amount * op[3] // 99
                    rx = c.send(*redeem(c, lanes[op[1]], amount, sig, claim=claim))
                    for e in events(c, "Redeemed", rx):
                        k = (e.args.epoch, e.args.lane)
                        paid[k] = paid.get(k, 0) + e.args.paid
            elif op[0] == "deposit":
                rx = c.send(c.channels.functions.deposit(p.address, op[1]), r)
                deposited += events(c, "Deposited", rx)[0].args.amount
            elif op[0] == "close":
                c.send(c.channels.functions.start_close(p.address), r)
            elif op[0] == "travel":
                c.travel(op[1])
            elif op[0] == "withdraw":
                rx = c.send(c.channels.functions.withdraw(p.address), r)
                refunded += events(c, "Withdrawn", rx)[0].args.refund
        except REVERTED:
            pass  # a refused step changes nothing; the invariants below still hold
        for key, amount in paid.items():
            assert amount <= signed[key][-1][0], (key, amount)
        latest = sum(vs[-1][0] for vs in signed.values())
        lost = TOKENS - c.balance(r) - (deposited - refunded - sum(paid.values()))
        assert c.balance(p) == sum(paid.values())
        assert lost <= latest
        assert c.balance(c.channels.address) == deposited - refunded - sum(paid.values())
