"""An independent peer for the interop test (node/tests/interop_py.rs): py-libp2p, not rust-libp2p.

It joins a gridlease network the way docs/protocol.md tells another implementation to:
TCP + noise + yamux, gossipsub on the offer topic with libp2p message signatures off (gridlease
publishes with an author and a sequence number, unsigned), then

1. waits for an offer on the topic and verifies it by the documented rules alone (section 2):
   decodes the bincode envelope, checks version, kind, network, the ed25519 signature over
   "gridlease\\0" || version (u16 BE) || domain tag || "\\0" || len(network) || network || payload,
   that the offer's provider key is the signer, and that the gossip author is that key's peer id;
2. opens /gridlease/lease/1 and sends a frame of garbage: the provider must answer with a
   signed LeaseReject whose reason is Malformed (section 4) before closing the stream.

Prints OFFER_OK <provider key hex> and MALFORMED_OK, and exits 0; anything else exits non-zero
with the reason on stderr.

usage: py_peer.py MULTIADDR NETWORK MALFORMED_TAG TIMEOUT_S
"""

import struct
import sys

import multiaddr
import trio
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

from libp2p import new_host
from libp2p.crypto.ed25519 import create_new_key_pair
from libp2p.custom_types import TProtocol
from libp2p.network.stream.exceptions import StreamEOF
from libp2p.peer.peerinfo import info_from_p2p_addr
from libp2p.pubsub.gossipsub import GossipSub
from libp2p.pubsub.pubsub import Pubsub
from libp2p.tools.anyio_service import background_trio_service

PROTOCOL_VERSION = 1
KIND_OFFER = 0
KIND_LEASE_REJECT = 3
RPC_REJECTED = 1
# The identity multihash of a libp2p protobuf Ed25519 public key, before the 32 key bytes.
ED25519_PEER_ID_PREFIX = bytes([0x00, 0x24, 0x08, 0x01, 0x12, 0x20])


def fail(why):
    print(f"py_peer: {why}", file=sys.stderr, flush=True)
    sys.exit(1)


class Reader:
    """bincode 2 with varint integers (docs/protocol.md section 2)."""

    def __init__(self, data):
        self.data, self.at = data, 0

    def take(self, n):
        if self.at + n > len(self.data):
            fail(f"truncated at byte {self.at}, wanted {n} more")
        b = self.data[self.at : self.at + n]
        self.at += n
        return b

    def varint(self):
        first = self.take(1)[0]
        if first < 251:
            return first
        size = {251: 2, 252: 4, 253: 8, 254: 16}.get(first)
        if size is None:
            fail(f"bad varint tag {first}")
        return int.from_bytes(self.take(size), "little")

    def bytes(self):
        return self.take(self.varint())

    def string(self):
        return self.bytes().decode()


def envelope(r):
    return {
        "version": r.varint(),
        "kind": r.varint(),
        "network": r.string(),
        "signer": r.bytes(),
        "signature": r.bytes(),
        "payload": r.bytes(),
    }


def verify(env, network, kind, tag):
    if env["version"] != PROTOCOL_VERSION:
        fail(f"envelope version {env['version']}")
    if env["kind"] != kind:
        fail(f"envelope kind {env['kind']}, wanted {kind}")
    if env["network"] != network:
        fail(f"envelope network {env['network']!r}")
    net = network.encode()
    signing_input = (
        b"gridlease\x00"
        + struct.pack(">H", env["version"])
        + tag
        + b"\x00"
        + bytes([len(net)])
        + net
        + env["payload"]
    )
    try:
        Ed25519PublicKey.from_public_bytes(env["signer"]).verify(env["signature"], signing_input)
    except InvalidSignature:
        fail("bad signature")


async def main(addr, network, malformed_tag, timeout_s):
    info = info_from_p2p_addr(multiaddr.Multiaddr(addr))
    host = new_host(key_pair=create_new_key_pair(), muxer_preference="YAMUX")
    gossipsub = GossipSub(
        protocols=[TProtocol("/meshsub/1.1.0")],
        degree=6,
        degree_low=4,
        degree_high=12,
        heartbeat_interval=1,
    )
    pubsub = Pubsub(host, gossipsub, strict_signing=False)
    listen = [multiaddr.Multiaddr("/ip4/127.0.0.1/tcp/0")]
    async with host.run(listen_addrs=listen):
        async with background_trio_service(pubsub), background_trio_service(gossipsub):
            await pubsub.wait_until_ready()
            sub = await pubsub.subscribe(f"gridlease/v1/offers/{network}")
            await host.connect(info)
            print("CONNECTED", flush=True)
            with trio.fail_after(timeout_s):
                msg = await sub.get()
            env = envelope(Reader(bytes(msg.data)))
            verify(env, network, KIND_OFFER, b"gridlease/v1/offer")
            provider = Reader(env["payload"]).bytes()
            if provider != env["signer"]:
                fail("the offer's provider is not its signer")
            if bytes(msg.from_id) != ED25519_PEER_ID_PREFIX + provider:
                fail("the gossip author is not the offer's provider")
            print(f"OFFER_OK {provider.hex()}", flush=True)

            stream = await host.new_stream(info.peer_id, [TProtocol("/gridlease/lease/1")])
            garbage = b"\xff\x13\x37" * 40
            await stream.write(struct.pack(">I", len(garbage)) + garbage)
            await stream.close_write()
            answer = b""
            with trio.fail_after(timeout_s):
                while True:
                    try:
                        chunk = await stream.read(65536)
                    except StreamEOF:
                        break
                    if not chunk:
                        break
                    answer += chunk
            if len(answer) < 4:
                fail(f"no answer to garbage ({len(answer)} bytes)")
            (n,) = struct.unpack(">I", answer[:4])
            if n != len(answer) - 4:
                fail(f"answer frame says {n} bytes, {len(answer) - 4} came")
            r = Reader(answer[4:])
            if r.varint() != RPC_REJECTED:
                fail("the answer is not Rejected")
            env = envelope(r)
            verify(env, network, KIND_LEASE_REJECT, b"gridlease/v1/lease-reject")
            if env["signer"] != provider:
                fail("the rejection is not the provider's")
            p = Reader(env["payload"])
            p.bytes()  # lease id (zeros: there were no terms)
            p.varint()  # nonce
            reason = p.varint()
            if reason != malformed_tag:
                fail(f"reason tag {reason}, wanted Malformed ({malformed_tag})")
            detail = p.string()
            print(f"MALFORMED_OK {detail}", flush=True)


if __name__ == "__main__":
    if len(sys.argv) != 5:
        fail(__doc__)
    trio.run(main, sys.argv[1], sys.argv[2], int(sys.argv[3]), float(sys.argv[4]))
