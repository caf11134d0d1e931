#!/usr/bin/env bash
# llama.cpp itself against `sftctl-trainer generate`: for each family (llama, qwen2, qwen3, gemma2,
# gemma3_text, phi3) a from-scratch random model is written as an HF folder, exported with
# `TRAINER_BIN export --gguf --type f32`, and 20 prompts are continued greedily for 16 tokens by
# llama.cpp (llama-completion) and by `TRAINER_BIN generate`; every continuation must match exactly.
#
#   tests/reference/llama_cpp_greedy.sh TRAINER_BIN WORK_DIR [FAMILY...]
#
# Needs python3 with torch, numpy and safetensors, and llama-completion on PATH (or $LLAMA_COMPLETION).
# Run it where both exist, e.g. in the Debian forky root (tests/portability/). Exit 0: every family
# and prompt matched; 1: a mismatch or a failing tool (family, prompt and both outputs printed);
# 2: usage or a missing tool -- it never passes by skipping.
#
# The models: random weights, not trained. Why that is enough: greedy decoding of a random model
# is decisive when no two logits are near-tied, so (a) the lm_head rows of every token but the
# printable ASCII bytes and the merges are zero, which makes every continuation printable text
# (compared exactly, no UTF-8 fragments, no end token: both sides generate exactly 16 tokens), and
# (b) the weights are N(0, 1/fan_in)-scaled with norms and a final norm that give logits of a few
# units' spread over ~100 candidates, where the gap between the two best is ~1 while float32
# llama.cpp and LibTorch differ by ~1e-5 relative. llama.cpp runs on the CPU with an F32 model, an
# F32 KV cache and flash attention off; Gemma's MLP output is scaled down by its
# post_feedforward_layernorm (ggml's GELU is an fp16 table lookup, ~1e-3 relative). Each config
# exercises what llama.cpp must read from the file: llama's Llama-3 RoPE scaling (rope_freqs) and
# q/k row order, qwen2's biases, qwen3's head_dim != hidden/heads and q/k norms, gemma2's
# sliding window (8, shorter than the prompts), attention and final soft-capping and folded
# (1 + w) norms, gemma3's sliding-window pattern (3), local RoPE base and linear scaling of the
# full layers, phi3's fused qkv / gate_up, partial rotary factor and longrope short factors with
# their attention factor (llama.cpp's context, 256, is the original_max_position_embeddings, so
# both sides use the short factors).
set -euo pipefail

if [[ $# -lt 2 ]]; then
  echo "usage: $0 TRAINER_BIN WORK_DIR [FAMILY...]" >&2
  exit 2
fi
TRAINER=$1
WORK=$2
shift 2
LLAMA=${LLAMA_COMPLETION:-$(command -v llama-completion || true)}
if [[ -z "$LLAMA" || ! -x "$LLAMA" ]]; then
  echo "llama_cpp_greedy: FAILED: llama-completion not found (PATH or \$LLAMA_COMPLETION); this check needs llama.cpp" >&2
  exit 2
fi
if [[ ! -x "$TRAINER" ]]; then
  echo "llama_cpp_greedy: FAILED: trainer binary '$TRAINER' is not executable" >&2
  exit 2
fi
mkdir -p "$WORK"

exec python3 - "$TRAINER" "$WORK" "$LLAMA" "$@" <<'PY'
import json, math, os, shutil, subprocess, sys, time

import torch
from safetensors.torch import save_file

trainer, work, llama = sys.argv[1:4]
families = sys.argv[4:] or ["llama", "qwen2", "qwen3", "gemma2", "gemma3_text", "phi3"]
NEW_TOKENS = 16
CTX = 256
PROMPTS = [
    "the cat sat on the mat", "Hello, world!", "1 2 3 4 5", "in the beginning there was",
    "To be or not to be", "abc", "The quick brown fox jumps over the lazy dog", "x",
    "SELECT * FROM users WHERE id = 7;", "once upon a time", "def main():", "42",
    "e = m c^2", "rain, rain, go away", "What is 12+34?", "Lorem ipsum dolor sit amet",
    "the the the the", "[1, 2, 3]", "ZZZ top", "a b c d e f g h i j k l m n o p",
]


def bytes_to_unicode():
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("\xa1"), ord("\xac") + 1)) + \
        list(range(ord("\xae"), ord("\xff") + 1))
    cs, n = bs[:], 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(bs, map(chr, cs)))


B2U = bytes_to_unicode()
MERGES = [("t", "h"), ("th", "e"), (" ", "t"), ("i", "n"), ("e", "r")]
QWEN2_REGEX = r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"""
LLAMA3_REGEX = r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"""
VOCAB = 320  # 256 bytes + 5 merges + 3 added tokens, padded


def bl(s):
    return "".join(B2U[b] for b in s.encode())


def write_tokenizer(d, family):
    vocab = {B2U[b]: b for b in range(256)}
    merges = []
    for i, (a, b) in enumerate(MERGES):
        vocab[bl(a + b)] = 256 + i
        merges.append(bl(a) + " " + bl(b))
    llama = family == "llama"
    added = ["<|begin_of_text|>", "<|end_of_text|>", "<|eot_id|>"] if llama else \
        ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    added_tokens = [{"id": 261 + i, "content": t, "special": True, "lstrip": False, "rstrip": False,
                     "normalized": False, "single_word": False} for i, t in enumerate(added)]
    post = None
    if llama:
        post = {"type": "TemplateProcessing",
                "single": [{"SpecialToken": {"id": added[0], "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}}],
                "pair": [], "special_tokens": {}}
    pre = {"type": "Sequence", "pretokenizers": [
        {"type": "Split", "pattern": {"Regex": LLAMA3_REGEX if llama else QWEN2_REGEX}, "behavior": "Isolated",
         "invert": False},
        {"type": "ByteLevel", "add_prefix_space": False, "use_regex": False}]}
    tok = {"version": "1.0", "added_tokens": added_tokens, "normalizer": None, "pre_tokenizer": pre,
           "post_processor": post, "decoder": {"type": "ByteLevel"},
           "model": {"type": "BPE", "dropout": None, "vocab": vocab, "merges": merges}}
    with open(os.path.join(d, "tokenizer.json"), "w") as f:
        json.dump(tok, f)
    tc = {"bos_token": added[0], "eos_token": added[2]} if llama else \
        {"bos_token": None, "eos_token": added[2], "pad_token": added[0], "add_bos_token": False}
    with open(os.path.join(d, "tokenizer_config.json"), "w") as f:
        json.dump(tc, f)


def config(family):
    c = {"model_type": family, "vocab_size": VOCAB, "hidden_size": 64, "intermediate_size": 96,
         "num_hidden_layers": 4, "num_attention_heads": 4, "num_key_value_heads": 2,
         "max_position_embeddings": 1024, "rms_norm_eps": 1e-6, "eos_token_id": 263,
         "tie_word_embeddings": family in ("qwen2", "gemma2", "gemma3_text")}
    if family == "llama":
        c.update(bos_token_id=261, rope_theta=500000.0,
                 rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                               "high_freq_factor": 4.0, "original_max_position_embeddings": 32})
    if family == "qwen3":
        c["head_dim"] = 32
    if family == "gemma2":
        c.update(head_dim=16, query_pre_attn_scalar=16, sliding_window=8, attn_logit_softcapping=5.0,
                 final_logit_softcapping=100.0, hidden_activation="gelu_pytorch_tanh")
    if family == "gemma3_text":
        c.update(head_dim=16, query_pre_attn_scalar=16, sliding_window=8, sliding_window_pattern=3,
                 rope_theta=1000000.0, rope_local_base_freq=10000.0,
                 rope_scaling={"rope_type": "linear", "factor": 2.0}, hidden_activation="gelu_pytorch_tanh")
    if family == "phi3":
        c.update(partial_rotary_factor=0.5, original_max_position_embeddings=CTX, sliding_window=None,
                 rope_scaling={"type": "longrope", "short_factor": [1.0, 1.5, 2.0, 4.0],
                               "long_factor": [2.0, 3.0, 5.0, 9.0]})
    return c


def params(family, c):
    g = torch.Generator().manual_seed(1234 + len(family))
    C, I, L = c["hidden_size"], c["intermediate_size"], c["num_hidden_layers"]
    H, KV = c["num_attention_heads"], c["num_key_value_heads"]
    D = c.get("head_dim", C // H)
    gemma = family.startswith("gemma")

    def lin(rows, cols, gain=1.0):
        return torch.randn(rows, cols, generator=g) * (gain / math.sqrt(cols))

    def norm(n, center=None, spread=0.2):
        # Gemma's norms scale by (1 + w): w near `center - 1` gives an effective weight near center.
        eff = torch.randn(n, generator=g) * spread + (1.0 if center is None else center)
        return eff - 1.0 if gemma else eff

    p = {"model.embed_tokens.weight": torch.randn(VOCAB, C, generator=g) * (1 / math.sqrt(C) if gemma else 1.0),
         "model.norm.weight": norm(C, 4.0 if gemma else 1.0)}
    for i in range(L):
        pre = f"model.layers.{i}."
        p[pre + "input_layernorm.weight"] = norm(C)
        p[pre + "post_attention_layernorm.weight"] = norm(C)
        if gemma:
            p[pre + "pre_feedforward_layernorm.weight"] = norm(C)
            p[pre + "post_feedforward_layernorm.weight"] = norm(C, 0.1, 0.02)
        if family == "phi3":
            p[pre + "self_attn.qkv_proj.weight"] = lin((H + 2 * KV) * D, C, 2.0)
            p[pre + "mlp.gate_up_proj.weight"] = lin(2 * I, C)
        else:
            p[pre + "self_attn.q_proj.weight"] = lin(H * D, C, 2.0)
            p[pre + "self_attn.k_proj.weight"] = lin(KV * D, C, 2.0)
            p[pre + "self_attn.v_proj.weight"] = lin(KV * D, C)
            p[pre + "mlp.gate_proj.weight"] = lin(I, C)
            p[pre + "mlp.up_proj.weight"] = lin(I, C)
        if family == "qwen2":
            for n, rows in (("q", H * D), ("k", KV * D), ("v", KV * D)):
                p[pre + f"self_attn.{n}_proj.bias"] = torch.randn(rows, generator=g) * 0.5
        if family in ("qwen3", "gemma3_text"):
            p[pre + "self_attn.q_norm.weight"] = norm(D)
            p[pre + "self_attn.k_norm.weight"] = norm(D)
        p[pre + "self_attn.o_proj.weight"] = lin(C, H * D)
        p[pre + "mlp.down_proj.weight"] = lin(C, I)
    # Only printable ASCII bytes and the merges can be generated: the other rows of the output
    # matrix (the embedding when tied) are zero, so their logit, 0, never wins against ~100 others.
    keep = torch.zeros(VOCAB, dtype=torch.bool)
    keep[0x20:0x7f] = True
    keep[256:261] = True
    out = torch.randn(VOCAB, C, generator=g) * (1 / math.sqrt(C)) if not c["tie_word_embeddings"] else None
    if out is None:
        p["model.embed_tokens.weight"][~keep] = 0
    else:
        out[~keep] = 0
        p["lm_head.weight"] = out
    return {k: v.contiguous() for k, v in p.items()}


def run(cmd, what):
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        print(f"llama_cpp_greedy: FAILED: {what} exited {r.returncode}: {' '.join(cmd)}\n{r.stdout}\n{r.stderr}",
              file=sys.stderr)
        sys.exit(1)
    return r.stdout


failures, matched, truncated_reruns, started = 0, 0, 0, time.time()
for family in families:
    t0 = time.time()
    # The folder's name becomes general.name; llama.cpp treats a model whose name contains "phi3"
    # as Microsoft's Phi-3 and looks up its special tokens (absent from this vocabulary).
    d = os.path.join(work, "tiny-" + family.replace("phi3", "phi"))
    shutil.rmtree(d, ignore_errors=True)
    os.makedirs(d)
    c = config(family)
    with open(os.path.join(d, "config.json"), "w") as f:
        json.dump(c, f, indent=1)
    save_file(params(family, c), os.path.join(d, "model.safetensors"), metadata={"format": "pt"})
    write_tokenizer(d, family)
    gguf = os.path.join(work, family + ".gguf")
    if os.path.exists(gguf):
        os.remove(gguf)
    run([trainer, "export", "--model", d, "--gguf", gguf, "--type", "f32"], family + " export")
    prompts = os.path.join(work, family + "-prompts.jsonl")
    # BOS: llama.cpp adds it when the file's tokenizer.ggml.add_bos_token says so (llama: true, from
    # tokenizer.json's post_processor); sftctl's tokenizer applies no post_processor, so the
    # prompt given to `generate` carries it as text (special tokens are parsed in prompts).
    bos = "<|begin_of_text|>" if family == "llama" else ""
    with open(prompts, "w") as f:
        for p in PROMPTS:
            f.write(json.dumps({"prompt": bos + p}) + "\n")
    lines = run([trainer, "generate", "--model", d, "--prompts", prompts, "--max-new-tokens", str(NEW_TOKENS),
                 "--device", "cpu"], family + " generate").splitlines()
    ours = {}
    for line in lines:
        if line.startswith("{"):
            rec = json.loads(line)
            ours[rec["index"]] = rec
    for i, prompt in enumerate(PROMPTS):
        rec = ours.get(i)
        mine = rec["generation"] if rec else None
        for attempt in range(3):
            theirs = run([llama, "-m", gguf, "-p", prompt, "-n", str(NEW_TOKENS), "--temp", "0", "--seed", "1",
                          "-c", str(CTX), "-t", "2", "-ngl", "0", "-fa", "off", "-ctk", "f32", "-ctv", "f32",
                          "-no-cnv", "--no-display-prompt", "--no-warmup", "--simple-io"],
                         f"{family} llama-completion")
            # llama-completion ends its output with newlines; the generations are printable ASCII
            # without newlines (see above), so they are cut off.
            theirs = theirs.rstrip("\n")
            # llama-completion prints through its asynchronous logger and now and then exits
            # before the last token is written (seen: 15 of 16 characters, a full rerun prints
            # all 16): a proper prefix of sftctl's text is run again, at most 3 times in all.
            if not (mine and theirs != mine and mine.startswith(theirs)):
                break
            truncated_reruns += 1
        if rec is None or rec["tokens"] != NEW_TOKENS or theirs != mine:
            failures += 1
            print(f"MISMATCH {family} prompt {i} {prompt!r}\n  llama.cpp: {theirs!r}\n  sftctl:    {mine!r}"
                  f" ({rec['tokens'] if rec else '?'} tokens, {rec['stop_reason'] if rec else '?'})")
        else:
            matched += 1
    print(f"{family}: {len(PROMPTS)} prompts, {time.time() - t0:.1f}s", flush=True)

total = len(families) * len(PROMPTS)
print(f"llama_cpp_greedy: {matched}/{total} greedy continuations match ({len(families)} families x "
      f"{len(PROMPTS)} prompts x {NEW_TOKENS} tokens), {truncated_reruns} llama.cpp reruns for a truncated "
      f"print, {time.time() - started:.1f}s")
sys.exit(1 if failures else 0)
PY
