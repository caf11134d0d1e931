#!/usr/bin/python3
"""train_throughput, Python side: tokens/s of an eager PyTorch training step (reference/llama_ref.py)
for the same sizes, batch, threads, precision and optimizer as bench/train_throughput.cpp.
Prints one JSON line per config. Run with Debian's /usr/bin/python3 (it has torch 1.13).

  /usr/bin/python3 bench/train_throughput.py [--steps N] [--warmup N] [--sizes 5M,28M]
                                             [--precisions fp32,bf16] [--threads N] [--foreach]
"""

import argparse
import json
import math
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "reference"))

import torch  # noqa: E402

import llama_ref as ref  # noqa: E402

SIZES = {
    "5M": dict(hidden_size=256, num_hidden_layers=6, num_attention_heads=4, intermediate_size=768),
    "28M": dict(hidden_size=512, num_hidden_layers=8, num_attention_heads=8, intermediate_size=1536),
}


def run_config(size, precision, a):
    c = dict(SIZES[size], vocab_size=258, max_position_embeddings=max(a.seq, 256), rms_norm_eps=1e-5,
             rope_theta=10000.0, initializer_range=0.02)
    torch.manual_seed(0)
    model = ref.CausalLM(c)
    model.train()
    params = sum(p.numel() for p in model.parameters())
    matmul_params = sum(p.numel() for n, p in model.named_parameters()
                        if p.dim() == 2 and "embed_tokens" not in n)
    opt = ref.make_optimizer(model, lr=1e-3, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1,
                             foreach=True if a.foreach else None)
    batches = []
    for _ in range(4):
        ids = torch.randint(0, 256, (a.batch, a.seq), dtype=torch.int64)
        batches.append((ids, ids.clone()))
    targets = a.batch * (a.seq - 1)
    bf16 = precision == "bf16"
    total = a.warmup + a.steps
    step_s = []
    loss = 0.0
    t_timed = ref.now()
    for step in range(total):
        if step == a.warmup:
            t_timed = ref.now()
        t0 = ref.now()
        ids, labels = batches[step % len(batches)]
        lr = ref.learning_rate(step, 1e-3, 0, total)
        loss, grad_norm = ref.train_step(model, opt, ids, labels, targets, lr, bf16, clip=1.0)
        if not (math.isfinite(loss) and math.isfinite(grad_norm)):
            sys.exit(f"non-finite loss or gradient at step {step}")
        if step >= a.warmup:
            step_s.append(ref.now() - t0)
    timed_s = ref.now() - t_timed
    median_s = sorted(step_s)[len(step_s) // 2]
    B, T = a.batch, a.seq
    flops_per_step = 6.0 * matmul_params * B * T + 12.0 * c["num_hidden_layers"] * B * T * T * c["hidden_size"]
    return {
        "bench": "train_throughput", "impl": "python", "size": size, "precision": precision,
        "params": params, "matmul_params": matmul_params, "batch": B, "seq": T,
        "threads": torch.get_num_threads(), "warmup": a.warmup, "steps": a.steps,
        "optimizer": "torch.optim.AdamW(foreach=%s)" % ("True" if a.foreach else "default"),
        "time_s": timed_s, "step_s_mean": timed_s / a.steps, "step_s_median": median_s,
        "tokens_per_s": B * T * a.steps / timed_s, "tokens_per_s_median": B * T / median_s,
        "flops_per_step": flops_per_step, "achieved_flops": flops_per_step * a.steps / timed_s,
        "last_loss": loss, "torch": torch.__version__,
    }


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--sizes", default="5M,28M")
    p.add_argument("--precisions", default="fp32,bf16")
    p.add_argument("--threads", type=int, default=0, help="0: all cores (os.cpu_count())")
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--seq", type=int, default=256)
    p.add_argument("--foreach", action="store_true", help="AdamW(foreach=True) instead of torch's default")
    a = p.parse_args()
    a.steps = max(1, a.steps)
    ref.configure_threads(a.threads)
    for size in a.sizes.split(","):
        if size not in SIZES:
            sys.exit(f"unknown size {size} (5M, 28M)")
        for precision in a.precisions.split(","):
            if precision not in ("fp32", "bf16"):
                sys.exit(f"unknown precision {precision}")
            print(json.dumps(run_config(size, precision, a)), flush=True)


if __name__ == "__main__":
    main()
