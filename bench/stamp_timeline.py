#!/usr/bin/env python3
"""Per-launch spans of a stamps probe build's decode kernels (src/kiln/backend/cuda/probe/stamps.cuh).

Usage: stamp_timeline.py STAMPS.bin [--skip N] [--blocks LABEL]
The file holds one 48-byte record per block: site, block, grid, SM, then %globaltimer (ns) at entry,
release from its first PDL wait, a kernel-chosen mark (stamps.cuh lists them) and exit.
Launches are runs of records of one site and grid in release order (a dependent kernel's blocks are
released only after its predecessor's last block ended); steps are split where releases pause > 30 us.
Decode steps of one model repeat the same launch sequence (a prefill's stamped kernels, between long
unstamped GEMMs, make "steps" of one launch: only steps of 8 or more launches count); the first N of
those are skipped (default 3: warm-up). For each launch label (GEMVs named by their place in the
layer) it prints means over the measured steps, in us:
  handoff  first release minus the previous launch's last exit (completion, flush, release)
  rel      last release minus first release          lead   first release minus first entry
  work     last exit minus first release             late   blocks that entered after the first release
  mark     the kernel's mark minus the first release, mean over blocks
and the sum of handoff + work per step (the step's length as these kernels see it)."""
import argparse
import collections
import signal
import struct

SITES = {1: "gemv", 2: "add_rms_norm", 3: "rope_kv", 4: "attn_tiled", 5: "attn", 6: "attn_combine",
         7: "gated_act", 8: "quantize_x"}
REC = struct.Struct("<4I4Q")


def launches_of(recs):
    """Splits records (sorted by release) into launches: a new one at a site or grid change, or when a
    block index repeats."""
    out, cur, seen = [], [], set()
    for r in recs:
        if cur and (r[0] != cur[0][0] or r[2] != cur[0][2] or r[1] in seen):
            out.append(cur)
            cur, seen = [], set()
        cur.append(r)
        seen.add(r[1])
    if cur:
        out.append(cur)
    return out


def label(launch, prev_site):
    site, grid = launch[0][0], launch[0][2]
    name = SITES.get(site, f"site{site}")
    if name != "gemv":
        return name
    if prev_site in (4, 5, 6):
        return "gemv_o"
    if prev_site == 7:
        return "gemv_down"
    return f"gemv_{grid}"  # after a norm: q/k/v, gate/up or the head, told apart by their grids


def main():
    signal.signal(signal.SIGPIPE, signal.SIG_DFL)
    ap = argparse.ArgumentParser()
    ap.add_argument("stamps")
    ap.add_argument("--skip", type=int, default=3)
    ap.add_argument("--blocks", default="", help="a label whose blocks to print for one launch")
    a = ap.parse_args()
    data = open(a.stamps, "rb").read()
    recs = [REC.unpack_from(data, i) for i in range(0, len(data) - len(data) % REC.size, REC.size)]
    # (site, block, grid, sm, entry, release, mark, exit); a block that never waited: release = entry
    recs = [(s, b, g, sm, t0, t1 or t0, t2, t3) for s, b, g, sm, t0, t1, t2, t3 in recs]
    recs.sort(key=lambda r: (r[5], r[4]))
    steps, cur = [], [recs[0]]
    for r in recs[1:]:
        if r[5] - cur[-1][5] > 30000:
            steps.append(cur)
            cur = []
        cur.append(r)
    steps.append(cur)
    ticks = sorted({r[5] for r in recs[:200000]})
    res = min((b - a_ for a_, b in zip(ticks, ticks[1:])), default=0)
    print(f"{len(recs)} block records, {len(steps)} steps; smallest timer step seen {res} ns")
    # A prefill's stamped kernels sit between long unstamped GEMMs: "steps" of one launch each.
    decode = [s for s in steps if len(launches_of(s)) >= 8]
    measured = decode[a.skip:] if len(decode) > a.skip else decode[-1:]
    shape = collections.Counter(len(launches_of(s)) for s in measured)
    n_launch = shape.most_common(1)[0][0]
    measured = [s for s in measured if len(launches_of(s)) == n_launch]
    print(f"{len(decode)} steps of 8 or more launches; measuring {len(measured)} of {n_launch} launches "
          f"(the most common count) after the first {a.skip}")
    acc = collections.defaultdict(lambda: collections.defaultdict(list))
    order, totals, shown = [], [], False
    for s in measured:
        prev_end, prev_site, total = None, None, 0.0
        for ln in launches_of(s):
            lab = label(ln, prev_site)
            if lab not in order:
                order.append(lab)
            first_rel = min(r[5] for r in ln)
            last_end = max(r[7] for r in ln)
            m = acc[lab]
            hand = (first_rel - prev_end) / 1000 if prev_end is not None else 0.0
            m["handoff"].append(hand)
            m["rel"].append((max(r[5] for r in ln) - first_rel) / 1000)
            m["lead"].append((first_rel - min(r[4] for r in ln)) / 1000)
            m["work"].append((last_end - first_rel) / 1000)
            m["late"].append(sum(1 for r in ln if r[4] > first_rel))
            m["blocks"].append(len(ln))
            marks = [r[6] - first_rel for r in ln if r[6]]
            if marks:
                m["mark"].append(sum(marks) / len(marks) / 1000)
            total += hand + (last_end - first_rel) / 1000
            if lab == a.blocks and not shown:
                shown = True
                print(f"blocks of one {lab} launch (us from its first release): block sm entry release mark exit")
                for r in sorted(ln, key=lambda r: r[4]):
                    rel = lambda t: f"{(t - first_rel) / 1000:7.2f}" if t else "      -"
                    print(f"  {r[1]:5d} {r[3]:3d} {rel(r[4])} {rel(r[5])} {rel(r[6])} {rel(r[7])}")
            prev_end, prev_site = last_end, ln[0][0]
        totals.append(total)
    print(f"{'launch':16s} {'n/step':>6s} {'blocks':>6s} {'handoff':>7s} {'rel':>6s} {'lead':>6s} {'work':>7s} "
          f"{'late':>6s} {'mark':>6s}   (us, means)")
    per_step = len(measured)
    for lab in order:
        m = acc[lab]
        mean = lambda k: sum(m[k]) / len(m[k]) if m[k] else float("nan")
        print(f"{lab:16s} {len(m['work']) / per_step:6.1f} {mean('blocks'):6.0f} {mean('handoff'):7.2f} "
              f"{mean('rel'):6.2f} {mean('lead'):6.2f} {mean('work'):7.2f} {mean('late'):6.0f} {mean('mark'):6.2f}")
    print("per step, us (handoff + work summed):", " ".join(f"{t:.1f}" for t in totals[:8]))
    print("summed per label, us per step: " + ", ".join(
        f"{lab} {sum(acc[lab]['handoff']) / per_step:.1f}+{sum(acc[lab]['work']) / per_step:.1f}" for lab in order))


if __name__ == "__main__":
    main()
