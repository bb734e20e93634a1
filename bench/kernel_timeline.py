#!/usr/bin/env python3
"""One decode step of a kernel trace (bench/kernel_trace.cpp's CSV): each kernel's start, end and
"exposed" time (its end minus the previous kernel's end: what it adds to the step, since a stream's
kernels end in order), then the exposed time summed per kernel kind.

Usage: kernel_timeline.py TRACE.csv [--first N] [--step K]
Steps are runs of kernels separated by > 30 us of idle GPU; K counts from the end (default 3: a
late step, not the last). --first prints that many kernels of the step (default 24)."""
import argparse
import collections
import re
import signal

KINDS = ["qgemv4_tc", "gemv_fast", "gemv", "add_rms_norm", "rms_norm", "rope_kv", "attn_decode_tiled",
         "attn_decode", "attn_combine", "attn_prefill", "gated_act", "q4_quantize", "argmax", "embed",
         "dequant", "moe", "sample"]


def kind(name):
    for k in KINDS:
        if k in name:
            return k
    for m in re.finditer(r"\d+", name):  # <length><identifier> of the mangled name ending in "kernel"
        for i in range(len(m.group(0))):
            n, at = int(m.group(0)[i:]), m.end()
            if name[at:at + n].endswith("kernel") and name[at:at + 1].isalpha():
                return name[at:at + n]
    return name[:40]


def main():
    signal.signal(signal.SIGPIPE, signal.SIG_DFL)  # quiet when piped into head
    ap = argparse.ArgumentParser()
    ap.add_argument("trace")
    ap.add_argument("--first", type=int, default=24)
    ap.add_argument("--step", type=int, default=3)
    a = ap.parse_args()
    rows = []
    for line in open(a.trace):
        s, e, blocks, threads, name = line.rstrip("\n").split(",", 4)
        rows.append((int(s), int(e), int(blocks), int(threads), name))
    rows.sort()
    steps, cur = [], [rows[0]]
    for r in rows[1:]:
        if r[0] - max(x[1] for x in cur[-4:]) > 30000:
            steps.append(cur)
            cur = [r]
        else:
            cur.append(r)
    steps.append(cur)
    step = steps[-min(a.step, len(steps))]
    t0 = step[0][0]
    span = (max(r[1] for r in step) - t0) / 1000
    print(f"{len(steps)} steps; this one: {len(step)} kernels, {span:.1f} us")
    print(f"{'start':>8} {'end':>8} {'exposed':>8} {'blocks':>7} {'thr':>4}  kernel (us)")
    prev = t0
    exposed = collections.defaultdict(lambda: [0.0, 0])
    for i, (s, e, blocks, threads, name) in enumerate(step):
        x = (e - prev) / 1000
        exposed[kind(name)][0] += x
        exposed[kind(name)][1] += 1
        if i < a.first:
            print(f"{(s - t0) / 1000:8.2f} {(e - t0) / 1000:8.2f} {x:8.2f} {blocks:7d} {threads:4d}  {kind(name)}")
        prev = max(prev, e)
    print("exposed time per kind (sums to the step):")
    for k, (x, n) in sorted(exposed.items(), key=lambda kv: -kv[1][0]):
        print(f"  {k:24s} {x:8.1f} us  {n:4d} kernels  {x / n:6.2f} us each  {100 * x / span:5.1f}%")


if __name__ == "__main__":
    main()
