"""GPU checklist helper (bench/gpu/run.sh): the Qwen2.5-0.5B architecture, random init, bf16.

Modes:
  hf_train.py [--batch B --seq T --steps N]     train with Hugging Face transformers (PyTorch SDPA
                                                attention), or a plain-PyTorch Qwen2 with SDPA when
                                                transformers is not installed; prints one JSON line
  hf_train.py --write-spec DIR --trainer-out RUN  writes DIR/train.jsonl and prints an sftctl job
                                                spec training the same model on it
  hf_train.py --summarise METRICS.jsonl         sftctl-trainer's metrics -> the same JSON line
  hf_train.py --table SFTCTL.json HF.json       the side-by-side table
  hf_train.py --write-resume-specs DIR --steps 2K  a save / rotate / resume check: DIR/train.jsonl and
                                                three specs (full.json: 2K steps uninterrupted; part.json:
                                                the first K in DIR/part; resume.json: on to 2K there),
                                                checkpoints every K steps, keep 1, deterministic, constant lr
  hf_train.py --compare-resume DIR --steps 2K   the resumed run's step losses against the uninterrupted
                                                one's (equal: deterministic), the resume and the rotation;
                                                one line, exit 1 when they differ
  --device cpu --tiny                           a few-second check of this script on a CPU

Peak memory is torch's own allocator statistics on both sides (torch.cuda.max_memory_allocated here;
the trainer's GPU peak from its metrics), not nvidia-smi, whose per-process figures a container hides.

Both sides: fp32 master weights, bf16 autocast, AdamW, gradient clipping at 1.0, summed token loss
over all B x (T-1) targets, one host read of the loss per step. Throughput counts B x T tokens per
step over the steps after the warm-up. MFU is the trainer's, one formula for both rows
(trainer/training/gpu_metrics.h, docs/observability.md): the trainer's start record gives its FLOPs per token
(PaLM's 6N + 12 L d T) and the GPU's peak (its table, or --peak-tflops, which reaches the spec as
metrics.gpu_peak_tflops); each row's MFU = those FLOPs per token x the row's tokens/s / that peak.
"""

import argparse
import json
import math
import os
import random
import sys
import time

QWEN25_05B = {
    "model_type": "qwen2",
    "vocab_size": 151936,
    "hidden_size": 896,
    "intermediate_size": 4864,
    "num_hidden_layers": 24,
    "num_attention_heads": 14,
    "num_key_value_heads": 2,
    "max_position_embeddings": 32768,
    "rope_theta": 1000000.0,
    "rms_norm_eps": 1e-6,
    "tie_word_embeddings": True,
}
TINY = dict(QWEN25_05B, vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
            num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256)

def config(args):
    c = dict(TINY if args.tiny else QWEN25_05B)
    c["max_position_embeddings"] = max(c["max_position_embeddings"], args.seq)
    return c


def mfu(flops_per_token, tokens_per_s, peak_tflops):
    """The trainer's ModelFlopsUtilisation (trainer/training/gpu_metrics.h) on the trainer's own inputs."""
    if not flops_per_token or not peak_tflops:
        return None
    return round(flops_per_token * tokens_per_s / (peak_tflops * 1e12), 4)


def result(impl, args, tokens_per_s, step_s, peak_mib, extra=None):
    r = {"impl": impl, "batch": args.batch, "seq": args.seq, "tokens_per_s": round(tokens_per_s, 1),
         "step_ms": round(step_s * 1000, 1), "peak_mib": peak_mib}
    r.update(extra or {})
    return r


# ---- sftctl side --------------------------------------------------------------------------------

def write_spec(args):
    print(json.dumps(make_spec(args, args.trainer_out), indent=2))


def make_spec(args, output_dir):
    """Random printable text, each record longer than seq bytes (the byte tokenizer; truncated):
    DIR/train.jsonl, and the job spec training on it."""
    os.makedirs(args.write_spec, exist_ok=True)
    rng = random.Random(0)
    data = os.path.join(args.write_spec, "train.jsonl")
    n = args.batch * (args.steps + 2)
    alphabet = "abcdefghijklmnopqrstuvwxyz ABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789.,;\n"
    with open(data, "w") as f:
        for _ in range(n):
            f.write(json.dumps({"text": "".join(rng.choice(alphabet) for _ in range(args.seq + 16))}) + "\n")
    spec = {
        "name": "gpu-checklist", "output_dir": output_dir, "seed": 0, "device": args.device,
        "precision": "bf16", "tokenizer": "byte", "model": {"config": config(args)},
        "data": {"train": [data], "format": "text", "max_seq_len": args.seq, "packing": False},
        "train": {"batch_size": args.batch, "grad_accum": 1, "lr": 1e-4, "warmup_steps": 0,
                  "weight_decay": 0.1, "clip_grad_norm": 1.0, "max_steps": args.steps, "log_interval": 1},
        "eval": {"interval": 0}, "checkpoint": {"interval": 0, "keep": 1},
    }
    if getattr(args, "peak_tflops", None):
        spec["metrics"] = {"gpu_peak_tflops": args.peak_tflops}
    return spec


# ---- save, rotate, resume (bench/gpu/run.sh's train row) -----------------------------------------

def write_resume_specs(args):
    """The same job three times over one data file: uninterrupted (full), stopped at K (part), and
    continued to 2K in part's folder (resume). Constant lr, so a job stopped at K follows the same
    schedule as one that runs on; deterministic kernels, so the resumed losses must be equal."""
    d = args.write_resume_specs
    if args.steps < 2 or args.steps % 2:
        sys.exit("hf_train.py: --steps must be even and >= 2 for --write-resume-specs (got %d)" % args.steps)
    half = args.steps // 2
    args.write_spec = d
    base = make_spec(args, os.path.join(d, "full"))
    base["deterministic"] = True
    base["train"]["schedule"] = "constant"
    base["checkpoint"] = {"interval": half, "keep": 1}
    for name, steps, run in (("full", args.steps, "full"), ("part", half, "part"), ("resume", args.steps, "part")):
        spec = json.loads(json.dumps(base))
        spec["output_dir"] = os.path.join(d, run)
        spec["train"]["max_steps"] = steps
        with open(os.path.join(d, name + ".json"), "w") as f:
            json.dump(spec, f, indent=2)


def step_losses(metrics):
    """step -> loss of a metrics.jsonl (a resumed run appends: the last record of a step wins), and
    the start records."""
    losses, starts = {}, []
    for r in map(json.loads, open(metrics)):
        if r.get("event") == "step":
            losses[r["step"]] = r["loss"]
        elif r.get("event") == "start":
            starts.append(r)
    return losses, starts


def checkpoints(run):
    return sorted(n for n in os.listdir(run) if n.startswith("checkpoint-") or n.startswith(".tmp-"))


def compare_resume(args):
    d, n = args.compare_resume, args.steps
    half = n // 2
    full, _ = step_losses(os.path.join(d, "full", "metrics.jsonl"))
    part, starts = step_losses(os.path.join(d, "part", "metrics.jsonl"))
    problems = []
    missing = [s for s in range(1, n + 1) if s not in full or s not in part]
    if missing:
        problems.append("steps without a loss: %s" % missing[:5])
    resumed = [s.get("resumed_from", "") for s in starts]
    if len(resumed) != 2 or not resumed[1].rstrip("/").endswith("checkpoint-%06d" % half):
        problems.append("the second run did not resume from checkpoint-%06d (start records: %s)" % (half, resumed))
    diffs = [abs(full[s] - part[s]) for s in range(half + 1, n + 1) if s in full and s in part]
    worst = max(diffs) if diffs else float("nan")
    if diffs and worst != 0.0:
        problems.append("resumed losses differ from the uninterrupted run's by up to %.3g" % worst)
    want = ["checkpoint-%06d" % n]
    for run in ("full", "part"):
        left = checkpoints(os.path.join(d, run))
        if left != want:
            problems.append("%s left %s, not %s (keep: 1)" % (run, left, want))
    if problems:
        print("resume FAIL: " + "; ".join(problems))
        sys.exit(1)
    print("resume ok: steps %d-%d after resuming at step %d equal the uninterrupted run's (max |diff| 0, "
          "final loss %.4f); keep 1 left %s alone" % (half + 1, n, half, full[n], want[0]))


def summarise(args):
    records = list(map(json.loads, open(args.summarise)))
    start = next((r for r in records if r.get("event") == "start"), {})
    steps = [r for r in records if r.get("event") == "step"]
    warm = min(5, len(steps) // 4)
    if len(steps) - warm < 2:
        sys.exit("hf_train.py: too few step records in %s" % args.summarise)
    t = steps[-1]["elapsed_s"] - steps[warm]["elapsed_s"]
    tokens = sum(r["tokens"] for r in steps[warm + 1:])
    peak = trainer_peak_mib(steps)
    extra = {} if peak is not None else {"model": "the trainer's metrics carry no GPU peak"}
    # The MFU inputs the trainer used: the table below applies them to the reference row too.
    extra["flops_per_token"] = start.get("flops_per_token")
    extra["gpu_peak_tflops"] = start.get("gpu_peak_tflops")
    extra["mfu"] = mfu(extra["flops_per_token"], tokens / t, extra["gpu_peak_tflops"])
    print(json.dumps(result("sftctl-trainer", args, tokens / t, t / (len(steps) - 1 - warm), peak, extra)))


def trainer_peak_mib(records):
    """The largest GPU peak-allocated figure in the step records (torch's caching-allocator statistics,
    which the trainer reports on CUDA): a field whose name says GPU/CUDA, peak, and MiB or bytes."""
    best = None
    for r in records:
        for k, v in r.items():
            name = k.lower()
            if not isinstance(v, (int, float)) or "peak" not in name or not ("gpu" in name or "cuda" in name):
                continue
            mib = v / 2**20 if name.endswith("bytes") else v if name.endswith(("mib", "_mb")) else None
            if mib is not None and (best is None or mib > best):
                best = mib
    return int(best) if best is not None else None


# ---- Hugging Face (or plain PyTorch) side -------------------------------------------------------

def plain_qwen2(c):
    """A Qwen2 decoder in plain PyTorch with SDPA: for machines without transformers."""
    import torch
    import torch.nn as nn
    import torch.nn.functional as F

    h, nh, nkv = c["hidden_size"], c["num_attention_heads"], c["num_key_value_heads"]
    hd = h // nh

    class Norm(nn.Module):
        def __init__(self):
            super().__init__()
            self.weight = nn.Parameter(torch.ones(h))

        def forward(self, x):
            xf = x.float()
            return self.weight * (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + c["rms_norm_eps"])).to(x.dtype)

    def rotate(x):
        return torch.cat((-x[..., hd // 2:], x[..., :hd // 2]), -1)

    class Layer(nn.Module):
        def __init__(self):
            super().__init__()
            self.q, self.k, self.v = nn.Linear(h, h), nn.Linear(h, nkv * hd), nn.Linear(h, nkv * hd)
            self.o = nn.Linear(h, h, bias=False)
            self.gate, self.up = nn.Linear(h, c["intermediate_size"], bias=False), nn.Linear(h, c["intermediate_size"], bias=False)
            self.down = nn.Linear(c["intermediate_size"], h, bias=False)
            self.n1, self.n2 = Norm(), Norm()

        def forward(self, x, cos, sin):
            B, T, _ = x.shape
            y = self.n1(x)
            q = self.q(y).view(B, T, nh, hd).transpose(1, 2)
            k = self.k(y).view(B, T, nkv, hd).transpose(1, 2)
            v = self.v(y).view(B, T, nkv, hd).transpose(1, 2)
            q, k = q * cos + rotate(q) * sin, k * cos + rotate(k) * sin
            if hasattr(F, "scaled_dot_product_attention"):
                k, v = k.repeat_interleave(nh // nkv, 1), v.repeat_interleave(nh // nkv, 1)
                a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            else:  # torch 1.x (the CPU check here)
                k, v = k.repeat_interleave(nh // nkv, 1), v.repeat_interleave(nh // nkv, 1)
                s = (q @ k.transpose(-1, -2)).float() / math.sqrt(hd)
                s = s.masked_fill(torch.ones(T, T, dtype=torch.bool, device=x.device).triu(1), float("-inf"))
                a = s.softmax(-1).to(v.dtype) @ v
            x = x + self.o(a.transpose(1, 2).reshape(B, T, h))
            y = self.n2(x)
            return x + self.down(F.silu(self.gate(y)) * self.up(y))

    class Model(nn.Module):
        def __init__(self):
            super().__init__()
            self.embed = nn.Embedding(c["vocab_size"], h)
            self.layers = nn.ModuleList(Layer() for _ in range(c["num_hidden_layers"]))
            self.norm = Norm()
            inv = 1.0 / (c["rope_theta"] ** (torch.arange(0, hd, 2).float() / hd))
            f = torch.outer(torch.arange(c["max_position_embeddings"]).float(), inv)
            self.register_buffer("cos", torch.cat((f, f), -1).cos(), persistent=False)
            self.register_buffer("sin", torch.cat((f, f), -1).sin(), persistent=False)

        def forward(self, ids, labels):
            T = ids.shape[1]
            x = self.embed(ids)
            cos, sin = self.cos[:T].to(x.dtype), self.sin[:T].to(x.dtype)
            for layer in self.layers:
                x = layer(x, cos, sin)
            logits = F.linear(self.norm(x), self.embed.weight).float()
            return F.cross_entropy(logits[:, :-1].reshape(-1, logits.shape[-1]), labels[:, 1:].reshape(-1),
                                   reduction="sum")

    return Model()


def transformers_model(c, device):
    import torch
    import transformers
    from transformers import Qwen2Config, Qwen2ForCausalLM
    cfg = Qwen2Config(**{k: v for k, v in c.items() if k != "model_type"}, attn_implementation="sdpa")
    model = Qwen2ForCausalLM(cfg).to(device)

    def loss(ids, labels):
        logits = model(input_ids=ids).logits.float()
        return torch.nn.functional.cross_entropy(
            logits[:, :-1].reshape(-1, logits.shape[-1]), labels[:, 1:].reshape(-1), reduction="sum")

    # One step here, so that a transformers version that cannot run this model (an old or too new
    # release, a broken install) falls back before the timing starts, not in the middle of it.
    ids = torch.zeros(1, 8, dtype=torch.long, device=device)
    with torch.autocast(device.type, dtype=torch.bfloat16):
        loss(ids, ids).backward()
    model.zero_grad(set_to_none=True)
    return model, loss, "transformers %s Qwen2ForCausalLM (sdpa)" % transformers.__version__


def build_model(c, device):
    import torch
    try:
        return transformers_model(c, device)
    except Exception as e:  # any failure of the optimized path (not only ImportError): the plain model
        why = "no transformers installed" if isinstance(e, ImportError) else "transformers failed: %s" % (
            str(e).splitlines()[0][:80] if str(e) else type(e).__name__)
    # (Outside the except block: the exception's frames, and the GPU memory they hold, are gone.)
    print("hf_train.py: %s; using the plain-PyTorch Qwen2" % why, file=sys.stderr)
    if device.type == "cuda":
        torch.cuda.empty_cache()
    model = plain_qwen2(c)
    with torch.no_grad():  # transformers' initialisation
        for n, p in model.named_parameters():
            if n.endswith("bias"):
                p.zero_()
            elif "n1" in n or "n2" in n or n.startswith("norm"):
                p.fill_(1.0)
            else:
                p.normal_(0.0, 0.02)
    model = model.to(device)
    attn = "SDPA" if hasattr(torch.nn.functional, "scaled_dot_product_attention") else "manual attention"
    return model, model, "plain PyTorch Qwen2 (%s), %s" % (attn, why)


def torch_mod():
    import torch
    return torch


def train_reference(args):
    torch = torch_mod()
    device = torch.device(args.device)
    torch.manual_seed(0)
    c = config(args)
    model, loss_fn, impl = build_model(c, device)
    model.train()
    decay = [p for n, p in model.named_parameters() if p.dim() >= 2 and "embed" not in n]
    rest = [p for n, p in model.named_parameters() if not (p.dim() >= 2 and "embed" not in n)]
    fused = {"fused": True} if device.type == "cuda" and torch.__version__ >= "2" else {}
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1}, {"params": rest, "weight_decay": 0.0}],
                            lr=1e-4, **fused)
    gen = torch.Generator().manual_seed(0)
    batches = [torch.randint(0, 256, (args.batch, args.seq), generator=gen).to(device) for _ in range(4)]
    warm = min(5, args.steps // 4)
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    t0 = None
    for step in range(args.steps):
        if step == warm:
            sync()
            t0 = time.perf_counter()
        ids = batches[step % len(batches)]
        with torch.autocast(device.type, dtype=torch.bfloat16):
            ls = loss_fn(ids, ids)
        (ls / (args.batch * (args.seq - 1))).backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        last = ls.item()  # one host read per step, as the trainer logs its loss
    sync()
    t = time.perf_counter() - t0
    timed = args.steps - warm
    extra = {"model": impl, "last_loss_per_token": round(last / (args.batch * (args.seq - 1)), 4)}
    peak = torch.cuda.max_memory_allocated(device) // 2**20 if device.type == "cuda" else None
    print(json.dumps(result("hf", args, timed * args.batch * args.seq / t, t / timed, peak, extra)))


def table(args):
    rows = [json.load(open(p)) for p in args.table if os.path.exists(p) and os.path.getsize(p) > 0]
    if not rows:
        return
    print("%-16s %7s %6s %12s %9s %6s %10s  %s" % ("impl", "batch", "seq", "tokens/s", "step ms", "MFU",
                                                    "peak MiB", "notes"))
    # One MFU: the trainer's FLOPs per token and peak (its start record) for every row.
    inputs = next((r for r in rows if r.get("flops_per_token")), {})
    for r in rows:
        if r.get("mfu") is None:
            r["mfu"] = mfu(inputs.get("flops_per_token"), r["tokens_per_s"], inputs.get("gpu_peak_tflops"))
        share = "%.1f%%" % (100 * r["mfu"]) if r.get("mfu") is not None else "n/a"
        peak = r.get("peak_mib") or "n/a"
        notes = r.get("model", "")
        print("%-16s %7d %6d %12.0f %9.1f %6s %10s  %s" % (r["impl"], r["batch"], r["seq"], r["tokens_per_s"],
                                                             r["step_ms"], share, peak, notes))
    if len(rows) == 2 and rows[1]["tokens_per_s"] > 0:
        print("sftctl / reference throughput: %.2fx" % (rows[0]["tokens_per_s"] / rows[1]["tokens_per_s"]))


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--seq", type=int, default=2048)
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--device", default="cuda")
    p.add_argument("--tiny", action="store_true", help="a tiny config (checks on a CPU)")
    p.add_argument("--peak-tflops", type=float, help="the GPU's dense bf16 peak, when not in the table")
    p.add_argument("--write-spec", metavar="DIR")
    p.add_argument("--trainer-out", metavar="RUN", default="run")
    p.add_argument("--summarise", metavar="METRICS")
    p.add_argument("--table", nargs="+", metavar="JSON")
    p.add_argument("--write-resume-specs", metavar="DIR")
    p.add_argument("--compare-resume", metavar="DIR")
    args = p.parse_args()
    if args.write_resume_specs:
        write_resume_specs(args)
    elif args.compare_resume:
        compare_resume(args)
    elif args.write_spec:
        write_spec(args)
    elif args.summarise:
        summarise(args)
    elif args.table:
        table(args)
    else:
        train_reference(args)


if __name__ == "__main__":
    main()
