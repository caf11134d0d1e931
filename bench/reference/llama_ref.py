"""PyTorch-Python eager reference for the sftctl benchmarks (run with Debian's /usr/bin/python3).

The same architecture and training step as the C++ trainer (trainer/model/model.cpp, trainer/training/trainer.cpp),
written the way a Python user would with Hugging Face Llama math:
  * RMSNorm computed in fp32, cast back to the input dtype, then scaled;
  * rotate-half RoPE with fp32 cos/sin tables cast to the projections' dtype;
  * manual causal attention, scores and softmax in fp32;
  * SwiGLU MLP, no biases, untied lm_head, pre-norm + final norm;
  * loss: summed next-token cross-entropy in fp32 over positions whose label is not -100, logits
    formed only at those positions; divided by the batch's target count before backward.
Training step: forward + backward (under torch.autocast('cpu', bfloat16) for bf16; backward outside
the autocast context, as the PyTorch docs recommend), clip_grad_norm_, torch.optim.AdamW with the
trainer's two parameter groups (weight decay on 2-D non-embedding weights only), zero_grad.

Modules are created, and initialised, in the same order as the C++ CausalLM, so with the same
torch.manual_seed both start from the same weights (the same LibTorch library draws them).
"""

import math
import os
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

IGNORE = -100


def configure_threads(threads=0):
    """Like the trainer's ConfigureThreads: 0 = all cores. Returns the number in use."""
    torch.set_num_threads(threads if threads > 0 else (os.cpu_count() or 1))
    return torch.get_num_threads()


class RMSNorm(nn.Module):
    def __init__(self, dim, eps):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x):
        xf = x.to(torch.float32)
        y = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * y.to(x.dtype)


def rotate_half(x):
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


class Attention(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.heads = c["num_attention_heads"]
        self.head_dim = c["hidden_size"] // self.heads
        h = c["hidden_size"]
        self.q_proj = nn.Linear(h, self.heads * self.head_dim, bias=False)
        self.k_proj = nn.Linear(h, self.heads * self.head_dim, bias=False)
        self.v_proj = nn.Linear(h, self.heads * self.head_dim, bias=False)
        self.o_proj = nn.Linear(self.heads * self.head_dim, h, bias=False)

    def forward(self, x, cos, sin):
        B, T, _ = x.shape
        q = self.q_proj(x).view(B, T, self.heads, self.head_dim).transpose(1, 2)
        k = self.k_proj(x).view(B, T, self.heads, self.head_dim).transpose(1, 2)
        v = self.v_proj(x).view(B, T, self.heads, self.head_dim).transpose(1, 2)
        c, s = cos.to(q.dtype), sin.to(q.dtype)
        q = q * c + rotate_half(q) * s
        k = k * c + rotate_half(k) * s
        scores = torch.matmul(q, k.transpose(-2, -1)).to(torch.float32) * (1.0 / math.sqrt(self.head_dim))
        causal = torch.ones(T, T, dtype=torch.bool, device=x.device).triu(1)
        scores = scores.masked_fill(causal, float("-inf"))
        probs = torch.softmax(scores, dim=-1).to(v.dtype)
        out = torch.matmul(probs, v).transpose(1, 2).reshape(B, T, self.heads * self.head_dim)
        return self.o_proj(out)


class MLP(nn.Module):
    def __init__(self, c):
        super().__init__()
        h, i = c["hidden_size"], c["intermediate_size"]
        self.gate_proj = nn.Linear(h, i, bias=False)
        self.up_proj = nn.Linear(h, i, bias=False)
        self.down_proj = nn.Linear(i, h, bias=False)

    def forward(self, x):
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class DecoderLayer(nn.Module):
    def __init__(self, c):
        super().__init__()
        # Registration order as in the C++ DecoderLayerImpl (it fixes the init order).
        self.self_attn = Attention(c)
        self.mlp = MLP(c)
        self.input_layernorm = RMSNorm(c["hidden_size"], c["rms_norm_eps"])
        self.post_attention_layernorm = RMSNorm(c["hidden_size"], c["rms_norm_eps"])

    def forward(self, x, cos, sin):
        h = x + self.self_attn(self.input_layernorm(x), cos, sin)
        return h + self.mlp(self.post_attention_layernorm(h))


class Decoder(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.embed_tokens = nn.Embedding(c["vocab_size"], c["hidden_size"])
        self.layers = nn.ModuleList([DecoderLayer(c) for _ in range(c["num_hidden_layers"])])
        self.norm = RMSNorm(c["hidden_size"], c["rms_norm_eps"])


class CausalLM(nn.Module):
    """c: dict with vocab_size, hidden_size, intermediate_size, num_hidden_layers,
    num_attention_heads, max_position_embeddings, rms_norm_eps, rope_theta, initializer_range."""

    def __init__(self, c):
        super().__init__()
        self.config = c
        self.model = Decoder(c)
        self.lm_head = nn.Linear(c["hidden_size"], c["vocab_size"], bias=False)
        with torch.no_grad():
            for name, p in self.named_parameters():
                if name.endswith("bias"):
                    p.zero_()
                elif "norm" in name:
                    p.fill_(1.0)
                else:
                    p.normal_(0.0, c.get("initializer_range", 0.02))
        head_dim = c["hidden_size"] // c["num_attention_heads"]
        inv_freq = 1.0 / (c.get("rope_theta", 10000.0) **
                          (torch.arange(0, head_dim, 2, dtype=torch.int64).float() / head_dim))
        t = torch.arange(c["max_position_embeddings"], dtype=torch.float32)
        emb = torch.cat((torch.outer(t, inv_freq),) * 2, dim=-1)
        self.register_buffer("rope_cos", emb.cos(), persistent=False)
        self.register_buffer("rope_sin", emb.sin(), persistent=False)

    def hidden(self, input_ids):
        T = input_ids.shape[1]
        cos, sin = self.rope_cos[:T][None, None], self.rope_sin[:T][None, None]
        h = self.model.embed_tokens(input_ids)
        for layer in self.model.layers:
            h = layer(h, cos, sin)
        return self.model.norm(h)

    def logits(self, hidden):
        return self.lm_head(hidden)

    def loss_sum(self, input_ids, labels):
        hidden = self.hidden(input_ids)
        targets = labels[:, 1:]
        mask = targets.ne(IGNORE)
        h = hidden[:, :-1][mask]
        logits = self.logits(h).to(torch.float32)
        return F.cross_entropy(logits, targets[mask], reduction="sum")


def decays_weight(name, p):
    return p.dim() >= 2 and "embed_tokens" not in name


def make_optimizer(model, lr, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1, foreach=None):
    """torch.optim.AdamW with the trainer's groups: decay on 2-D non-embedding weights only."""
    decay, no_decay = [], []
    for name, p in model.named_parameters():
        if p.requires_grad:
            (decay if decays_weight(name, p) and weight_decay > 0 else no_decay).append(p)
    groups = []
    if decay:
        groups.append({"params": decay, "weight_decay": weight_decay})
    if no_decay:
        groups.append({"params": no_decay, "weight_decay": 0.0})
    kwargs = {} if foreach is None else {"foreach": foreach}
    return torch.optim.AdamW(groups, lr=lr, betas=betas, eps=eps, **kwargs)


def learning_rate(step, lr, warmup, total, min_lr_ratio=0.1, schedule="cosine"):
    """The trainer's LearningRate(): step is 0-based."""
    if warmup > 0 and step < warmup:
        return lr * (step + 1) / warmup
    if schedule == "constant":
        return lr
    min_lr = lr * min_lr_ratio
    progress = min(1.0, (step - warmup) / max(1, total - warmup))
    if schedule == "linear":
        return lr + (min_lr - lr) * progress
    return min_lr + 0.5 * (lr - min_lr) * (1.0 + math.cos(math.pi * progress))


def train_step(model, optimizer, input_ids, labels, targets, lr, bf16, clip=1.0):
    """One optimizer step on one micro-batch, as the trainer's loop. Returns (loss, grad_norm);
    the update is skipped (gradients zeroed) when either is non-finite."""
    if bf16:
        with torch.autocast("cpu", dtype=torch.bfloat16):
            loss_sum = model.loss_sum(input_ids, labels)
    else:
        loss_sum = model.loss_sum(input_ids, labels)
    (loss_sum / targets).backward()
    loss = loss_sum.item() / targets
    params = [p for p in model.parameters() if p.grad is not None]
    norm = torch.nn.utils.clip_grad_norm_(params, clip) if clip > 0 else torch.norm(
        torch.stack([p.grad.norm() for p in params]))
    grad_norm = norm.item()
    if not (math.isfinite(loss) and math.isfinite(grad_norm)):
        optimizer.zero_grad()
        return loss, grad_norm
    for g in optimizer.param_groups:
        g["lr"] = lr
    optimizer.step()
    optimizer.zero_grad()
    return loss, grad_norm


@torch.no_grad()
def greedy_generate(model, prompts, max_new_tokens, stop_id, batch_size, bf16):
    """Greedy decoding without a KV cache, prompts grouped by length (as trainer/model/generate.cpp)."""
    out = [[] for _ in prompts]
    by_len = {}
    for i, p in enumerate(prompts):
        by_len.setdefault(len(p), []).append(i)
    max_len = model.config["max_position_embeddings"]
    ctx = torch.autocast("cpu", dtype=torch.bfloat16) if bf16 else torch.autocast("cpu", enabled=False)
    with ctx:
        for length in sorted(by_len):
            rows_all = by_len[length]
            for start in range(0, len(rows_all), batch_size):
                rows = rows_all[start:start + batch_size]
                ids = torch.tensor([prompts[r] for r in rows], dtype=torch.int64)
                done = [False] * len(rows)
                remaining = len(rows)
                k = 0
                while k < max_new_tokens and remaining > 0 and ids.shape[1] < max_len:
                    hidden = model.hidden(ids)
                    nxt = model.logits(hidden[:, -1]).to(torch.float32).argmax(-1)
                    for j, tok in enumerate(nxt.tolist()):
                        if done[j]:
                            continue
                        out[rows[j]].append(tok)
                        if tok == stop_id:
                            done[j] = True
                            remaining -= 1
                    ids = torch.cat((ids, nxt.unsqueeze(1)), dim=1)
                    k += 1
    return out


def now():
    return time.perf_counter()
