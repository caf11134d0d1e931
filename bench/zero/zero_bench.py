"""ZeRO-1/2 on CPU ranks: per-rank memory and step time of distributed.shard none / optimizer /
gradients, side by side (bench/zero/run.sh calls this; bench/README.md, "ZeRO").

For each world size W and each stage it starts W sftctl-trainer processes (Gloo on 127.0.0.1, the
environment a supervisor sets: docs/distributed.md), samples every rank's /proc/PID/status every
SAMPLE_S seconds (VmRSS, VmHWM) and follows rank 0's metrics.jsonl, so that:

  peak train    the rank's VmHWM when rank 0's last step record appears (before the final checkpoint)
  peak all      the rank's VmHWM at exit (the final checkpoint included: rank 0 receives every
                rank's AdamW moments one shard at a time and writes them)
  after step    the rank's VmRSS sampled as each step record appears, median over the steps after
                the warm-up: what the rank keeps between steps (weights, gradients, moments)
  s/step        rank 0's step_s, median over the steps after the warm-up

Every rank has the same model, so "max over ranks" is the figure to size a machine by; rank 0 and
the others are shown apart because rank 0 also writes the checkpoint.

Standard library only (runs on /usr/bin/python3 or any python3).
"""
import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import time

STAGES = ("none", "optimizer", "gradients")
SAMPLE_S = 0.05
MIB = 1 << 20


def write_data(path, records, length):
    rng = random.Random(0)
    with open(path, "w") as f:
        for _ in range(records):
            f.write(json.dumps({"text": "".join(rng.choice("abcdefghijklmnopqrstuvwxyz ") for _ in range(length))}) + "\n")


def model_config(a):
    return {"model_type": "llama", "hidden_size": a.hidden, "num_hidden_layers": a.layers,
            "num_attention_heads": a.heads, "num_key_value_heads": a.heads,
            "intermediate_size": a.intermediate, "max_position_embeddings": a.seq}


def parameters(a):
    """Parameters of the llama config (byte tokenizer: vocab 258, untied head, no biases)."""
    c, i, v = a.hidden, a.intermediate, 258
    layer = 4 * c * c + 3 * c * i + 2 * c
    return a.layers * layer + 2 * v * c + c


def write_spec(path, out_dir, data, a, stage):
    json.dump({
        "name": "zero-" + stage, "output_dir": out_dir, "resume": "never", "tokenizer": "byte",
        "precision": "fp32", "threads": a.threads, "seed": 1,
        "model": {"config": model_config(a)},
        "data": {"train": [data], "max_seq_len": a.seq},
        "train": {"batch_size": a.batch, "grad_accum": a.grad_accum, "max_steps": a.steps, "lr": 1e-4,
                  "weight_decay": 0.1, "log_interval": 1000},
        "checkpoint": {"interval": 0, "keep": 1},
        "distributed": {"timeout_s": 900, "bucket_mb": 25, "shard": stage},
    }, open(path, "w"))


def status_kib(pid):
    """(VmRSS, VmHWM) in KiB, or None once the process is gone."""
    try:
        with open(f"/proc/{pid}/status") as f:
            text = f.read()
    except OSError:
        return None
    vals = {}
    for line in text.splitlines():
        if line.startswith(("VmRSS:", "VmHWM:")):
            vals[line.split(":")[0]] = int(line.split()[1])
    if "VmRSS" not in vals:
        return None  # a zombie
    return vals["VmRSS"], vals["VmHWM"]


def steps_of(metrics):
    try:
        with open(metrics) as f:
            lines = f.read().splitlines()
    except OSError:
        return []
    out = []
    for line in lines:
        try:
            r = json.loads(line)
        except ValueError:
            continue  # a line being written
        if r.get("event") == "step":
            out.append(r)
    return out


def run(trainer, spec, out_dir, world, port, env_extra, steps):
    env = dict(os.environ, **env_extra)
    env.update(WORLD_SIZE=str(world), LOCAL_WORLD_SIZE=str(world), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    procs = []
    for r in range(world):
        e = dict(env, RANK=str(r), LOCAL_RANK=str(r))
        log = open(f"{out_dir}-rank{r}.log", "w")
        procs.append(subprocess.Popen([trainer, "train", "--spec", spec], env=e, stdout=log, stderr=subprocess.STDOUT))
    hwm = [0] * world                 # the last VmHWM seen (KiB)
    after = [[] for _ in range(world)]  # VmRSS (KiB) as each step record appeared
    train_peak = None
    seen = 0
    metrics = os.path.join(out_dir, "metrics.jsonl")
    while any(p.poll() is None for p in procs):
        now = [status_kib(p.pid) for p in procs]
        for r, v in enumerate(now):
            if v:
                hwm[r] = max(hwm[r], v[1])
        recs = steps_of(metrics)
        if len(recs) > seen:
            for r, v in enumerate(now):
                if v:
                    after[r].append(v[0])
            seen = len(recs)
            if seen >= steps and train_peak is None:
                train_peak = list(hwm)
        time.sleep(SAMPLE_S)
    rcs = [p.wait() for p in procs]
    if any(rcs):
        for r in range(world):
            sys.stderr.write(f"--- rank {r} (exit {rcs[r]}):\n" + open(f"{out_dir}-rank{r}.log").read()[-3000:])
        raise SystemExit(f"zero_bench: a rank failed ({out_dir})")
    return hwm, train_peak or list(hwm), after, steps_of(metrics)


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--trainer", required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--ranks", default="2,4")
    p.add_argument("--stages", default=",".join(STAGES))
    p.add_argument("--steps", type=int, default=6)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--batch", type=int, default=2, help="sequences per micro-batch, per rank")
    p.add_argument("--grad-accum", type=int, default=2)
    p.add_argument("--seq", type=int, default=64)
    p.add_argument("--hidden", type=int, default=768)
    p.add_argument("--layers", type=int, default=7)
    p.add_argument("--heads", type=int, default=12)
    p.add_argument("--intermediate", type=int, default=2048)
    p.add_argument("--threads", type=int, default=1, help="threads per rank")
    p.add_argument("--glibc-default", action="store_true",
                   help="do not set MALLOC_MMAP_THRESHOLD_ (glibc keeps freed gradients resident)")
    a = p.parse_args()
    if a.steps <= a.warmup:
        raise SystemExit("zero_bench: --steps must be larger than --warmup")
    os.makedirs(a.out, exist_ok=True)
    data = os.path.join(a.out, "train.jsonl")
    worlds = [int(w) for w in a.ranks.split(",")]
    stages = a.stages.split(",")
    write_data(data, max(worlds) * a.batch * a.grad_accum * (a.steps + 1), a.seq + 8)
    env = {} if a.glibc_default else {"MALLOC_MMAP_THRESHOLD_": "131072"}
    n = parameters(a)
    print(f"ZeRO on CPU ranks: llama hidden {a.hidden}, {a.layers} layers, intermediate {a.intermediate}, "
          f"{n / 1e6:.1f}M parameters (fp32 weights {4 * n / MIB:.0f} MiB); per rank batch {a.batch} x "
          f"grad_accum {a.grad_accum} x seq {a.seq}, {a.threads} thread(s); {a.steps} steps, medians over the "
          f"last {a.steps - a.warmup}; "
          + ("glibc malloc defaults" if a.glibc_default else "MALLOC_MMAP_THRESHOLD_=131072"), file=sys.stderr)
    rows = []
    port = 21000 + random.randrange(20000)
    for w in worlds:
        for stage in stages:
            name = f"w{w}-{stage}"
            spec = os.path.join(a.out, name + ".json")
            run_dir = os.path.join(a.out, name)
            write_spec(spec, run_dir, data, a, stage)
            t0 = time.time()
            print(f"  {w} ranks, shard {stage} ...", end="", flush=True, file=sys.stderr)
            hwm, train_peak, after, recs = run(a.trainer, spec, run_dir, w, port, env, a.steps)
            port += 1
            print(f" {time.time() - t0:.0f} s", file=sys.stderr)
            timed = recs[a.warmup:]
            steady = [statistics.median(x[a.warmup:] or x) if x else float("nan") for x in after]
            row = {"ranks": w, "stage": stage,
                   "peak_train_mib": [k / 1024 for k in train_peak], "peak_all_mib": [k / 1024 for k in hwm],
                   "after_step_mib": [k / 1024 for k in steady],
                   "s_per_step": statistics.median(r["step_s"] for r in timed) if timed and "step_s" in timed[0]
                   else (timed[-1]["elapsed_s"] - recs[a.warmup - 1]["elapsed_s"]) / len(timed),
                   "allreduce_s": statistics.median(r.get("allreduce_s", 0) for r in timed),
                   "last_loss": recs[-1]["loss"]}
            rows.append(row)
            with open(os.path.join(a.out, "results.jsonl"), "a") as f:
                f.write(json.dumps(row) + "\n")
            # The checkpoint (about 12 bytes per parameter) is not needed once measured.
            subprocess.run(["rm", "-rf"] + [os.path.join(run_dir, d) for d in os.listdir(run_dir) if d.startswith("checkpoint")])
    table(rows, a)


def table(rows, a):
    def fmt(xs):
        hi = max(xs)
        rest = xs[1:]
        if not rest or max(abs(x - xs[0]) for x in rest) < 0.02 * hi:
            return f"{hi:.0f}"
        return f"{xs[0]:.0f}/{max(rest):.0f}"
    base = {r["ranks"]: r for r in rows if r["stage"] == "none"}
    print()
    print("per rank, MiB: max over ranks, or rank 0/others where they differ by more than 2%; "
          "x = ratio to `none` at the same ranks (max over ranks)")
    head = (f"{'ranks':>5} {'shard':<10} {'peak train':>11} {'x':>6} {'peak w/ ckpt':>13} {'x':>6} "
            f"{'after step':>11} {'x':>6} {'s/step':>7} {'x':>6} {'comm s':>7} {'last loss':>10}")
    print(head)
    for r in rows:
        b = base.get(r["ranks"])
        def ratio(key):
            return f"{max(r[key]) / max(b[key]):.2f}" if b else "-"
        st = f"{r['s_per_step'] / b['s_per_step']:.2f}" if b else "-"
        print(f"{r['ranks']:>5} {r['stage']:<10} {fmt(r['peak_train_mib']):>11} {ratio('peak_train_mib'):>6} "
              f"{fmt(r['peak_all_mib']):>13} {ratio('peak_all_mib'):>6} {fmt(r['after_step_mib']):>11} "
              f"{ratio('after_step_mib'):>6} {r['s_per_step']:>7.2f} {st:>6} {r['allreduce_s']:>7.2f} "
              f"{r['last_loss']:>10.5f}")
    n = parameters(a)
    print()
    print("expected saving per rank vs none (docs/memory.md): optimizer 8(W-1)/W bytes per parameter "
          + ", ".join(f"W={w}: {8 * (w - 1) / w * n / MIB:.0f} MiB" for w in sorted(base))
          + "; gradients 12(W-1)/W: "
          + ", ".join(f"W={w}: {12 * (w - 1) / w * n / MIB:.0f} MiB" for w in sorted(base)))


if __name__ == "__main__":
    main()
