#!/usr/bin/python3
"""time_to_learn: the demo task (client/local/demo.cpp) trained by a PyTorch-Python reference, and the
summaries that compare it with the C++ trainer's run. bench/run_time_to_learn.sh drives it.

Modes:
  train --data DIR [--precision bf16|fp32] [--max-steps 2000] [--eval-interval 100] [--seed 1234]
        [--threads 0] [--log FILE]
      Trains the reference on DIR/train.jsonl, evaluates DIR/eval.jsonl every --eval-interval steps
      and at the end (greedy exact match), prints one JSON line per eval and a summary line last.
      Needs torch: run it with /usr/bin/python3.
  summarize-cpp METRICS.jsonl
      The same summary line from a C++ run's metrics.jsonl.
  compare CPP_SUMMARY.json PY_SUMMARY.json
      The side-by-side table.

Hyperparameters (the demo's, client/local/demo.cpp / shared notes demo-recipe.md): Llama-style model,
hidden 128, 2 layers, 4 heads, SwiGLU 384, RMSNorm eps 1e-5, RoPE theta 10000, untied, init
normal(0, 0.02); byte tokens 0-255, end 256, pad 257; loss over completion + end tokens; AdamW
betas (0.9, 0.95), eps 1e-8, wd 0.1 on 2-D non-embedding weights, clip 1.0; lr 2e-3, 100 warm-up
steps, cosine to 2e-4 at the last step; batch 128, epoch-shuffled with the trainer's Sampler
(SplitMix64, same seed: the same batches in the same order); eval batch 500, max 8 new tokens.

Training time counts optimizer steps only (data batching, forward, backward, clip, AdamW, metric
bookkeeping), never evaluation. For C++: a step record's elapsed_s minus the eval_s of all earlier
evaluations.
"""

import argparse
import json
import math
import os
import sys

M64 = (1 << 64) - 1


def splitmix64(state):
    """Returns (new_state, value), as trainer/training/data.cpp SplitMix64."""
    state = (state + 0x9E3779B97F4A7C15) & M64
    z = state
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & M64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & M64
    return state, z ^ (z >> 31)


class Sampler:
    """trainer::Sampler: each epoch visits every sample once in an order drawn from (seed, epoch);
    the last batch of an epoch is shorter."""

    def __init__(self, n, seed):
        self.n, self.seed, self.epoch, self.pos = n, seed, 0, 0
        self._shuffle()

    def _shuffle(self):
        order = list(range(self.n))
        state = (self.seed * 0x100000001B3 + self.epoch) & M64
        for i in range(self.n, 1, -1):
            state, v = splitmix64(state)
            j = v % i
            order[i - 1], order[j] = order[j], order[i - 1]
        self.order = order

    def next(self, batch_size):
        if self.pos >= self.n:
            self.epoch += 1
            self.pos = 0
            self._shuffle()
        end = min(self.n, self.pos + batch_size)
        out = self.order[self.pos:end]
        self.pos = end
        return out


END, PAD = 256, 257
MODEL = dict(vocab_size=258, hidden_size=128, intermediate_size=384, num_hidden_layers=2,
             num_attention_heads=4, max_position_embeddings=64, rms_norm_eps=1e-5, rope_theta=10000.0,
             initializer_range=0.02)
MAX_SEQ_LEN = 32


def read_samples(path):
    """(ids, labels, prompt_len) per record, as trainer::ReadJsonl with the byte tokenizer."""
    out = []
    with open(path, "rb") as f:
        for line in f:
            if not line.strip():
                continue
            rec = json.loads(line)
            p = list(rec["prompt"].encode("utf-8"))
            c = list(rec["completion"].encode("utf-8")) + [END]
            ids, labels = (p + c)[:MAX_SEQ_LEN], ([-100] * len(p) + c)[:MAX_SEQ_LEN]
            if not any(l != -100 for l in labels[1:]):
                continue
            out.append((ids, labels, len(p)))
    return out


class Collator:
    """Pads batches to their longest sample (as trainer::Collate), from tensors built once."""

    def __init__(self, torch, samples):
        self.torch = torch
        L = max(len(s[0]) for s in samples)
        self.ids = torch.full((len(samples), L), PAD, dtype=torch.int64)
        self.labels = torch.full((len(samples), L), -100, dtype=torch.int64)
        for r, (ids, labels, _) in enumerate(samples):
            self.ids[r, :len(ids)] = torch.tensor(ids, dtype=torch.int64)
            self.labels[r, :len(labels)] = torch.tensor(labels, dtype=torch.int64)
        self.lengths = [len(s[0]) for s in samples]
        self.targets = [sum(1 for l in s[1][1:] if l != -100) for s in samples]

    def __call__(self, idx):
        T = max(self.lengths[i] for i in idx)
        index = self.torch.tensor(idx, dtype=self.torch.int64)
        return (self.ids.index_select(0, index)[:, :T], self.labels.index_select(0, index)[:, :T],
                sum(self.targets[i] for i in idx))


def summarize(impl, precision, evals, steps, train_s, eval_s, extra=None):
    """evals: list of {"step", "exact_match", "train_s"} in step order."""
    s = {"bench": "time_to_learn", "impl": impl, "precision": precision, "steps": steps,
         "train_s": train_s, "eval_s": eval_s, "evals": evals}
    for thr, key in ((0.95, "95"), (0.99, "99")):
        hit = next((e for e in evals if e["exact_match"] >= thr), None)
        s["t" + key] = hit["train_s"] if hit else None
        s["step" + key] = hit["step"] if hit else None
    s["final_exact_match"] = evals[-1]["exact_match"] if evals else None
    s["best_exact_match"] = max((e["exact_match"] for e in evals), default=None)
    if extra:
        s.update(extra)
    return s


def cmd_train(a):
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "reference"))
    import torch

    import llama_ref as ref

    threads = ref.configure_threads(a.threads)
    train = read_samples(os.path.join(a.data, "train.jsonl"))
    evals_data = read_samples(os.path.join(a.data, "eval.jsonl"))
    prompts = [s[0][:s[2]] for s in evals_data]
    expected = [s[0][s[2]:] for s in evals_data]
    max_new = min(8, max(len(e) for e in expected))
    bf16 = a.precision == "bf16"
    log = open(a.log, "w") if a.log else None

    torch.manual_seed(a.seed)
    model = ref.CausalLM(dict(MODEL))
    model.train()
    opt = ref.make_optimizer(model, lr=2e-3, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1,
                             foreach=True if a.foreach else None)
    sampler = Sampler(len(train), a.seed)
    collate = Collator(torch, train)
    total = a.max_steps
    train_s = eval_s = 0.0
    evals = []

    def evaluate(step):
        nonlocal eval_s
        t0 = ref.now()
        model.eval()
        got = ref.greedy_generate(model, prompts, max_new, END, 500, bf16)
        model.train()
        correct = sum(1 for g, e in zip(got, expected) if g == e)
        dt = ref.now() - t0
        eval_s += dt
        rec = {"event": "eval", "step": step, "exact_match": correct / len(prompts), "exact_correct": correct,
               "exact_total": len(prompts), "train_s": train_s, "eval_s": dt}
        evals.append({"step": step, "exact_match": rec["exact_match"], "train_s": train_s})
        print(json.dumps(rec), flush=True)
        if log:
            log.write(json.dumps(rec) + "\n")
            log.flush()

    for step in range(1, total + 1):
        t0 = ref.now()
        ids, labels, targets = collate(sampler.next(128))
        lr = ref.learning_rate(step - 1, 2e-3, 100, total, min_lr_ratio=0.1)
        loss, grad_norm = ref.train_step(model, opt, ids, labels, targets, lr, bf16, clip=1.0)
        if log:  # per-step bookkeeping counts as training time, as the C++ trainer's metrics records do
            log.write(json.dumps({"event": "step", "step": step, "loss": loss, "lr": lr, "grad_norm": grad_norm,
                                  "train_s": train_s + ref.now() - t0}) + "\n")
        train_s += ref.now() - t0
        if (a.eval_interval > 0 and step % a.eval_interval == 0) or step == total:
            evaluate(step)
    s = summarize("python", a.precision, evals, total, train_s, eval_s,
                  {"threads": threads, "torch": torch.__version__, "last_loss": loss})
    print(json.dumps(s), flush=True)


def cmd_summarize_cpp(a):
    steps_elapsed, evals_raw, start = {}, [], {}
    with open(a.metrics) as f:
        for line in f:
            r = json.loads(line)
            ev = r.get("event")
            if ev == "step":
                steps_elapsed[r["step"]] = r["elapsed_s"]
            elif ev == "eval":
                evals_raw.append(r)
            elif ev == "start":
                start = r
    evals, eval_before = [], 0.0
    for r in evals_raw:
        # elapsed_s of step s is taken before the evaluation at step s.
        t = steps_elapsed[r["step"]] - eval_before
        evals.append({"step": r["step"], "exact_match": r["exact_match"], "train_s": t})
        eval_before += r.get("eval_s", 0.0)
    last = max(steps_elapsed) if steps_elapsed else 0
    train_s = steps_elapsed.get(last, 0.0) - sum(r.get("eval_s", 0.0) for r in evals_raw if r["step"] < last)
    s = summarize("cpp", start.get("precision"), evals, last, train_s, eval_before,
                  {"threads": start.get("threads")})
    print(json.dumps(s))


def fmt_t(t, step):
    return "not reached" if t is None else f"{t:7.1f} s (step {step})"


def cmd_compare(a):
    with open(a.cpp) as f:
        cpp = json.loads(f.read().strip().splitlines()[-1])
    with open(a.py) as f:
        py = json.loads(f.read().strip().splitlines()[-1])
    print(f"time_to_learn: demo task, precision {cpp['precision']} (C++) / {py['precision']} (Python), "
          f"threads {cpp.get('threads')} / {py.get('threads')}; training time only (evaluation excluded)")
    print(f"{'':28}{'C++ (sftctl)':>24}{'Python (eager)':>24}{'time C++/Py':>12}")

    def ratio(x, y):
        return "-" if x is None or y is None or y == 0 else f"{x / y:.2f}"

    for key, label in (("95", "time to >= 95% exact match"), ("99", "time to >= 99% exact match")):
        c, p = cpp["t" + key], py["t" + key]
        print(f"{label:28}{fmt_t(c, cpp['step' + key]):>24}{fmt_t(p, py['step' + key]):>24}{ratio(c, p):>12}")
    print(f"{'training time, all steps':28}{cpp['train_s']:>20.1f} s  {py['train_s']:>20.1f} s  "
          f"{ratio(cpp['train_s'], py['train_s']):>10}")
    c_sps, p_sps = cpp["steps"] / cpp["train_s"], py["steps"] / py["train_s"]
    print(f"{'steps/s':28}{c_sps:>22.1f}  {p_sps:>22.1f}  {ratio(1 / c_sps, 1 / p_sps):>10}")
    print(f"{'final exact match':28}{100 * cpp['final_exact_match']:>21.1f}%  "
          f"{100 * py['final_exact_match']:>21.1f}%")
    print(f"{'steps':28}{cpp['steps']:>22}  {py['steps']:>22}")
    r95 = ratio(cpp["t95"], py["t95"])
    verdict = "n/a (95% not reached by both)" if r95 == "-" else ("MET" if float(r95) <= 0.7 else "NOT met")
    print(f"target: C++ time to 95% <= 0.7x Python: {verdict}")


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="mode", required=True)
    t = sub.add_parser("train")
    t.add_argument("--data", required=True, help="folder with train.jsonl and eval.jsonl")
    t.add_argument("--precision", choices=("bf16", "fp32"), default="bf16")
    t.add_argument("--max-steps", type=int, default=2000)
    t.add_argument("--eval-interval", type=int, default=100)
    t.add_argument("--seed", type=int, default=1234)
    t.add_argument("--threads", type=int, default=0, help="0: all cores")
    t.add_argument("--foreach", action="store_true", help="AdamW(foreach=True) instead of torch's default")
    t.add_argument("--log", help="also write step and eval records (JSON lines) here")
    s = sub.add_parser("summarize-cpp")
    s.add_argument("metrics")
    c = sub.add_parser("compare")
    c.add_argument("cpp")
    c.add_argument("py")
    a = p.parse_args()
    {"train": cmd_train, "summarize-cpp": cmd_summarize_cpp, "compare": cmd_compare}[a.mode](a)


if __name__ == "__main__":
    main()
