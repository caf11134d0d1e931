#!/usr/bin/env python3
"""An independent GGUF reader for sftctl's GGUF export tests, written from the GGUF specification
(ggml's docs/gguf.md) and llama.cpp's naming conventions; standard library only.

  gguf_reader.py dump FILE
      prints the metadata and tensor infos as JSON.
  gguf_reader.py check --gguf FILE --model DIR [--adapter DIR] --type f16|q8_0|f32 --pre NAME --name NAME
      checks FILE against the source model folder (config.json, *.safetensors, tokenizer.json,
      tokenizer_config.json; with --adapter, the PEFT adapter merged as W + (alpha/r) B A):
      layout (magic, version 3, offsets aligned to general.alignment, tensors inside the file and
      not overlapping), every metadata value, every tensor's name, dims (innermost first), type and
      values (F32 exact; F16 equal to the source rounded to fp16, within one fp16 step for merged
      weights; Q8_0 blocks within d/2 per value, d = max|x|/127 to fp16 precision), llama's q/k
      rows reordered to adjacent RoPE pairs, Gemma's norms written as 1 + w, phi3's fused
      attn_qkv / ffn_up and longrope factors, and the gemma2 / gemma3 / phi3 keys (soft-capping,
      sliding window and its period, local RoPE base, partial rotary dimension count, longrope's
      original context and attention factor) derived from config.json. A SentencePiece-style
      tokenizer.json (no ByteLevel pre-tokenizer) is expected as tokenizer.ggml.model "llama":
      scores -(1 + rank of the first merge forming the token) (0 for others), byte tokens typed 6,
      the unk token 2, add_eos_token, add_space_prefix (normalizer Prepend), no pre or merges;
      and SPM_TEXTS are tokenized both as llama.cpp's SPM tokenizer does with the file's tokens and
      scores (highest-scoring adjacent pair whose concatenation is a token first, leftmost on ties;
      src/llama-vocab.cpp) and as Hugging Face's BPE does with tokenizer.json's merges (lowest rank
      first): the ids must be equal. Prints a JSON summary on success; exits 1 with the first
      mismatch otherwise.
"""
import argparse
import json
import math
import os
import struct
import sys

GGML_F32, GGML_F16, GGML_Q8_0 = 0, 1, 8
TYPE_NAMES = {GGML_F32: "F32", GGML_F16: "F16", GGML_Q8_0: "Q8_0"}


class Fail(Exception):
    pass


def expect(cond, msg):
    if not cond:
        raise Fail(msg)


# ---- GGUF parsing ------------------------------------------------------------------------------

class Cursor:
    def __init__(self, data):
        self.data, self.pos = data, 0

    def take(self, fmt):
        size = struct.calcsize(fmt)
        expect(self.pos + size <= len(self.data), "file ends inside the header at byte %d" % self.pos)
        vals = struct.unpack_from(fmt, self.data, self.pos)
        self.pos += size
        return vals[0] if len(vals) == 1 else vals

    def string(self):
        n = self.take("<Q")
        expect(self.pos + n <= len(self.data), "string runs past the end of the file")
        s = self.data[self.pos:self.pos + n].decode("utf-8")
        self.pos += n
        return s


SCALARS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d"}


def read_value(c, vtype):
    if vtype in SCALARS:
        return (vtype, c.take(SCALARS[vtype]))
    if vtype == 8:
        return (8, c.string())
    if vtype == 9:
        etype, n = c.take("<I"), c.take("<Q")
        return (9, etype, [read_value(c, etype)[1] for _ in range(n)])
    raise Fail("unknown metadata value type %d" % vtype)


def parse_gguf(path):
    data = open(path, "rb").read()
    c = Cursor(data)
    expect(data[:4] == b"GGUF", "magic is %r, not b'GGUF'" % data[:4])
    c.pos = 4
    version, n_tensors, n_kv = c.take("<I"), c.take("<Q"), c.take("<Q")
    expect(version == 3, "version %d, expected 3" % version)
    kv = {}
    for _ in range(n_kv):
        key = c.string()
        expect(key not in kv, "metadata key %s appears twice" % key)
        kv[key] = read_value(c, c.take("<I"))
    tensors = []
    for _ in range(n_tensors):
        name = c.string()
        n_dims = c.take("<I")
        dims = [c.take("<Q") for _ in range(n_dims)]
        ttype, offset = c.take("<I"), c.take("<Q")
        tensors.append({"name": name, "dims": dims, "type": ttype, "offset": offset})
    align = kv.get("general.alignment", (4, 32))
    expect(align[0] == 4, "general.alignment must be a uint32")
    align = align[1]
    data_start = (c.pos + align - 1) // align * align
    expect(all(b == 0 for b in data[c.pos:data_start]), "padding before the data is not zeros")
    return data, kv, tensors, align, data_start


def tensor_nbytes(t):
    n = 1
    for d in t["dims"]:
        n *= d
    if t["type"] == GGML_F32:
        return 4 * n
    if t["type"] == GGML_F16:
        return 2 * n
    if t["type"] == GGML_Q8_0:
        expect(t["dims"][0] % 32 == 0, "%s: Q8_0 rows of %d values" % (t["name"], t["dims"][0]))
        return n // 32 * 34
    raise Fail("%s: unexpected ggml type %d" % (t["name"], t["type"]))


def check_layout(data, tensors, align, data_start):
    spans = []
    for t in tensors:
        expect(t["offset"] % align == 0, "%s: offset %d is not a multiple of %d" % (t["name"], t["offset"], align))
        start = data_start + t["offset"]
        end = start + tensor_nbytes(t)
        expect(end <= len(data), "%s: data runs past the end of the file" % t["name"])
        spans.append((start, end, t["name"]))
    spans.sort()
    for a, b in zip(spans, spans[1:]):
        expect(a[1] <= b[0], "%s and %s overlap" % (a[2], b[2]))


def decode(data, t, data_start):
    """The tensor's values as a flat list of floats (Q8_0: a list of (d, [q...]) blocks)."""
    start = data_start + t["offset"]
    n = tensor_nbytes(t)
    raw = data[start:start + n]
    if t["type"] == GGML_F32:
        return list(struct.unpack("<%df" % (n // 4), raw))
    if t["type"] == GGML_F16:
        return list(struct.unpack("<%de" % (n // 2), raw))
    blocks = []
    for i in range(0, n, 34):
        d = struct.unpack_from("<e", raw, i)[0]
        blocks.append((d, list(struct.unpack_from("<32b", raw, i + 2))))
    return blocks


# ---- safetensors and the source model ------------------------------------------------------------

def read_safetensors(path):
    data = open(path, "rb").read()
    n = struct.unpack_from("<Q", data, 0)[0]
    header = json.loads(data[8:8 + n])
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        a, b = info["data_offsets"]
        raw = data[8 + n + a:8 + n + b]
        dt = info["dtype"]
        if dt == "F32":
            vals = list(struct.unpack("<%df" % (len(raw) // 4), raw))
        elif dt == "F16":
            vals = list(struct.unpack("<%de" % (len(raw) // 2), raw))
        elif dt == "BF16":
            vals = [struct.unpack("<f", b"\0\0" + raw[i:i + 2])[0] for i in range(0, len(raw), 2)]
        else:
            raise Fail("%s: %s: dtype %s" % (path, name, dt))
        out[name] = (info["shape"], vals)
    return out


def read_weights(model_dir):
    index = os.path.join(model_dir, "model.safetensors.index.json")
    if os.path.exists(index):
        out = {}
        for f in sorted(set(json.load(open(index))["weight_map"].values())):
            out.update(read_safetensors(os.path.join(model_dir, f)))
        return out
    return read_safetensors(os.path.join(model_dir, "model.safetensors"))


def merge_adapter(weights, adapter_dir):
    cfg = json.load(open(os.path.join(adapter_dir, "adapter_config.json")))
    r, alpha = cfg["r"], cfg["lora_alpha"]
    scale = alpha / math.sqrt(r) if cfg.get("use_rslora") else alpha / r
    ad = read_safetensors(os.path.join(adapter_dir, "adapter_model.safetensors"))
    merged = set()
    for key, (shape_a, a) in ad.items():
        if ".lora_A." not in key:
            continue
        module = key[len("base_model.model."):key.index(".lora_A.")]
        shape_b, b = ad[key.replace(".lora_A.", ".lora_B.")]
        (rows, cols), (_, rank) = weights[module + ".weight"][0], shape_b
        w = list(weights[module + ".weight"][1])
        for o in range(rows):
            for i in range(cols):
                w[o * cols + i] += scale * sum(b[o * rank + k] * a[k * cols + i] for k in range(rank))
        weights[module + ".weight"] = ([rows, cols], w)
        merged.add(module + ".weight")
    return merged


# ---- expectations ------------------------------------------------------------------------------

LAYER_NAMES = {
    "input_layernorm": "attn_norm", "post_attention_layernorm": "ffn_norm",
    "self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k", "self_attn.v_proj": "attn_v",
    "self_attn.o_proj": "attn_output", "self_attn.q_norm": "attn_q_norm", "self_attn.k_norm": "attn_k_norm",
    "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up", "mlp.down_proj": "ffn_down",
    # phi3's fused projections: llama.cpp's attn_qkv, and ffn_up holding the gate rows then the up rows.
    "self_attn.qkv_proj": "attn_qkv", "mlp.gate_up_proj": "ffn_up",
}
# Gemma's four norms per layer (llama.cpp's gemma2 / gemma3 tensor names).
GEMMA_LAYER_NAMES = {
    "post_attention_layernorm": "post_attention_norm", "pre_feedforward_layernorm": "ffn_norm",
    "post_feedforward_layernorm": "post_ffw_norm",
}
GEMMA = ("gemma2", "gemma3")


def gguf_name(hf, arch=None):
    fixed = {"model.embed_tokens.weight": "token_embd.weight", "model.norm.weight": "output_norm.weight",
             "lm_head.weight": "output.weight"}
    if hf in fixed:
        return fixed[hf]
    parts = hf.split(".")
    expect(parts[0] == "model" and parts[1] == "layers", "unexpected source tensor " + hf)
    module = ".".join(parts[3:-1])
    if arch in GEMMA and module in GEMMA_LAYER_NAMES:
        return "blk.%s.%s.%s" % (parts[2], GEMMA_LAYER_NAMES[module], parts[-1])
    return "blk.%s.%s.%s" % (parts[2], LAYER_NAMES[module], parts[-1])


def hparams(cfg):
    arch = {"llama": "llama", "qwen2": "qwen2", "qwen3": "qwen3", "mistral": "llama", "gemma2": "gemma2",
            "gemma3_text": "gemma3", "phi3": "phi3"}[cfg["model_type"]]
    heads = cfg["num_attention_heads"]
    head_dim = cfg.get("head_dim") or cfg["hidden_size"] // heads
    return arch, heads, cfg.get("num_key_value_heads", heads), head_dim


def context_length(cfg):
    """max_position_embeddings; a mistral's or phi3's shorter sliding window (llama.cpp attends to every
    position for both, which is the window's attention up to that many tokens)."""
    ctx = cfg.get("max_position_embeddings", 2048)
    window = cfg.get("sliding_window") or 0
    if cfg.get("model_type") in ("mistral", "phi3") and 0 < window < ctx:
        return window
    return ctx


def sliding_pattern(cfg, arch):
    """llama.cpp's sliding-window period p (layer i slides when i % p < p - 1; 0: all slide) for the
    config's layer types (default: gemma2's even layers, gemma3's all but every sliding_window_pattern-th)."""
    n = cfg["num_hidden_layers"]
    if cfg.get("layer_types"):
        slides = [t == "sliding_attention" for t in cfg["layer_types"]]
    elif arch == "gemma2":
        slides = [i % 2 == 0 for i in range(n)]
    else:
        slides = [(i + 1) % cfg.get("sliding_window_pattern", 6) != 0 for i in range(n)]
    if not cfg.get("sliding_window"):
        slides = [False] * n
    preferred = 2 if arch == "gemma2" else 6
    for p in [preferred] + list(range(n + 2)):
        if all(s == (p == 0 or i % p < p - 1) for i, s in enumerate(slides)):
            return p
    raise Fail("no sliding-window period for %s" % slides)


def longrope(cfg):
    rs = cfg.get("rope_scaling") or {}
    return rs if (rs.get("rope_type") or rs.get("type")) == "longrope" else None


def pair_halves(vals, rows, cols, heads):
    """llama.cpp's row order for llama q/k: row 2i+j of a head holds HF row j*half+i."""
    hd = rows // heads
    half = hd // 2
    out = [0.0] * (rows * cols)
    for h in range(heads):
        for i in range(half):
            for j in range(2):
                src, dst = h * hd + j * half + i, h * hd + 2 * i + j
                out[dst * cols:(dst + 1) * cols] = vals[src * cols:(src + 1) * cols]
    return out


def llama3_factors(cfg, head_dim):
    rs = cfg["rope_scaling"]
    theta = cfg.get("rope_theta", 10000.0)
    factor, low, high = rs["factor"], rs.get("low_freq_factor", 1.0), rs.get("high_freq_factor", 4.0)
    old = rs.get("original_max_position_embeddings", 8192)
    out = []
    for i in range(0, head_dim, 2):
        inv = 1.0 / theta ** (i / head_dim)
        wavelen = 2 * math.pi / inv
        if wavelen < old / high:
            out.append(1.0)
        elif wavelen > old / low:
            out.append(factor)
        else:
            smooth = (old / wavelen - low) / (high - low)
            out.append(1.0 / ((1 - smooth) / factor + smooth))
    return out


def f16_step(x):
    """The spacing of fp16 values near x."""
    m, e = math.frexp(abs(x)) if x != 0 else (0.5, -13)
    return 2.0 ** (max(e, -13) - 11)


def check_values(name, t, vals, expected, approx):
    if t["type"] == GGML_Q8_0:
        worst = 0.0
        for bi, (d, qs) in enumerate(vals):
            xs = expected[bi * 32:(bi + 1) * 32]
            amax = max(abs(x) for x in xs)
            expect(abs(d - amax / 127) <= (amax / 127) * 2 ** -10 + 1e-12,
                   "%s block %d: scale %r, expected max|x|/127 = %r" % (name, bi, d, amax / 127))
            for x, q in zip(xs, qs):
                err = abs(x - q * d)
                expect(err <= d / 2 * (1 + 1e-6) + 1e-12, "%s block %d: %r reads back as %r (d %r)" % (name, bi, x, q * d, d))
                if d > 0:
                    worst = max(worst, err / d)
        return len(vals), worst
    for k, (got, want) in enumerate(zip(vals, expected)):
        if t["type"] == GGML_F32:
            want32 = struct.unpack("<f", struct.pack("<f", want))[0]
            ok = got == want32 if not approx else abs(got - want32) <= 1e-5 * max(1.0, abs(want32))
        else:
            want16 = struct.unpack("<e", struct.pack("<e", want))[0]
            ok = got == want16 if not approx else abs(got - want16) <= f16_step(want16)
        expect(ok, "%s[%d]: %r, expected %r" % (name, k, got, want))
    return 0, 0.0


SPIECE = "\u2581"
SPM_TEXTS = ["Hello world", "the cat sat on the mat", "  two  spaces ", "na\u00efve caf\u00e9 \u65e5\u672c",
             "aaaa bbbb....", "there the other", "if (x == 1) { return y; }", "\t\n\n  \n"]


def flat(node, key):
    if not isinstance(node, dict):
        return []
    if node.get("type") == "Sequence" and isinstance(node.get(key), list):
        return [leaf for n in node[key] for leaf in flat(n, key)]
    return [node]


def is_spm(tj):
    return not any(p.get("type") == "ByteLevel" for p in flat(tj.get("pre_tokenizer"), "pretokenizers"))


def spm_prepends(tj):
    return any(n.get("type") == "Prepend" for n in flat(tj.get("normalizer"), "normalizers"))


def merge_pairs(tj):
    return [tuple(m.split(" ", 1)) if isinstance(m, str) else tuple(m) for m in tj["model"]["merges"]]


def spm_scores(tj, tokens):
    first = {}
    for r, (a, b) in enumerate(merge_pairs(tj)):
        first.setdefault(a + b, r)
    return [-1.0 - first[t] if t in first else 0.0 for t in tokens]


def with_bytes(symbols, ids):
    out = []
    for s in symbols:
        out += [ids[s]] if s in ids else [ids["<0x%02X>" % b] for b in s.encode()]
    return out


def hf_bpe(tj, ranks, text):
    """Hugging Face's BPE over a SentencePiece-style normalized text (no added tokens in it)."""
    text = (SPIECE if spm_prepends(tj) else "") + text.replace(" ", SPIECE)
    sym = list(text)
    while True:
        cand = [(ranks[(sym[i], sym[i + 1])], i) for i in range(len(sym) - 1) if (sym[i], sym[i + 1]) in ranks]
        if not cand:
            return with_bytes(sym, tj["model"]["vocab"])
        _, i = min(cand)
        sym[i:i + 2] = [sym[i] + sym[i + 1]]


def llama_spm(ids, scores, add_space_prefix, text):
    """llama.cpp's SPM tokenizer (src/llama-vocab.cpp, llm_tokenizer_spm_session) on one raw text;
    ids: token text -> id (the last id of a text, as llama.cpp's token_to_id)."""
    text = ((" " if add_space_prefix else "") + text).replace(" ", SPIECE)
    sym = list(text)
    while True:
        best = None
        for i in range(len(sym) - 1):
            t = sym[i] + sym[i + 1]
            if t in ids and (best is None or scores[ids[t]] > best[0]):
                best = (scores[ids[t]], i)
        if best is None:
            return with_bytes(sym, ids)
        i = best[1]
        sym[i:i + 2] = [sym[i] + sym[i + 1]]


def expected_tokens(model_dir, n_vocab):
    tj = json.load(open(os.path.join(model_dir, "tokenizer.json")))
    cfg_path = os.path.join(model_dir, "tokenizer_config.json")
    tc = json.load(open(cfg_path)) if os.path.exists(cfg_path) else {}
    by_id = {i: t for t, i in tj["model"]["vocab"].items()}
    kind = {}
    added = [(a["id"], a["content"], a.get("special", False)) for a in tj.get("added_tokens", [])]
    added += [(int(k), v["content"], v.get("special", False)) for k, v in tc.get("added_tokens_decoder", {}).items()]
    for i, content, special in added:
        by_id[i] = content
        kind[i] = 3 if special else 4
    tokens = [by_id.get(i, "[PAD%d]" % i) for i in range(n_vocab)]
    types = [kind.get(i, 1 if i in by_id else 5) for i in range(n_vocab)]
    if is_spm(tj):
        byte_names = {"<0x%02X>" % b for b in range(256)}
        types = [6 if ty == 1 and t in byte_names else ty for t, ty in zip(tokens, types)]
        unk = tj["model"].get("unk_token")
        if unk is not None:
            types[tokens.index(unk)] = 2
    merges = [m if isinstance(m, str) else m[0] + " " + m[1] for m in tj["model"]["merges"]]
    return tj, tc, tokens, types, merges


def token_text(v):
    return v.get("content") if isinstance(v, dict) else v


def check_metadata(kv, args, cfg, tok_dir):
    arch, heads, kv_heads, head_dim = hparams(cfg)
    n_vocab = cfg["vocab_size"]
    tj, tc, tokens, types, merges = expected_tokens(tok_dir, n_vocab)
    ids = {t: i for i, t in enumerate(tokens)}

    def special_id(key, fallback):
        text = token_text(tc.get(key))
        return ids[text] if text is not None else fallback

    bos = special_id("bos_token", cfg.get("bos_token_id"))
    eos_cfg = cfg.get("eos_token_id")
    eos = special_id("eos_token", eos_cfg[0] if isinstance(eos_cfg, list) else eos_cfg)
    pad = special_id("pad_token", None)
    if isinstance(tc.get("add_bos_token"), bool):
        add_bos = tc["add_bos_token"]
    else:
        pp = tj.get("post_processor") or {}
        procs = [pp] + list(pp.get("processors", []))
        add_bos = any(p.get("type") == "TemplateProcessing" and p["single"] and
                      p["single"][0].get("SpecialToken", {}).get("id") == tokens[bos] for p in procs) if bos is not None else False
    want = {
        "general.architecture": (8, arch), "general.name": (8, args.name), "general.alignment": (4, 32),
        "general.file_type": (4, {"q8_0": 7, "f16": 1, "f32": 0}[args.type]), "general.quantization_version": (4, 2),
        arch + ".vocab_size": (4, n_vocab), arch + ".context_length": (4, context_length(cfg)),
        arch + ".embedding_length": (4, cfg["hidden_size"]), arch + ".block_count": (4, cfg["num_hidden_layers"]),
        arch + ".feed_forward_length": (4, cfg["intermediate_size"]),
        arch + ".attention.head_count": (4, heads), arch + ".attention.head_count_kv": (4, kv_heads),
        arch + ".attention.layer_norm_rms_epsilon": (6, struct.unpack("<f", struct.pack("<f", cfg.get("rms_norm_eps", 1e-6)))[0]),
        arch + ".rope.freq_base": (6, float(cfg.get("rope_theta", 10000.0))),
        arch + ".rope.dimension_count": (4, int(head_dim * cfg.get("partial_rotary_factor", 1.0))),
        "tokenizer.ggml.tokens": (9, 8, tokens), "tokenizer.ggml.token_type": (9, 5, types),
        "tokenizer.ggml.add_bos_token": (7, add_bos),
    }
    spm = is_spm(tj)
    summary = {}
    if spm:
        scores = spm_scores(tj, tokens)
        prepend = spm_prepends(tj)
        if isinstance(tc.get("add_eos_token"), bool):
            add_eos = tc["add_eos_token"]
        else:
            single = (tj.get("post_processor") or {}).get("single") or [{}]
            add_eos = eos is not None and single[-1].get("SpecialToken", {}).get("id") == tokens[eos]
        want.update({"tokenizer.ggml.model": (8, "llama"), "tokenizer.ggml.scores": (9, 6, scores),
                     "tokenizer.ggml.add_eos_token": (7, add_eos), "tokenizer.ggml.add_space_prefix": (7, prepend)})
        if tj["model"].get("unk_token") is not None:
            want["tokenizer.ggml.unknown_token_id"] = (4, tokens.index(tj["model"]["unk_token"]))
        got_ids = {t: i for i, t in enumerate(kv["tokenizer.ggml.tokens"][2])}
        got_scores = kv["tokenizer.ggml.scores"][2]
        ranks = {p: r for r, p in reversed(list(enumerate(merge_pairs(tj))))}
        for text in SPM_TEXTS:
            ours = llama_spm(got_ids, got_scores, kv["tokenizer.ggml.add_space_prefix"][1], text)
            theirs = hf_bpe(tj, ranks, text)
            expect(ours == theirs, "SPM tokenization of %r: %s, Hugging Face BPE: %s" % (text, ours, theirs))
        summary = {"scored": sum(1 for x in scores if x != 0.0), "byte_tokens": types.count(6),
                   "add_space_prefix": prepend, "add_eos": add_eos, "spm_texts": len(SPM_TEXTS)}
    else:
        want.update({"tokenizer.ggml.model": (8, "gpt2"), "tokenizer.ggml.pre": (8, args.pre),
                     "tokenizer.ggml.merges": (9, 8, merges)})
    if arch in GEMMA or cfg["model_type"] == "qwen3" or head_dim * heads != cfg["hidden_size"]:
        want[arch + ".attention.key_length"] = (4, head_dim)
        want[arch + ".attention.value_length"] = (4, head_dim)
    rs = cfg.get("rope_scaling") or {}
    if (rs.get("rope_type") or rs.get("type")) == "linear":
        want[arch + ".rope.scaling.type"] = (8, "linear")
        want[arch + ".rope.scaling.factor"] = (6, float(rs["factor"]))
    if arch in GEMMA:
        want[arch + ".attention.sliding_window"] = (4, cfg.get("sliding_window") or cfg["max_position_embeddings"])
        want[arch + ".attention.sliding_window_pattern"] = (4, sliding_pattern(cfg, arch))
        if arch == "gemma3":
            want[arch + ".rope.freq_base_swa"] = (6, float(cfg.get("rope_local_base_freq", 10000.0)))
        else:
            want[arch + ".attn_logit_softcapping"] = (6, float(cfg.get("attn_logit_softcapping", 50.0)))
            want[arch + ".final_logit_softcapping"] = (6, float(cfg.get("final_logit_softcapping", 30.0)))
    if arch == "phi3":
        orig = cfg.get("original_max_position_embeddings", 4096)
        want[arch + ".rope.scaling.original_context_length"] = (4, orig)
        want[arch + ".attention.sliding_window"] = (4, cfg.get("sliding_window") or 0)
        lr = longrope(cfg)
        if lr:
            scale = cfg["max_position_embeddings"] / orig
            factor = lr.get("attention_factor") or (math.sqrt(1 + math.log(scale) / math.log(orig)) if scale > 1 else 1.0)
            want[arch + ".rope.scaling.attn_factor"] = (6, struct.unpack("<f", struct.pack("<f", factor))[0])
    for key, value in (("bos", bos), ("eos", eos), ("padding", pad)):
        if value is not None:
            want["tokenizer.ggml.%s_token_id" % key] = (4, value)
    templates = tc.get("chat_template")
    if isinstance(templates, str):
        want["tokenizer.chat_template"] = (8, templates)
    elif isinstance(templates, list):
        for e in templates:
            key = "tokenizer.chat_template" + ("" if e["name"] == "default" else "." + e["name"])
            want[key] = (8, e["template"])
    expect(sorted(kv) == sorted(want), "metadata keys %s, expected %s" % (sorted(kv), sorted(want)))
    for key, value in want.items():
        expect(kv[key] == value, "%s = %r, expected %r" % (key, str(kv[key])[:200], str(value)[:200]))
    summary.update({"vocab": len(tokens), "merges": len(merges), "bos": bos, "eos": eos, "pad": pad,
                    "add_bos": add_bos, "model": want["tokenizer.ggml.model"][1],
                    "chat_templates": sorted(k for k in kv if k.startswith("tokenizer.chat_template"))})
    return summary


def check(args):
    data, kv, tensors, align, data_start = parse_gguf(args.gguf)
    check_layout(data, tensors, align, data_start)
    base = args.model
    cfg = json.load(open(os.path.join(base, "config.json")))
    arch, heads, kv_heads, head_dim = hparams(cfg)
    weights = read_weights(base)
    merged = merge_adapter(weights, args.adapter) if args.adapter else set()
    tied = cfg.get("tie_word_embeddings", False)
    expected = {}
    for hf, (shape, vals) in weights.items():
        if hf == "lm_head.weight" and tied:
            continue
        name = gguf_name(hf, arch)
        if arch in GEMMA and name.endswith("norm.weight"):
            vals = [v + 1.0 for v in vals]  # Gemma's (1 + w) RMSNorm, folded as llama.cpp's converter does
        if arch == "llama" and (".attn_q." in name or ".attn_k." in name):
            n = heads if ".attn_q." in name else kv_heads
            vals = pair_halves(vals, shape[0], shape[1] if len(shape) == 2 else 1, n)
        if len(shape) == 1 or args.type == "f32":
            ttype = GGML_F32
        else:
            ttype = GGML_Q8_0 if args.type == "q8_0" and shape[1] % 32 == 0 else GGML_F16
        expected[name] = (list(reversed(shape)), ttype, vals, hf in merged)
    if cfg.get("rope_scaling") and (cfg["rope_scaling"].get("rope_type") or cfg["rope_scaling"].get("type")) == "llama3":
        expected["rope_freqs.weight"] = ([head_dim // 2], GGML_F32, llama3_factors(cfg, head_dim), True)
    lr = longrope(cfg) if arch == "phi3" else None
    if lr:
        for kind in ("long", "short"):
            f = lr[kind + "_factor"]
            expected["rope_factors_%s.weight" % kind] = ([len(f)], GGML_F32, f, False)
    got = {t["name"]: t for t in tensors}
    expect(sorted(got) == sorted(expected), "tensors %s, expected %s" % (sorted(got), sorted(expected)))
    summary = {"tensors": len(tensors), "q8_0_tensors": 0, "f16_tensors": 0, "f32_tensors": 0, "q8_0_blocks": 0,
               "max_q8_0_err_over_d": 0.0, "merged": sorted(gguf_name(m, arch) for m in merged)}
    for name, (dims, ttype, vals, approx) in sorted(expected.items()):
        t = got[name]
        expect(t["dims"] == dims, "%s: dims %s, expected %s" % (name, t["dims"], dims))
        expect(t["type"] == ttype, "%s: type %s, expected %s" % (name, TYPE_NAMES.get(t["type"]), TYPE_NAMES[ttype]))
        blocks, worst = check_values(name, t, decode(data, t, data_start), vals, approx)
        summary["%s_tensors" % TYPE_NAMES[ttype].lower()] += 1
        summary["q8_0_blocks"] += blocks
        summary["max_q8_0_err_over_d"] = max(summary["max_q8_0_err_over_d"], worst)
    tok_dir = args.tokenizer or args.model
    summary.update(check_metadata(kv, args, cfg, tok_dir))
    print(json.dumps(summary, sort_keys=True))


def dump(path):
    data, kv, tensors, align, data_start = parse_gguf(path)
    meta = {k: (v[2][:8] if v[0] == 9 else v[1]) for k, v in kv.items()}
    print(json.dumps({"metadata": meta, "tensors": tensors, "data_start": data_start}, indent=1))


def main():
    p = argparse.ArgumentParser()
    sub = p.add_subparsers(dest="cmd", required=True)
    d = sub.add_parser("dump")
    d.add_argument("file")
    c = sub.add_parser("check")
    c.add_argument("--gguf", required=True)
    c.add_argument("--model", required=True, help="the folder with config.json and the base weights")
    c.add_argument("--adapter", help="a PEFT adapter merged into the weights")
    c.add_argument("--tokenizer", help="the folder with tokenizer.json (default: --model)")
    c.add_argument("--type", required=True, choices=["f16", "q8_0", "f32"])
    c.add_argument("--pre", required=True)
    c.add_argument("--name", required=True)
    args = p.parse_args()
    try:
        check(args) if args.cmd == "check" else dump(args.file)
    except Fail as e:
        print("gguf check failed: %s" % e)
        sys.exit(1)


if __name__ == "__main__":
    main()
