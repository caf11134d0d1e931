"""GPU checklist helper (bench/gpu/run.sh): the Qwen2.5-0.5B architecture (full fine-tune) and the
Qwen2.5-7B architecture (LoRA), random init, bf16.

Modes:
  hf_train.py [--batch B --seq T --steps N]     train with Hugging Face transformers (PyTorch SDPA
                                                attention), or a plain-PyTorch Qwen2 with SDPA when
                                                transformers is not installed; prints one JSON line
  hf_train.py --compile ...                     the same with torch.compile applied to the loss function
                                                (the model's forward and the cross-entropy: one more line
                                                for an HF user); compile time falls in the warm-up steps.
                                                When torch.compile cannot run (no triton, no C++ compiler,
                                                an unsupported Python) the JSON line has "skip": why
  hf_train.py --lora [--layers L] [--compile]   LoRA (r 16, alpha 32, dropout 0, q/k/v/o/gate/up/down)
                                                with PEFT on the Qwen2.5-7B shape (L of its 28 layers;
                                                all by default): the base built directly in bf16 on the
                                                device, frozen; the adapters fp32; AdamW on the adapters.
                                                No peft (or no transformers) -> a "skip" JSON line
  hf_train.py --write-spec DIR --trainer-out RUN [--lora [--layers L]]
                                                writes DIR/train.jsonl and prints an sftctl job spec
                                                training the same model on it (needs no torch)
  hf_train.py --summarise METRICS.jsonl         sftctl-trainer's metrics -> the same JSON line
  hf_train.py --table SFTCTL.json OTHER.json... the side-by-side table, sftctl's throughput over each other's
  hf_train.py --row PHASE SIDE.json [SFTCTL.json]  one row of run.sh's table (PHASE, ok/SKIP, detail:
                                                tok/s, step ms, peak GiB, sftctl's ratio to it), tab-separated
  hf_train.py --pair SFTCTL.json OTHER.json     the train row's detail: both sides' figures and the ratio
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

Both sides of the full fine-tune: fp32 master weights, bf16 autocast, AdamW, gradient clipping at 1.0,
summed token loss over all B x (T-1) targets, one host read of the loss per step. LoRA: the same, with
the base's weights frozen in bf16 and only the fp32 adapters trained. Throughput counts B x T tokens
per step over the steps after the warm-up (min(5, steps/4); at least 3 with --compile). MFU is the
trainer's, one formula for every row
(trainer/training/gpu_metrics.h, docs/observability.md): the trainer's start record gives its FLOPs per token
(PaLM's 6N + 12 L d T) and the GPU's peak (its table, or --peak-tflops, which reaches the spec as
metrics.gpu_peak_tflops); each row's MFU = those FLOPs per token x the row's tokens/s / that peak.
"""

import argparse
import contextlib
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
# The LoRA rows: Qwen2.5-7B's shapes (7.6B parameters, untied lm_head).
QWEN25_7B = dict(QWEN25_05B, vocab_size=152064, hidden_size=3584, intermediate_size=18944, num_hidden_layers=28,
                 num_attention_heads=28, num_key_value_heads=4, tie_word_embeddings=False)
TINY_LORA = dict(TINY, tie_word_embeddings=False)
# The adapters of both LoRA sides: r 16, alpha 32 (scale 2), no dropout, every projection.
LORA = {"r": 16, "alpha": 32, "dropout": 0.0,
        "target_modules": ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]}


def config(args):
    if getattr(args, "lora", False):
        c = dict(TINY_LORA if args.tiny else QWEN25_7B)
        if args.layers:
            c["num_hidden_layers"] = args.layers
    else:
        c = dict(TINY if args.tiny else QWEN25_05B)
    c["max_position_embeddings"] = max(c["max_position_embeddings"], args.seq)
    return c


def shape_note(args):
    """What model a row trained, in words: "Qwen2.5-7B shape, 4 of its 28 layers"."""
    if not getattr(args, "lora", False):
        return "tiny Qwen2" if args.tiny else "Qwen2.5-0.5B shape"
    if args.tiny:
        return "tiny Qwen2 (untied)"
    full = QWEN25_7B["num_hidden_layers"]
    layers = args.layers or full
    return "Qwen2.5-7B shape" + ("" if layers == full else ", %d of its %d layers" % (layers, full))


def mfu(flops_per_token, tokens_per_s, peak_tflops):
    """The trainer's ModelFlopsUtilisation (trainer/training/gpu_metrics.h) on the trainer's own inputs."""
    if not flops_per_token or not peak_tflops:
        return None
    return round(flops_per_token * tokens_per_s / (peak_tflops * 1e12), 4)


def result(impl, args, tokens_per_s, step_s, peak_mib, extra=None):
    r = {"impl": impl, "batch": args.batch, "seq": args.seq, "tokens_per_s": round(tokens_per_s, 1),
         "step_ms": round(step_s * 1000, 1), "peak_mib": peak_mib, "shape": shape_note(args),
         "steps": args.steps}
    r.update(extra or {})
    return r


def skipped(impl, args, why):
    """A side that cannot run here (no peft, no torch.compile backend): one JSON line saying why, exit 0."""
    print(json.dumps({"impl": impl, "batch": args.batch, "seq": args.seq, "shape": shape_note(args), "skip": why}))
    sys.exit(0)


def first_line(e, n=160):
    """An exception in one line: its type and first line; for a compiler backend's wrapper
    (BackendCompilerFailed), the wrapped exception's, which says what is missing."""
    inner = getattr(e, "inner_exception", None)
    if isinstance(inner, BaseException):
        return ("%s: %s" % (type(e).__name__, first_line(inner, n)))[:n]
    text = str(e).strip().splitlines()
    return ("%s: %s" % (type(e).__name__, text[0]) if text else type(e).__name__)[:n]


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
    if getattr(args, "lora", False):
        # The LoRA row: the base frozen in bf16 (also on a CPU check), fp32 adapters and AdamW state.
        spec["name"] = "gpu-checklist-lora"
        spec["lora"] = {"r": LORA["r"], "alpha": LORA["alpha"], "dropout": LORA["dropout"],
                        "target_modules": LORA["target_modules"], "base_dtype": "bf16"}
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
    print(json.dumps(result(args.impl or "sftctl-trainer", args, tokens / t, t / (len(steps) - 1 - warm), peak,
                            extra)))


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


@contextlib.contextmanager
def built_in_bf16_on(device):
    """Parameters made inside are created in bf16, on DEVICE when torch can (torch >= 2: a device as a
    context manager): a 7B LoRA base never exists in fp32 or on the host."""
    import torch
    old = torch.get_default_dtype()
    torch.set_default_dtype(torch.bfloat16)
    try:
        if hasattr(device, "__enter__"):
            with device:
                yield
        else:
            yield
    finally:
        torch.set_default_dtype(old)


def transformers_model(c, device, lora=False):
    import torch
    import transformers
    from transformers import Qwen2Config, Qwen2ForCausalLM
    cfg = Qwen2Config(**{k: v for k, v in c.items() if k != "model_type"}, attn_implementation="sdpa")
    if lora:
        with built_in_bf16_on(device):
            model = Qwen2ForCausalLM(cfg)
    else:
        model = Qwen2ForCausalLM(cfg)
    model = model.to(device)

    def loss(ids, labels):
        logits = model(input_ids=ids).logits.float()
        return torch.nn.functional.cross_entropy(
            logits[:, :-1].reshape(-1, logits.shape[-1]), labels[:, 1:].reshape(-1), reduction="sum")

    # One step here, so that a transformers version that cannot run this model (an old or too new
    # release, a broken install) falls back before the timing starts, not in the middle of it. (The
    # LoRA base: a forward only, or the whole base would get gradients.)
    ids = torch.zeros(1, 8, dtype=torch.long, device=device)
    if lora:
        with torch.no_grad(), torch.autocast(device.type, dtype=torch.bfloat16):
            loss(ids, ids)
    else:
        with torch.autocast(device.type, dtype=torch.bfloat16):
            loss(ids, ids).backward()
        model.zero_grad(set_to_none=True)
    return model, loss, "transformers %s Qwen2ForCausalLM (sdpa)" % transformers.__version__


def build_model(c, device, lora=False):
    """(model, loss function, description, plain?): transformers' Qwen2, or the plain-PyTorch one when
    transformers is missing or fails. lora: the weights in bf16, made on the device."""
    import torch
    try:
        return transformers_model(c, device, lora) + (False,)
    except Exception as e:  # any failure of the optimized path (not only ImportError): the plain model
        why = "no transformers installed" if isinstance(e, ImportError) else "transformers failed: %s" % (
            str(e).splitlines()[0][:80] if str(e) else type(e).__name__)
    # (Outside the except block: the exception's frames, and the GPU memory they hold, are gone.)
    print("hf_train.py: %s; using the plain-PyTorch Qwen2" % why, file=sys.stderr)
    if device.type == "cuda":
        torch.cuda.empty_cache()
    if lora:
        with built_in_bf16_on(device):
            model = plain_qwen2(c)
    else:
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
    return model, model, "plain PyTorch Qwen2 (%s), %s" % (attn, why), True


def apply_peft(model, plain):
    """PEFT's LoRA (LORA) on MODEL, in place: its base frozen, the adapters fp32 (PEFT's
    autocast_adapter_dtype does so already for a bf16 base; made sure of here). The plain model's
    projections are named q, k, v, o, gate, up, down."""
    import peft
    from peft import LoraConfig, get_peft_model
    targets = [t.split("_")[0] for t in LORA["target_modules"]] if plain else list(LORA["target_modules"])
    get_peft_model(model, LoraConfig(r=LORA["r"], lora_alpha=LORA["alpha"], lora_dropout=LORA["dropout"],
                                     target_modules=targets, bias="none"))
    adapters = 0
    for p in model.parameters():
        if p.requires_grad:
            p.data = p.data.float()
            adapters += p.numel()
    if not adapters:
        raise RuntimeError("PEFT left no trainable parameter (target modules %s)" % targets)
    return "PEFT %s LoRA r %d alpha %g on %d projections (%s fp32 adapter parameters), base frozen in bf16" % (
        peft.__version__, LORA["r"], LORA["alpha"], len(targets), "{:,}".format(adapters))


def torch_mod():
    import torch
    return torch


def compile_unavailable(torch, device):
    """Why torch.compile cannot run here, or None (a failure at the first compiled step is caught too)."""
    if not hasattr(torch, "compile"):
        return "torch %s has no torch.compile" % torch.__version__
    if device.type == "cuda":
        try:
            import triton  # noqa: F401  (inductor's GPU kernels)
        except Exception as e:
            return "no triton for torch.compile's GPU backend (%s)" % first_line(e, 80)
    return None


class CompileFailed(Exception):
    pass


def train_steps(torch, device, args, loss_fn, params, opt, compiled):
    """The timed loop: (seconds, timed steps, last loss). With compiled, compilation happens in the
    warm-up steps; an exception there (other than running out of memory) is CompileFailed."""
    warm = min(5, args.steps // 4)
    if compiled:
        warm = max(warm, min(3, args.steps - 2))
    gen = torch.Generator().manual_seed(0)
    batches = [torch.randint(0, 256, (args.batch, args.seq), generator=gen).to(device) for _ in range(4)]
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    t0 = None
    for step in range(args.steps):
        if step == warm:
            sync()
            t0 = time.perf_counter()
        ids = batches[step % len(batches)]
        try:
            with torch.autocast(device.type, dtype=torch.bfloat16):
                ls = loss_fn(ids, ids)
            (ls / (args.batch * (args.seq - 1))).backward()
        except Exception as e:
            if not compiled or step >= warm or "out of memory" in str(e).lower():
                raise
            why = first_line(e)
        else:
            why = None
        if why:  # (outside the except block: its frames and the memory they hold are gone)
            raise CompileFailed(why)
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        last = ls.item()  # one host read per step, as the trainer logs its loss
    sync()
    return time.perf_counter() - t0, args.steps - warm, last, warm


def train_reference(args):
    torch = torch_mod()
    device = torch.device(args.device)
    impl = args.impl or {(False, False): "hf eager", (False, True): "hf+compile", (True, False): "hf+peft",
                         (True, True): "hf+peft+compile"}[(args.lora, args.compile)]
    if args.compile:
        why = compile_unavailable(torch, device)
        if why:
            skipped(impl, args, why)
    if args.lora:
        try:
            import peft  # noqa: F401
        except Exception as e:
            skipped(impl, args, "no peft (%s)" % first_line(e, 100))
    try:
        reference_run(torch, device, args, impl)
        return
    except Exception as e:
        # Out of memory is a measurement (the reference does not fit this batch on this GPU where
        # the trainer may), not a broken checklist: a JSON line saying so, exit 0.
        if not (isinstance(e, getattr(torch.cuda, "OutOfMemoryError", ())) or "out of memory" in str(e).lower()):
            raise
        why = first_line(e, 100)
    peak = torch.cuda.max_memory_allocated(device) // 2**20 if device.type == "cuda" else None
    print(json.dumps({"impl": impl, "batch": args.batch, "seq": args.seq, "shape": shape_note(args),
                      "oom": "out of GPU memory (%s GiB allocated at most): %s" % (
                          "%.1f" % (peak / 1024) if peak else "?", why)}))


def reference_run(torch, device, args, impl):
    torch.manual_seed(0)
    c = config(args)
    model, loss_fn, what, plain = build_model(c, device, lora=args.lora)
    if args.lora:
        what += "; " + apply_peft(model, plain)
    model.train()
    named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    decay = [p for n, p in named if p.dim() >= 2 and "embed" not in n]
    rest = [p for n, p in named if not (p.dim() >= 2 and "embed" not in n)]
    fused = {"fused": True} if device.type == "cuda" and torch.__version__ >= "2" else {}
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1}, {"params": rest, "weight_decay": 0.0}],
                            lr=1e-4, **fused)
    if args.compile:
        # What an HF user adds in one line: the forward and the loss compiled together (backward by
        # AOTAutograd), default mode; the optimizer step stays eager.
        loss_fn = torch.compile(loss_fn)
        what += "; torch.compile(loss_fn): forward + loss, default mode"
    try:
        t, timed, last, warm = train_steps(torch, device, args, loss_fn, [p for _, p in named], opt, args.compile)
    except CompileFailed as e:
        skipped(impl, args, "torch.compile failed: %s" % e)
    if args.compile:
        what += " (compiled in the %d warm-up steps, not timed)" % warm
    extra = {"model": what, "last_loss_per_token": round(last / (args.batch * (args.seq - 1)), 4)}
    peak = torch.cuda.max_memory_allocated(device) // 2**20 if device.type == "cuda" else None
    print(json.dumps(result(impl, args, timed * args.batch * args.seq / t, t / timed, peak, extra)))


def load_rows(paths):
    return [json.load(open(p)) for p in paths if os.path.exists(p) and os.path.getsize(p) > 0]


def table(args):
    rows = load_rows(args.table)
    if not rows:
        return
    print("%-16s %7s %6s %12s %9s %6s %10s  %s" % ("impl", "batch", "seq", "tokens/s", "step ms", "MFU",
                                                    "peak MiB", "notes"))
    # One MFU: the trainer's FLOPs per token and peak (its start record) for every row.
    inputs = next((r for r in rows if r.get("flops_per_token")), {})
    for r in rows:
        if r.get("skip") or r.get("oom"):
            print("%-16s %7d %6d %12s %9s %6s %10s  %s" % (r["impl"], r["batch"], r["seq"], "-", "-", "-", "-",
                                                           "SKIP: " + r["skip"] if r.get("skip") else r["oom"]))
            continue
        if r.get("mfu") is None:
            r["mfu"] = mfu(inputs.get("flops_per_token"), r["tokens_per_s"], inputs.get("gpu_peak_tflops"))
        share = "%.1f%%" % (100 * r["mfu"]) if r.get("mfu") is not None else "n/a"
        peak = r.get("peak_mib") or "n/a"
        notes = r.get("model", "")
        print("%-16s %7d %6d %12.0f %9.1f %6s %10s  %s" % (r["impl"], r["batch"], r["seq"], r["tokens_per_s"],
                                                             r["step_ms"], share, peak, notes))
    first = rows[0]
    for r in rows[1:]:
        if "tokens_per_s" in r and "tokens_per_s" in first and r["tokens_per_s"] > 0:
            print("%s / %s throughput: %.2fx" % (first["impl"], r["impl"], first["tokens_per_s"] / r["tokens_per_s"]))


def figures(r):
    peak = "%.1f GiB peak" % (r["peak_mib"] / 1024) if r.get("peak_mib") else "peak n/a"
    return "%s tok/s, %.1f ms/step, %s" % ("{:,.0f}".format(r["tokens_per_s"]), r["step_ms"], peak)


def pair(args):
    """The train row's comparison in one line: both sides' figures, sftctl's throughput over the other's."""
    sides = [(load_rows([f]) or [None])[0] for f in args.pair]
    if any(r is None or "tokens_per_s" not in r for r in sides):
        print("no comparison: %s" % ", ".join(
            "%s: %s" % (f, "no result" if r is None else r.get("skip") or r.get("oom")) for f, r in zip(args.pair, sides)
            if r is None or "tokens_per_s" not in r))
        return
    a, b = sides
    print("%s %s; %s %s; %s / %s %.2fx" % (a["impl"], figures(a), b["impl"], figures(b), a["impl"], b["impl"],
                                          a["tokens_per_s"] / b["tokens_per_s"] if b["tokens_per_s"] > 0 else 0.0))


def row(args):
    """PHASE, ok or SKIP, and the detail of one side of a comparison, tab-separated: its figures and
    sftctl's throughput over its own (when SFTCTL.json is given and has figures)."""
    phase, side = args.row[0], args.row[1]
    base = load_rows(args.row[2:3])
    r = (load_rows([side]) or [None])[0]
    if r is None:
        print("%s\tFAIL\tno result in %s" % (phase, side))
        return
    what = "%s, %s, batch %d x %d" % (r["impl"], r.get("shape", "?"), r["batch"], r["seq"])
    if r.get("skip"):
        print("%s\tSKIP\t%s: %s" % (phase, what, r["skip"]))
        return
    if r.get("oom"):
        print("%s\tOOM\t%s: %s" % (phase, what, r["oom"]))
        return
    detail = "%s, %s steps: %s" % (what, r.get("steps", "?"), figures(r))
    if base and "tokens_per_s" in base[0] and r["tokens_per_s"] > 0:
        detail += "; %s / this %.2fx" % (base[0]["impl"], base[0]["tokens_per_s"] / r["tokens_per_s"])
    print("%s\tok\t%s" % (phase, detail))


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--seq", type=int, default=2048)
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--device", default="cuda")
    p.add_argument("--tiny", action="store_true", help="a tiny config (checks on a CPU)")
    p.add_argument("--compile", action="store_true", help="torch.compile the loss function (forward + loss)")
    p.add_argument("--lora", action="store_true", help="LoRA on the Qwen2.5-7B shape (PEFT on the HF side)")
    p.add_argument("--layers", type=int, help="with --lora: this many of the 7B shape's 28 layers")
    p.add_argument("--impl", help="the row's name (default: sftctl-trainer, hf eager, hf+compile, hf+peft, ...)")
    p.add_argument("--peak-tflops", type=float, help="the GPU's dense bf16 peak, when not in the table")
    p.add_argument("--write-spec", metavar="DIR")
    p.add_argument("--trainer-out", metavar="RUN", default="run")
    p.add_argument("--summarise", metavar="METRICS")
    p.add_argument("--table", nargs="+", metavar="JSON")
    p.add_argument("--row", nargs="+", metavar="ARG", help="PHASE SIDE.json [SFTCTL.json]")
    p.add_argument("--pair", nargs=2, metavar="JSON", help="SFTCTL.json OTHER.json: the train row's comparison")
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
    elif args.pair:
        pair(args)
    elif args.row:
        if len(args.row) not in (2, 3):
            p.error("--row PHASE SIDE.json [SFTCTL.json]")
        row(args)
    else:
        train_reference(args)


if __name__ == "__main__":
    main()
