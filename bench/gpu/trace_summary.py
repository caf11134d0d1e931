#!/usr/bin/env python3
"""Summarises a Chrome trace written by `sftctl-trainer train --profile DIR` (LibTorch's Kineto
profiler, docs/observability.md) on a GPU, small enough to copy back from a rented machine:

  bench/gpu/trace_summary.py DIR/trace-rank0.json [--steps N] [--top K]

Prints the GPU's busy time against the profiled span (the gaps are where the GPU waited for the
host: launches, synchronisations), kernel time by kind (matmul, attention, sftctl's fused kernels,
elementwise and copies, reductions and norms, optimizer, other), the K kernels that took the most
time (with their count), and the K host operators with the most self time. Times are per step when
--steps says how many steps the trace holds. Standard library only.
"""
import argparse
import collections
import json
import sys

KINDS = [  # (kind, substrings of a kernel's name, lower-cased); the first match wins
    ("sftctl fused", ("sftctl",)),
    ("attention", ("flash", "fmha", "cudnn", "attention", "sdpa")),
    ("optimizer", ("adam", "multi_tensor", "foreach")),
    ("matmul", ("gemm", "cutlass", "sm90_xmma", "sm80_xmma", "nvjet", "cublas", "matmul")),
    ("reduction / norm", ("reduce", "norm", "softmax", "logsumexp", "cross_entropy", "nll")),
    ("elementwise / copy", ("elementwise", "vectorized", "copy", "cast", "fill", "cat", "index")),
]


def kind_of(name):
    low = name.lower()
    for kind, keys in KINDS:
        if any(k in low for k in keys):
            return kind
    return "other"


def union_length(intervals):
    total, end = 0.0, None
    for s, e in sorted(intervals):
        if end is None or s > end:
            total += e - s
            end = e
        elif e > end:
            total += e - end
            end = e
    return total


def summarise(trace, steps, top):
    events = trace["traceEvents"] if isinstance(trace, dict) else trace
    kernels = [e for e in events if e.get("ph") == "X" and e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset")]
    ops = [e for e in events if e.get("ph") == "X" and e.get("cat") == "cpu_op"]
    out = []
    per = max(steps, 1)
    if kernels:
        out += kernel_lines(kernels, per, top)
    else:
        out.append("no GPU kernels in the trace (a CPU run, or a LibTorch without Kineto's CUDA activities)")
    if ops:
        out += host_op_lines(ops, per, top)
    return out


def kernel_lines(kernels, per, top):
    out = []
    start = min(e["ts"] for e in kernels)
    end = max(e["ts"] + e.get("dur", 0) for e in kernels)
    busy = union_length([(e["ts"], e["ts"] + e.get("dur", 0)) for e in kernels])
    span = end - start
    out.append(f"kernels: {len(kernels)} ({len(kernels) / per:.0f} per step); GPU busy {busy / 1e3 / per:.1f} ms of "
               f"{span / 1e3 / per:.1f} ms per step ({100 * busy / span:.0f}%)")
    by_kind = collections.defaultdict(lambda: [0.0, 0])
    by_name = collections.defaultdict(lambda: [0.0, 0])
    for e in kernels:
        d = e.get("dur", 0)
        k = by_kind[kind_of(e["name"])]
        k[0] += d
        k[1] += 1
        n = by_name[e["name"]]
        n[0] += d
        n[1] += 1
    total = sum(v[0] for v in by_kind.values())
    out.append("kernel time by kind (ms per step, share, kernels per step):")
    for kind, (d, c) in sorted(by_kind.items(), key=lambda kv: (-kv[1][0], kv[0])):
        out.append(f"  {kind:20s} {d / 1e3 / per:8.2f}  {100 * d / total:5.1f}%  {c / per:7.0f}")
    out.append(f"top {top} kernels (ms per step, calls per step, name):")
    for name, (d, c) in sorted(by_name.items(), key=lambda kv: (-kv[1][0], kv[0]))[:top]:
        out.append(f"  {d / 1e3 / per:8.2f}  {c / per:6.0f}  {name[:150]}")
    return out


def host_op_lines(ops, per, top):
    """The host operators with the most self time: an operator's duration minus its direct children's,
    per thread."""
    out = []
    acc = collections.defaultdict(lambda: [0.0, 0])
    by_thread = collections.defaultdict(list)
    for e in ops:
        by_thread[(e.get("pid"), e.get("tid"))].append(e)
    for evs in by_thread.values():
        evs.sort(key=lambda e: (e["ts"], -e.get("dur", 0)))
        stack = []  # [end, name, self time so far]
        for e in evs:
            s, d = e["ts"], e.get("dur", 0)
            while stack and stack[-1][0] <= s:
                _, n, own = stack.pop()
                acc[n][0] += own
            if stack:
                stack[-1][2] -= d
            stack.append([s + d, e["name"], d])
            acc[e["name"]][1] += 1
        for _, n, own in stack:
            acc[n][0] += own
    out.append(f"top {top} host operators by self time (ms per step, calls per step):")
    for name, (d, c) in sorted(acc.items(), key=lambda kv: (-kv[1][0], kv[0]))[:top]:
        out.append(f"  {d / 1e3 / per:8.2f}  {c / per:6.0f}  {name[:120]}")
    return out


def self_test():
    """Figures of a made-up two-step trace, worked out by hand: exits non-zero when one differs."""
    def x(cat, name, ts, dur, tid=1):
        return {"ph": "X", "cat": cat, "name": name, "ts": ts, "dur": dur, "pid": 1, "tid": tid}
    trace = {"traceEvents": [
        x("kernel", "sm90_xmma_gemm_bf16bf16_bf16f32", 0, 300),
        x("kernel", "void at::native::vectorized_elementwise_kernel<4>", 250, 100),  # overlaps the gemm by 50
        x("kernel", "void sftctl::trainer::kernels::RowKernel<AddRmsNorm>", 500, 100),
        x("gpu_memcpy", "Memcpy DtoH (Device -> Pinned)", 900, 100),
        x("kernel", "flash_fwd_kernel", 1600, 400),
        x("cpu_op", "aten::linear", 0, 100), x("cpu_op", "aten::matmul", 10, 80), x("cpu_op", "aten::mm", 20, 50),
        x("cpu_op", "aten::add", 200, 30), x("cpu_op", "aten::add", 300, 30, tid=2),
        {"ph": "i", "name": "ignored instant"},
    ]}
    got = summarise(trace, steps=2, top=3)
    want = [
        # busy: [0, 350] + [500, 600] + [900, 1000] + [1600, 2000] = 950 of a 2000 span; per step / 2
        "kernels: 5 (2 per step); GPU busy 0.5 ms of 1.0 ms per step (48%)",
        "kernel time by kind (ms per step, share, kernels per step):",
        "  attention                0.20   40.0%        0",
        "  matmul                   0.15   30.0%        0",
        "  elementwise / copy       0.05   10.0%        0",
        "  other                    0.05   10.0%        0",
        "  sftctl fused             0.05   10.0%        0",
    ]
    if got[:len(want)] != want:
        sys.exit("trace_summary self-test: got\n" + "\n".join(got[:len(want)]) + "\nwanted\n" + "\n".join(want))
    ops = got[got.index("top 3 host operators by self time (ms per step, calls per step):") + 1:]
    # self: linear 100 - 80 = 20, matmul 80 - 50 = 30, mm 50, add 30 + 30 (two threads)
    want_ops = ["      0.03       1  aten::add", "      0.03       0  aten::mm", "      0.01       0  aten::matmul"]
    if ops != want_ops:
        sys.exit("trace_summary self-test: host operators\n" + "\n".join(ops) + "\nwanted\n" + "\n".join(want_ops))
    print("trace_summary self-test: ok")


def main():
    if sys.argv[1:] == ["--self-test"]:
        return self_test()
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("trace")
    ap.add_argument("--steps", type=int, default=1, help="how many steps the trace holds (per-step figures)")
    ap.add_argument("--top", type=int, default=25)
    a = ap.parse_args()
    try:
        with open(a.trace) as f:
            trace = json.load(f)
    except (OSError, ValueError) as e:
        sys.exit(f"trace_summary: {a.trace}: {e}")
    print("\n".join(summarise(trace, a.steps, a.top)))


if __name__ == "__main__":
    main()
