#!/usr/bin/env python3
"""Turns the raw results of bench/run-gpu.sh (OUTDIR: ceilings.json, kiln.jsonl, profile.txt and the
peers' JSON) into the markdown tables of BENCHMARKS.md. Usage: gpu_summary.py OUTDIR"""
import json, os, sys

out = sys.argv[1]
def load(name):
    p = os.path.join(out, name)
    return json.load(open(p)) if os.path.exists(p) else {}
ceil = json.loads(open(os.path.join(out, 'ceilings.json')).read().strip().splitlines()[-1])
runs = [json.loads(l) for l in open(os.path.join(out, 'kiln.jsonl')) if l.startswith('{')]
hf = load('peer_gpu.json')
bw, gemm = ceil['copy_GBps'] * 1e9, ceil['gemm_TFLOPs'] * 1e12
print(f"Ceilings (kiln's backend, same run): copy {ceil['copy_GBps']/1e3:.2f} TB/s (read + write), "
      f"bf16 GEMM 8192³ {ceil['gemm_TFLOPs']:.0f} TFLOP/s"
      + (f"; PyTorch: copy {hf['copy_GBps']/1e3:.2f} TB/s, GEMM {hf['gemm_TFLOPs']:.0f} TFLOP/s" if hf else "") + "\n")
for shape in ('llama-3-8b', 'qwen2.5-7b'):
    rs = [r for r in runs if r['model'].rstrip('/').endswith(shape)]
    if not rs: continue
    peer = load(f'peer_torch_graph_{shape}.json')
    wb = rs[0]['weight_bytes_per_step']
    bound = bw / wb
    print(f"### {shape} (bf16, {wb/1e9:.2f} GB of weights read per decode step; bound {bound:.0f} tok/s at batch 1)\n")
    print("| prefill tokens | kiln tok/s | fraction of GEMM rate | HF eager tok/s | kiln / HF |")
    print("|---|---|---|---|---|")
    for r in rs:
        if r['batch'] != 1 or r['decode_steps'] > 1: continue
        L = r['prefill_tokens']; t = r['prefill_tok_s']
        frac = wb * t / gemm  # 2 FLOP per weight per token = bytes of bf16 weights per token
        h = hf.get(f'hf_prefill_{L}_tok_s') if shape == 'llama-3-8b' else None
        print(f"| {L} | {t:,.0f} | {frac:.0%} | {h:,.0f} | {t/h:.2f}x |" if h else f"| {L} | {t:,.0f} | {frac:.0%} | – | – |")
    print()
    print("| decode batch | kiln tok/s | fraction of bound (batch 1) | PyTorch CUDA-graph tok/s | kiln / graph peer | HF eager tok/s | kiln / HF |")
    print("|---|---|---|---|---|---|---|")
    for r in rs:
        if r['decode_steps'] <= 1: continue
        b = r['batch']; t = r['decode_tok_s']
        g = peer.get(f'bs{b}_tok_s'); h = hf.get(f'hf_eager_decode_bs{b}_tok_s') if shape == 'llama-3-8b' else None
        fb = f"{t/bound:.0%}" if b == 1 else "–"
        gs = f"{g:,.0f} | {t/g:.2f}x" if g else "– | –"
        hs = f"{h:,.1f} | {t/h:.1f}x" if h else "– | –"
        print(f"| {b} | {t:,.1f} | {fb} | {gs} | {hs} |")
    print()
prof = os.path.join(out, 'profile.txt')
if os.path.exists(prof):
    print("Per-op device time, llama-3-8b, 128-token prompt + 64 decode steps at batch 1 (events around each op, graphs off):\n")
    print("```")
    print('\n'.join(l for l in open(prof).read().replace('\r', '\n').splitlines() if 'uploading weights' not in l and l.strip()))
    print("```")
