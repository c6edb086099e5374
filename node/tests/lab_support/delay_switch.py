#!/usr/bin/env python3
"""The lab's internet switch with latency, for kernels without sch_netem.

Runs inside the lab's internet namespace (`ip netns exec <p>-inet python3 delay_switch.py
DELAY_MS LOSS_PCT PORT...`): a learning Ethernet switch between the given veth ports (raw
AF_PACKET sockets), every frame held DELAY_MS before it is sent on, LOSS_PCT percent of the
frames dropped. Two hosts on the switch see 2 x DELAY_MS round trip. Frames only travel
between the lab's own ports; nothing leaves the namespace. Ends when killed or when stdin
closes (the test that started it is gone).
"""
import heapq
import random
import socket
import sys
import threading
import time

ETH_P_ALL = 0x0003
PACKET_OUTGOING = 4
# Most frames held at once (a router's tail drop beyond it).
MAX_QUEUED = 50000


def main():
    delay = float(sys.argv[1]) / 1000.0
    loss = float(sys.argv[2]) / 100.0
    ports = sys.argv[3:]
    socks = {}
    for p in ports:
        s = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.htons(ETH_P_ALL))
        s.bind((p, 0))
        socks[p] = s
    macs = {}  # learned: source MAC -> port
    queue = []  # (due, seq, port, frame)
    seq = 0
    cond = threading.Condition()

    def reader(port, s):
        nonlocal seq
        while True:
            frame, addr = s.recvfrom(65535)
            if addr[2] == PACKET_OUTGOING or len(frame) < 14:
                continue
            if loss > 0 and random.random() < loss:
                continue
            dst, src = frame[0:6], frame[6:12]
            with cond:
                macs[src] = port
                out = macs.get(dst)
                targets = [out] if out is not None and dst[0] & 1 == 0 else [q for q in ports if q != port]
                due = time.monotonic() + delay
                for t in targets:
                    if t != port and len(queue) < MAX_QUEUED:
                        seq += 1
                        heapq.heappush(queue, (due, seq, t, frame))
                cond.notify()

    def writer():
        while True:
            with cond:
                while not queue:
                    cond.wait()
                due, _, port, frame = queue[0]
                wait = due - time.monotonic()
                if wait > 0:
                    cond.wait(wait)
                    continue
                heapq.heappop(queue)
            try:
                socks[port].send(frame)
            except OSError:
                pass

    for p, s in socks.items():
        threading.Thread(target=reader, args=(p, s), daemon=True).start()
    threading.Thread(target=writer, daemon=True).start()
    print("switching", len(ports), "ports", flush=True)
    sys.stdin.read()


if __name__ == "__main__":
    main()
