#!/usr/bin/python3
"""Golden reference for sftctl's Hugging Face parity tests (llm.c style).

An independent PyTorch re-implementation of transformers' Llama / Qwen2 / Qwen3 / Mistral /
Gemma2 / Gemma3 (text) / Phi3 forward pass (modeling_llama.py, modeling_qwen2.py, modeling_qwen3.py,
modeling_mistral.py, modeling_gemma2.py, modeling_gemma3.py, modeling_phi3.py and
modeling_rope_utils.py's longrope, eager attention), written from ../shared/notes/formats.md and the published modelling code,
plus a tiny pure-Python safetensors reader/writer (the `transformers`, `safetensors` and `peft`
packages are not available here).

For each family it writes a random HF-format checkpoint and the reference outputs:

  OUT/llama/   config.json (GQA, head_dim != hidden/heads, llama3 rope_scaling, untied),
               model.safetensors in BF16
  OUT/qwen2/   config.json (q/k/v bias, tied embeddings, "rope_parameters" form),
               3 F32 shards + model.safetensors.index.json
  OUT/qwen3/   config.json (q_norm/k_norm, head_dim 16 != hidden/heads, no biases, tied),
               2 F32 shards + index
  OUT/qwen3_untied/  Qwen3, untied lm_head, "layer_types" all full_attention, BF16
  OUT/mistral/ config.json (sliding_window 7 < the test's 24 positions, GQA, untied), BF16
  OUT/mistral_full/  Mistral with "sliding_window": null (full attention), tied, F32
  OUT/gemma2/  Gemma2: (1 + w) norms, four per layer, GeGLU, scaled embeddings, query_pre_attn_scalar
               != head_dim, attention and final logit soft-capping small enough to cap, sliding
               window 5 < 24 positions on the even layers (no layer_types: the default), tied, F32
  OUT/gemma3_text/  Gemma3 text: q/k norms, sliding_window_pattern 2, rope_local_base_freq for the
               sliding layers, linear rope_scaling for the full ones, MQA, untied, BF16
  OUT/gemma3_nested/  Gemma3 text in transformers 5's form: explicit layer_types and per-layer-type
               "rope_parameters", tied, F32
  OUT/phi3/    Phi-3: fused qkv_proj / gate_up_proj, full rotary, no rope_scaling, GQA, untied, BF16
  OUT/phi3_longrope/  Phi-3 / Phi-4-mini style: partial_rotary_factor 0.75, longrope with distinct
               short/long factors (original_max_position_embeddings 16 < the 24 positions: the
               long factors; reference.safetensors also holds short_input_ids / short_logits for
               the first 16 tokens, which take the short ones), attention_factor derived from
               max_position_embeddings / original_max_position_embeddings, sliding_window 7, tied, F32
  OUT/<family>/reference.safetensors: input_ids [B,T] I64, labels [B,T] I64 (-100 on
               "prompt" positions), logits [B,T,V] F32, loss [] F32 (mean CE over
               shifted targets != -100), all computed in fp32.

Usage: /usr/bin/python3 tests/reference/hf_reference.py --out DIR
Deterministic (fixed seeds). Needs torch and numpy (Debian: python3-torch, python3-numpy).
"""
import argparse
import json
import math
import os
import struct

import numpy as np
import torch

DTYPES = {"F32": (torch.float32, 4), "BF16": (torch.bfloat16, 2), "F16": (torch.float16, 2),
          "I64": (torch.int64, 8)}
NAMES = {v[0]: k for k, v in DTYPES.items()}


# ---- safetensors -------------------------------------------------------------------------
def st_write(path, tensors, metadata=None):
    header = {}
    if metadata:
        header["__metadata__"] = metadata
    offset = 0
    blobs = []
    for name in sorted(tensors):
        t = tensors[name].contiguous()
        raw = t.view(torch.int16).numpy().tobytes() if t.dtype == torch.bfloat16 else t.numpy().tobytes()
        header[name] = {"dtype": NAMES[t.dtype], "shape": list(t.shape),
                        "data_offsets": [offset, offset + len(raw)]}
        offset += len(raw)
        blobs.append(raw)
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * ((8 - len(h) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)))
        f.write(h)
        for b in blobs:
            f.write(b)


def st_read(path):
    with open(path, "rb") as f:
        data = f.read()
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8:8 + n])
    base = 8 + n
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        dtype, size = DTYPES[info["dtype"]]
        b, e = info["data_offsets"]
        buf = bytearray(data[base + b:base + e])
        if dtype == torch.bfloat16:
            t = torch.frombuffer(buf, dtype=torch.int16).view(torch.bfloat16) if buf else torch.empty(0, dtype=dtype)
        else:
            t = torch.frombuffer(buf, dtype=dtype) if buf else torch.empty(0, dtype=dtype)
        out[name] = t.reshape(info["shape"]).clone()
    return out


def load_folder(d):
    index = os.path.join(d, "model.safetensors.index.json")
    if os.path.exists(index):
        files = sorted(set(json.load(open(index))["weight_map"].values()))
    else:
        files = ["model.safetensors"]
    sd = {}
    for f in files:
        sd.update(st_read(os.path.join(d, f)))
    return sd


# ---- transformers' math -----------------------------------------------------------------
def rope_inv_freq(cfg, seq_len=None):
    """transformers' inv_freq; `seq_len` picks longrope's factors (long when > original_max)."""
    dim = cfg.get("head_dim") or cfg["hidden_size"] // cfg["num_attention_heads"]
    dim = int(dim * cfg.get("partial_rotary_factor", 1.0))  # Phi3: RoPE on the first dims only
    params = cfg.get("rope_parameters") or cfg.get("rope_scaling") or {}
    base = params.get("rope_theta", cfg.get("rope_theta", 10000.0))
    inv_freq = 1.0 / (base ** (torch.arange(0, dim, 2, dtype=torch.int64).float() / dim))
    rope_type = params.get("rope_type", params.get("type", "default"))
    if rope_type == "longrope":  # _compute_longrope_parameters
        original = cfg.get("original_max_position_embeddings", 4096)
        long = seq_len is not None and seq_len > original
        ext = torch.tensor(params["long_factor"] if long else params["short_factor"], dtype=torch.float32)
        assert ext.numel() == dim // 2
        inv_freq = 1.0 / (ext * base ** (torch.arange(0, dim, 2, dtype=torch.int64).float() / dim))
    elif rope_type == "linear":
        inv_freq = inv_freq / params["factor"]
    elif rope_type == "llama3":
        factor = params["factor"]
        low, high = params["low_freq_factor"], params["high_freq_factor"]
        old_len = params["original_max_position_embeddings"]
        low_wl, high_wl = old_len / low, old_len / high
        wavelen = 2 * math.pi / inv_freq
        llama = torch.where(wavelen > low_wl, inv_freq / factor, inv_freq)
        smooth = (old_len / wavelen - low) / (high - low)
        smoothed = (1 - smooth) * llama / factor + smooth * llama
        medium = ~(wavelen < high_wl) * ~(wavelen > low_wl)
        inv_freq = torch.where(medium, smoothed, llama)
    else:
        assert rope_type == "default", rope_type
    return inv_freq


def rms_norm(x, w, eps):
    dtype = x.dtype
    h = x.to(torch.float32)
    var = h.pow(2).mean(-1, keepdim=True)
    h = h * torch.rsqrt(var + eps)
    return w * h.to(dtype)


def rotate_half(x):
    x1 = x[..., : x.shape[-1] // 2]
    x2 = x[..., x.shape[-1] // 2:]
    return torch.cat((-x2, x1), dim=-1)


def linear(x, sd, name):
    y = x @ sd[name + ".weight"].t()
    if name + ".bias" in sd:
        y = y + sd[name + ".bias"]
    return y


def sliding_window(cfg):
    """Mistral's window (MistralConfig default 4096 when the key is absent; null: none); Phi3's
    (Phi3Config default None)."""
    if cfg["model_type"] == "phi3":
        return cfg.get("sliding_window")
    if cfg["model_type"] != "mistral":
        return None
    return cfg.get("sliding_window", 4096)


def rope_attention_scaling(cfg):
    """longrope's attention_factor: given, else sqrt(1 + ln(s) / ln(original)) with s =
    max_position_embeddings / original_max_position_embeddings (1 when s <= 1)."""
    params = cfg.get("rope_parameters") or cfg.get("rope_scaling") or {}
    if params.get("rope_type", params.get("type")) != "longrope":
        return 1.0
    if params.get("attention_factor") is not None:
        return params["attention_factor"]
    original = cfg.get("original_max_position_embeddings", 4096)
    factor = cfg["max_position_embeddings"] / original
    return 1.0 if factor <= 1.0 else math.sqrt(1 + math.log(factor) / math.log(original))


def apply_rope(x, cos, sin):
    """apply_rotary_pos_emb: rotate the first cos.shape[-1] values of each head, pass the rest."""
    rd = cos.shape[-1]
    rot, rest = x[..., :rd], x[..., rd:]
    return torch.cat([rot * cos + rotate_half(rot) * sin, rest], dim=-1)


def qkv(cfg, sd, p, x, B, T, H, KV, D):
    """q [B, T, H, D], k and v [B, T, KV, D]: Phi3's one qkv_proj (q rows, k rows, v rows), or three."""
    if cfg["model_type"] == "phi3":
        fused = linear(x, sd, p + "self_attn.qkv_proj")
        q, k, v = fused[..., :H * D], fused[..., H * D:(H + KV) * D], fused[..., (H + KV) * D:]
        return q.reshape(B, T, H, D), k.reshape(B, T, KV, D), v.reshape(B, T, KV, D)
    return (linear(x, sd, p + "self_attn.q_proj").view(B, T, H, D),
            linear(x, sd, p + "self_attn.k_proj").view(B, T, KV, D),
            linear(x, sd, p + "self_attn.v_proj").view(B, T, KV, D))


def mlp(cfg, sd, p, x):
    """SwiGLU; Phi3: gate and up are the two halves of gate_up_proj (gate first)."""
    if cfg["model_type"] == "phi3":
        gate, up = linear(x, sd, p + "mlp.gate_up_proj").chunk(2, dim=-1)
        return linear(up * torch.nn.functional.silu(gate), sd, p + "mlp.down_proj")
    return linear(torch.nn.functional.silu(linear(x, sd, p + "mlp.gate_proj")) * linear(x, sd, p + "mlp.up_proj"),
                  sd, p + "mlp.down_proj")


def attention_mask(window, T, dtype):
    """Additive mask: causal, and with a sliding window key j is visible from query i only when
    j > i - window (transformers' sliding_window_overlay)."""
    i = torch.arange(T)[:, None]
    j = torch.arange(T)[None, :]
    allowed = j <= i
    if window is not None:
        allowed = allowed & (j > i - window)
    mask = torch.zeros(T, T, dtype=dtype).masked_fill(~allowed, torch.finfo(dtype).min)
    return mask[None, None]


def forward(cfg, sd, ids):
    if is_gemma(cfg):
        return gemma_forward(cfg, sd, ids)
    B, T = ids.shape
    H, KV = cfg["num_attention_heads"], cfg.get("num_key_value_heads", cfg["num_attention_heads"])
    D = cfg.get("head_dim") or cfg["hidden_size"] // H
    eps = cfg["rms_norm_eps"]
    qk_norm = cfg["model_type"] == "qwen3"
    h = sd["model.embed_tokens.weight"][ids]
    pos = torch.arange(T)[None, :].expand(B, T)
    inv_freq = rope_inv_freq(cfg, seq_len=int(pos.max()) + 1)  # longrope: transformers' per-call rule
    freqs = (inv_freq[None, :, None].float().expand(B, -1, 1) @ pos[:, None, :].float()).transpose(1, 2)
    emb = torch.cat((freqs, freqs), dim=-1)
    scaling = rope_attention_scaling(cfg)
    cos, sin = (emb.cos() * scaling)[:, None], (emb.sin() * scaling)[:, None]
    dtype = h.dtype
    mask = attention_mask(sliding_window(cfg), T, dtype)
    for i in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{i}."
        res = h
        x = rms_norm(h, sd[p + "input_layernorm.weight"], eps)
        q, k, v = qkv(cfg, sd, p, x, B, T, H, KV, D)
        if qk_norm:  # Qwen3: RMSNorm over each head's D values, before the transpose and RoPE
            q = rms_norm(q, sd[p + "self_attn.q_norm.weight"], eps)
            k = rms_norm(k, sd[p + "self_attn.k_norm.weight"], eps)
        q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
        q = apply_rope(q, cos, sin)
        k = apply_rope(k, cos, sin)
        rep = H // KV
        k = k[:, :, None].expand(B, KV, rep, T, D).reshape(B, H, T, D)
        v = v[:, :, None].expand(B, KV, rep, T, D).reshape(B, H, T, D)
        w = torch.matmul(q, k.transpose(2, 3)) * D ** -0.5 + mask
        w = torch.softmax(w, dim=-1, dtype=torch.float32).to(q.dtype)
        o = torch.matmul(w, v).transpose(1, 2).reshape(B, T, H * D)
        h = res + linear(o, sd, p + "self_attn.o_proj")
        res = h
        x = rms_norm(h, sd[p + "post_attention_layernorm.weight"], eps)
        h = res + mlp(cfg, sd, p, x)
    h = rms_norm(h, sd["model.norm.weight"], eps)
    head = sd["model.embed_tokens.weight"] if cfg.get("tie_word_embeddings") else sd["lm_head.weight"]
    return h @ head.t()


# ---- Gemma 2 / Gemma 3 (text) -----------------------------------------------------------------
def is_gemma(cfg):
    return cfg["model_type"] in ("gemma2", "gemma3_text")


def gemma_rms_norm(x, w, eps):
    """Gemma2RMSNorm: normalise and scale by (1 + w) in fp32, then cast back once."""
    h = x.float()
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
    return (h * (1.0 + w.float())).to(x.dtype)


def gemma_layer_types(cfg):
    """Gemma2Config: even layers slide; Gemma3TextConfig: all but every sliding_window_pattern-th."""
    if cfg.get("layer_types") is not None:
        return cfg["layer_types"]
    L = cfg["num_hidden_layers"]
    if cfg["model_type"] == "gemma2":
        return ["sliding_attention" if (i + 1) % 2 else "full_attention" for i in range(L)]
    pattern = cfg.get("sliding_window_pattern", 6)
    return ["sliding_attention" if (i + 1) % pattern else "full_attention" for i in range(L)]


def gemma_rope(cfg, layer_type):
    """inv_freq of a layer type: gemma3's sliding layers use rope_local_base_freq (default RoPE);
    the newer form nests {"sliding_attention": {...}, "full_attention": {...}} in rope_parameters."""
    D = cfg.get("head_dim", 256)
    gemma2 = cfg["model_type"] == "gemma2"
    params = cfg.get("rope_parameters") or {}
    if "full_attention" in params:
        p = params[layer_type]
        return rope_inv_freq({"head_dim": D, "rope_parameters": p})
    if not gemma2 and layer_type == "sliding_attention":
        return rope_inv_freq({"head_dim": D, "rope_theta": cfg.get("rope_local_base_freq", 10000.0)})
    theta = cfg.get("rope_theta", 10000.0 if gemma2 else 1000000.0)
    return rope_inv_freq({"head_dim": D, "rope_theta": theta, "rope_scaling": cfg.get("rope_scaling")})


def softcap(x, cap):
    return torch.tanh(x / cap) * cap


def gemma_attention(cfg, sd, p, x, cos, sin, mask):
    B, T, _ = x.shape
    H, KV, D = cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg.get("head_dim", 256)
    eps = cfg.get("rms_norm_eps", 1e-6)
    q = linear(x, sd, p + "self_attn.q_proj").view(B, T, H, D).transpose(1, 2)
    k = linear(x, sd, p + "self_attn.k_proj").view(B, T, KV, D).transpose(1, 2)
    v = linear(x, sd, p + "self_attn.v_proj").view(B, T, KV, D).transpose(1, 2)
    if cfg["model_type"] == "gemma3_text":  # Gemma3: q/k norms over head_dim before RoPE
        q = gemma_rms_norm(q, sd[p + "self_attn.q_norm.weight"], eps)
        k = gemma_rms_norm(k, sd[p + "self_attn.k_norm.weight"], eps)
    q = q * cos + rotate_half(q) * sin
    k = k * cos + rotate_half(k) * sin
    rep = H // KV
    k = k[:, :, None].expand(B, KV, rep, T, D).reshape(B, H, T, D)
    v = v[:, :, None].expand(B, KV, rep, T, D).reshape(B, H, T, D)
    default_scalar = 256
    w = torch.matmul(q, k.transpose(2, 3)) * cfg.get("query_pre_attn_scalar", default_scalar) ** -0.5
    cap = cfg.get("attn_logit_softcapping", 50.0 if cfg["model_type"] == "gemma2" else None)
    if cap is not None:
        w = softcap(w, cap)
    w = torch.softmax(w + mask, dim=-1, dtype=torch.float32).to(q.dtype)
    o = torch.matmul(w, v).transpose(1, 2).reshape(B, T, H * D)
    return linear(o, sd, p + "self_attn.o_proj")


def gemma_forward(cfg, sd, ids):
    B, T = ids.shape
    eps = cfg.get("rms_norm_eps", 1e-6)
    h = sd["model.embed_tokens.weight"][ids]
    h = h * torch.tensor(cfg["hidden_size"] ** 0.5, dtype=h.dtype)
    pos = torch.arange(T)[None, :].expand(B, T).float()
    tables = {}
    for kind in ("sliding_attention", "full_attention"):
        freqs = (gemma_rope(cfg, kind)[None, :, None].float().expand(B, -1, 1) @ pos[:, None, :]).transpose(1, 2)
        emb = torch.cat((freqs, freqs), dim=-1)
        tables[kind] = (emb.cos()[:, None], emb.sin()[:, None])
    window = cfg.get("sliding_window", 4096)
    masks = {"full_attention": attention_mask(None, T, h.dtype),
             "sliding_attention": attention_mask(window, T, h.dtype)}
    for i, kind in enumerate(gemma_layer_types(cfg)):
        p = f"model.layers.{i}."
        cos, sin = tables[kind]
        x = gemma_rms_norm(h, sd[p + "input_layernorm.weight"], eps)
        a = gemma_attention(cfg, sd, p, x, cos, sin, masks[kind])
        h = h + gemma_rms_norm(a, sd[p + "post_attention_layernorm.weight"], eps)
        x = gemma_rms_norm(h, sd[p + "pre_feedforward_layernorm.weight"], eps)
        gate = torch.nn.functional.gelu(linear(x, sd, p + "mlp.gate_proj"), approximate="tanh")
        mlp = linear(gate * linear(x, sd, p + "mlp.up_proj"), sd, p + "mlp.down_proj")
        h = h + gemma_rms_norm(mlp, sd[p + "post_feedforward_layernorm.weight"], eps)
    h = gemma_rms_norm(h, sd["model.norm.weight"], eps)
    head = sd["model.embed_tokens.weight"] if cfg.get("tie_word_embeddings", True) else sd["lm_head.weight"]
    logits = h @ head.t()
    cap = cfg.get("final_logit_softcapping", 30.0 if cfg["model_type"] == "gemma2" else None)
    return softcap(logits, cap) if cap is not None else logits


def loss_fn(logits, labels):
    logits = logits.float()
    shift_logits = logits[..., :-1, :].contiguous().view(-1, logits.shape[-1])
    shift_labels = labels[..., 1:].contiguous().view(-1)
    return torch.nn.functional.cross_entropy(shift_logits, shift_labels, ignore_index=-100, reduction="mean")


# ---- random checkpoints -----------------------------------------------------------------
def random_state(cfg, gen):
    H, KV = cfg["num_attention_heads"], cfg.get("num_key_value_heads", cfg["num_attention_heads"])
    C, I, V = cfg["hidden_size"], cfg["intermediate_size"], cfg["vocab_size"]
    family = cfg["model_type"]
    # q/k/v biases: always for qwen2; with attention_bias for llama and qwen3, which then bias
    # o_proj too; never for mistral.
    bias = family == "qwen2" or (family in ("llama", "qwen3") and cfg.get("attention_bias", False))
    o_bias = family in ("llama", "qwen3") and cfg.get("attention_bias", False)
    gemma = family in ("gemma2", "gemma3_text")
    D = cfg.get("head_dim") or (256 if gemma else C // H)
    norm_mean = 0.0 if gemma else 1.0  # Gemma's norms scale by (1 + w)

    def rnd(*shape, std=0.08):
        return torch.randn(*shape, generator=gen) * std

    emb_std = 0.5 / math.sqrt(C) if gemma else 0.5  # Gemma multiplies the embeddings by sqrt(C)
    sd = {"model.embed_tokens.weight": rnd(V, C, std=emb_std), "model.norm.weight": norm_mean + rnd(C, std=0.1)}
    for i in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{i}."
        norms = ["input_layernorm", "post_attention_layernorm"]
        if gemma:
            norms += ["pre_feedforward_layernorm", "post_feedforward_layernorm"]
        for n in norms:
            sd[p + n + ".weight"] = norm_mean + rnd(C, std=0.1)
        fused = family == "phi3"  # one qkv_proj [(H + 2 KV) D, C], one gate_up_proj [2 I, C]
        if fused:
            sd[p + "self_attn.qkv_proj.weight"] = rnd((H + 2 * KV) * D, C, std=0.15)
        for n, out in (("q_proj", H * D), ("k_proj", KV * D), ("v_proj", KV * D)) if not fused else ():
            sd[p + "self_attn." + n + ".weight"] = rnd(out, C, std=0.15)
            if bias:
                sd[p + "self_attn." + n + ".bias"] = rnd(out, std=0.3)
        sd[p + "self_attn.o_proj.weight"] = rnd(C, H * D)
        if o_bias:
            sd[p + "self_attn.o_proj.bias"] = rnd(C, std=0.3)
        if family in ("qwen3", "gemma3_text"):
            sd[p + "self_attn.q_norm.weight"] = norm_mean + rnd(D, std=0.3)
            sd[p + "self_attn.k_norm.weight"] = norm_mean + rnd(D, std=0.3)
        if fused:
            sd[p + "mlp.gate_up_proj.weight"] = rnd(2 * I, C, std=0.15)
        else:
            sd[p + "mlp.gate_proj.weight"] = rnd(I, C, std=0.15)
            sd[p + "mlp.up_proj.weight"] = rnd(I, C, std=0.15)
        sd[p + "mlp.down_proj.weight"] = rnd(C, I)
    if not cfg.get("tie_word_embeddings", gemma):
        sd["lm_head.weight"] = rnd(V, C, std=0.15)
    return sd


LLAMA = {
    "architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": 160, "hidden_size": 64,
    "intermediate_size": 96, "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
    "head_dim": 24, "max_position_embeddings": 64, "rms_norm_eps": 1e-5, "rope_theta": 500000.0,
    "rope_scaling": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                     "original_max_position_embeddings": 16},
    "attention_bias": False, "mlp_bias": False, "hidden_act": "silu", "tie_word_embeddings": False,
    "bos_token_id": 1, "eos_token_id": [2, 3], "torch_dtype": "bfloat16",
}
QWEN2 = {
    "architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2", "vocab_size": 144, "hidden_size": 48,
    "intermediate_size": 80, "num_hidden_layers": 3, "num_attention_heads": 6, "num_key_value_heads": 2,
    "max_position_embeddings": 64, "rms_norm_eps": 1e-6,
    "rope_parameters": {"rope_type": "default", "rope_theta": 1000000.0},
    "hidden_act": "silu", "tie_word_embeddings": True, "bos_token_id": 140, "eos_token_id": 141,
    "torch_dtype": "float32",
}

QWEN3 = {
    "architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "vocab_size": 152, "hidden_size": 48,
    "intermediate_size": 88, "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
    "head_dim": 16, "max_position_embeddings": 64, "rms_norm_eps": 1e-6, "rope_theta": 1000000.0,
    "rope_scaling": None, "attention_bias": False, "attention_dropout": 0.0, "use_sliding_window": False,
    "sliding_window": None, "max_window_layers": 2, "hidden_act": "silu", "tie_word_embeddings": True,
    "bos_token_id": 150, "eos_token_id": 151, "torch_dtype": "float32",
}
QWEN3_UNTIED = {
    "architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "vocab_size": 136, "hidden_size": 64,
    "intermediate_size": 72, "num_hidden_layers": 3, "num_attention_heads": 8, "num_key_value_heads": 2,
    "head_dim": 12, "max_position_embeddings": 64, "rms_norm_eps": 1e-6,
    "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0},
    "layer_types": ["full_attention"] * 3, "use_sliding_window": False, "sliding_window": None,
    "hidden_act": "silu", "tie_word_embeddings": False, "bos_token_id": 1, "eos_token_id": [2, 3],
    "torch_dtype": "bfloat16",
}
MISTRAL = {
    "architectures": ["MistralForCausalLM"], "model_type": "mistral", "vocab_size": 128, "hidden_size": 64,
    "intermediate_size": 112, "num_hidden_layers": 2, "num_attention_heads": 8, "num_key_value_heads": 4,
    "max_position_embeddings": 64, "rms_norm_eps": 1e-5, "rope_theta": 10000.0, "sliding_window": 7,
    "hidden_act": "silu", "tie_word_embeddings": False, "bos_token_id": 1, "eos_token_id": 2,
    "torch_dtype": "bfloat16",
}
MISTRAL_FULL = dict(MISTRAL, sliding_window=None, tie_word_embeddings=True, head_dim=16, torch_dtype="float32")


GEMMA2 = {
    "architectures": ["Gemma2ForCausalLM"], "model_type": "gemma2", "vocab_size": 160, "hidden_size": 64,
    "intermediate_size": 96, "num_hidden_layers": 3, "num_attention_heads": 4, "num_key_value_heads": 2,
    "head_dim": 24, "query_pre_attn_scalar": 20, "max_position_embeddings": 64, "rms_norm_eps": 1e-6,
    "rope_theta": 10000.0, "attn_logit_softcapping": 2.0, "final_logit_softcapping": 3.0, "sliding_window": 5,
    "hidden_act": "gelu_pytorch_tanh", "hidden_activation": "gelu_pytorch_tanh", "tie_word_embeddings": True,
    "attention_bias": False, "bos_token_id": 2, "eos_token_id": 1, "pad_token_id": 0, "torch_dtype": "float32",
}
GEMMA3 = {
    "architectures": ["Gemma3ForCausalLM"], "model_type": "gemma3_text", "vocab_size": 152, "hidden_size": 48,
    "intermediate_size": 80, "num_hidden_layers": 4, "num_attention_heads": 4, "num_key_value_heads": 1,
    "head_dim": 16, "query_pre_attn_scalar": 32, "max_position_embeddings": 64, "rms_norm_eps": 1e-6,
    "rope_theta": 1000000.0, "rope_local_base_freq": 10000.0, "rope_scaling": {"rope_type": "linear", "factor": 4.0},
    "sliding_window": 6, "sliding_window_pattern": 2, "attn_logit_softcapping": None,
    "final_logit_softcapping": None, "hidden_activation": "gelu_pytorch_tanh", "tie_word_embeddings": False,
    "bos_token_id": 2, "eos_token_id": [1, 106], "pad_token_id": 0, "torch_dtype": "bfloat16",
}
GEMMA3_NESTED = {
    "architectures": ["Gemma3ForCausalLM"], "model_type": "gemma3_text", "vocab_size": 136, "hidden_size": 64,
    "intermediate_size": 72, "num_hidden_layers": 3, "num_attention_heads": 4, "num_key_value_heads": 2,
    "head_dim": 16, "query_pre_attn_scalar": 16, "max_position_embeddings": 64, "rms_norm_eps": 1e-6,
    "layer_types": ["sliding_attention", "full_attention", "sliding_attention"], "sliding_window": 7,
    "rope_parameters": {"sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
                        "full_attention": {"rope_type": "linear", "factor": 2.0, "rope_theta": 500000.0}},
    "hidden_activation": "gelu_pytorch_tanh", "tie_word_embeddings": True, "bos_token_id": 2, "eos_token_id": 1,
    "torch_dtype": "float32",
}


PHI3 = {
    "architectures": ["Phi3ForCausalLM"], "model_type": "phi3", "vocab_size": 144, "hidden_size": 64,
    "intermediate_size": 80, "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
    "max_position_embeddings": 64, "original_max_position_embeddings": 64, "rms_norm_eps": 1e-5,
    "rope_theta": 10000.0, "rope_scaling": None, "partial_rotary_factor": 1.0, "sliding_window": None,
    "hidden_act": "silu", "tie_word_embeddings": False, "attention_dropout": 0.0, "resid_pdrop": 0.0,
    "embd_pdrop": 0.0, "bos_token_id": 1, "eos_token_id": 32000, "pad_token_id": 32000,
    "torch_dtype": "bfloat16",
}
# head_dim 16 x 0.75: rotary_dim 12, six factors each; original 16 < 24 positions: the long factors
# for the reference input, the short ones for its first 16 tokens; attention_factor sqrt(1 + ln 4 / ln 16).
PHI3_LONGROPE = dict(
    PHI3, vocab_size=136, num_hidden_layers=3, partial_rotary_factor=0.75, original_max_position_embeddings=16,
    rope_theta=250000.0, sliding_window=7, tie_word_embeddings=True, torch_dtype="float32",
    rope_scaling={"type": "longrope", "short_factor": [1.0, 1.3, 1.9, 2.6, 3.8, 5.0],
                  "long_factor": [1.1, 2.5, 4.0, 7.5, 12.0, 20.0]})


def check_phi3_ablations(name, cfg, sd, ids, logits):
    """longrope, its long factors, partial rotary and the window must each change the result."""
    rs = cfg["rope_scaling"]
    no_rope_scaling = dict(cfg, rope_scaling=None)
    ablations = {"longrope": no_rope_scaling,
                 "long factors": dict(cfg, rope_scaling=dict(rs, long_factor=rs["short_factor"])),
                 "sliding window": dict(cfg, sliding_window=None)}
    with torch.no_grad():
        for what, changed in ablations.items():
            diff = (forward(changed, sd, ids) - logits).abs().max().item()
            assert diff > 1e-2, f"{name}: the {what} does not change the logits ({diff})"
            print(f"{name}: the {what} changes logits by up to {diff:.3f}")
        diff = (forward(dict(no_rope_scaling, partial_rotary_factor=1.0), sd, ids) -
                forward(no_rope_scaling, sd, ids)).abs().max().item()
        assert diff > 1e-2, f"{name}: partial rotary does not change the logits ({diff})"
        print(f"{name}: partial rotary (0.75 vs 1.0) changes logits by up to {diff:.3f}")


def check_gemma_ablations(name, cfg, sd, ids, logits):
    """Soft-capping and the window must change the result, or the parity test could not tell."""
    ablations = {"sliding window": dict(cfg, sliding_window=10**6)}
    if cfg.get("attn_logit_softcapping"):
        ablations["attention soft-cap"] = dict(cfg, attn_logit_softcapping=None)
    if cfg.get("final_logit_softcapping"):
        ablations["final soft-cap"] = dict(cfg, final_logit_softcapping=None)
    for what, changed in ablations.items():
        with torch.no_grad():
            diff = (forward(changed, sd, ids) - logits).abs().max().item()
        assert diff > 1e-2, f"{name}: the {what} does not change the logits ({diff})"
        print(f"{name}: the {what} changes logits by up to {diff:.3f}")


def make(out, name, cfg, dtype, shards, seed):
    d = os.path.join(out, name)
    os.makedirs(d, exist_ok=True)
    gen = torch.Generator().manual_seed(seed)
    sd = {k: v.to(dtype) for k, v in random_state(cfg, gen).items()}
    with open(os.path.join(d, "config.json"), "w") as f:
        json.dump(cfg, f, indent=2)
    for f in os.listdir(d):
        if f.startswith("model"):
            os.remove(os.path.join(d, f))
    names = sorted(sd)
    if shards == 1:
        st_write(os.path.join(d, "model.safetensors"), sd, {"format": "pt"})
    else:
        per = (len(names) + shards - 1) // shards
        weight_map, total = {}, 0
        for s in range(shards):
            fname = f"model-{s + 1:05d}-of-{shards:05d}.safetensors"
            part = {n: sd[n] for n in names[s * per:(s + 1) * per]}
            st_write(os.path.join(d, fname), part, {"format": "pt"})
            for n, t in part.items():
                weight_map[n] = fname
                total += t.numel() * t.element_size()
        with open(os.path.join(d, "model.safetensors.index.json"), "w") as f:
            json.dump({"metadata": {"total_size": total}, "weight_map": weight_map}, f, indent=2)
    # Reference outputs, from the files as written (so dtype rounding is included), in fp32.
    sd = {k: v.float() for k, v in load_folder(d).items()}
    B, T = 3, 24
    ids = torch.randint(0, cfg["vocab_size"], (B, T), generator=gen)
    labels = ids.clone()
    labels[0, :5] = -100
    labels[1, :11] = -100
    labels[2, 20:] = -100
    with torch.no_grad():
        logits = forward(cfg, sd, ids)
        loss = loss_fn(logits, labels)
    outputs = {"input_ids": ids, "labels": labels, "logits": logits.float().contiguous(),
               "loss": loss.float().reshape(())}
    original = cfg.get("original_max_position_embeddings")
    if cfg["model_type"] == "phi3" and cfg.get("rope_scaling") and original < T:
        # A forward of at most original positions takes longrope's short factors.
        short_ids = ids[:, :original].contiguous()
        with torch.no_grad():
            outputs["short_logits"] = forward(cfg, sd, short_ids).float().contiguous()
        outputs["short_input_ids"] = short_ids
    st_write(os.path.join(d, "reference.safetensors"), outputs, {"format": "pt"})
    print(f"{name}: loss {loss.item():.6f}, logits |max| {logits.abs().max().item():.3f} -> {d}")
    if is_gemma(cfg):
        check_gemma_ablations(name, cfg, sd, ids, logits)
    if cfg["model_type"] == "phi3" and cfg.get("rope_scaling"):
        check_phi3_ablations(name, cfg, sd, ids, logits)
    window = sliding_window(cfg)
    if window is not None and window < T:
        # The window must change the result, or the parity test could not tell it apart.
        with torch.no_grad():
            full = forward(dict(cfg, sliding_window=None), sd, ids)
        diff = (full - logits).abs().max().item()
        assert diff > 1e-2, f"{name}: the sliding window does not change the logits ({diff})"
        print(f"{name}: sliding window {window} < {T} positions changes logits by up to {diff:.3f}")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    torch.set_num_threads(1)
    make(a.out, "llama", LLAMA, torch.bfloat16, 1, 1234)
    make(a.out, "qwen2", QWEN2, torch.float32, 3, 4321)
    make(a.out, "qwen3", QWEN3, torch.float32, 2, 5678)
    make(a.out, "qwen3_untied", QWEN3_UNTIED, torch.bfloat16, 1, 8765)
    make(a.out, "mistral", MISTRAL, torch.bfloat16, 1, 2468)
    make(a.out, "mistral_full", MISTRAL_FULL, torch.float32, 1, 1357)
    make(a.out, "gemma2", GEMMA2, torch.float32, 1, 2024)
    make(a.out, "gemma3_text", GEMMA3, torch.bfloat16, 1, 2025)
    make(a.out, "gemma3_nested", GEMMA3_NESTED, torch.float32, 1, 3025)
    make(a.out, "phi3", PHI3, torch.bfloat16, 1, 3141)
    make(a.out, "phi3_longrope", PHI3_LONGROPE, torch.float32, 1, 2718)


if __name__ == "__main__":
    main()
