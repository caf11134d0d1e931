#!/usr/bin/python3
"""Parity reference from the real transformers package (where it is installed: Debian testing's
python3-transformers in the forky root, tests/portability/forky_trainer_check.sh).

For every model family sftctl loads, transformers itself builds a small model from a config (the
family configs of tests/reference/hf_reference.py, in fp32; gemma3_vision: a tiny
Gemma3ForConditionalGeneration, whose text-only forward is the reference), its parameters are drawn again so
that the norms are not all ones and the largest logit is 30 (the final norm scaled to it;
transformers' own init, std 0.02, gives logits near 0, where every implementation agrees), `save_pretrained` writes the
checkpoint in transformers' own layout and config form (rope_parameters, layer_types, tied weights
left out), and the model's eager forward gives the reference:

  OUT/<family>/config.json, model.safetensors      (save_pretrained, fp32)
  OUT/<family>/reference.safetensors: input_ids [B,T] I64, labels [B,T] I64 (-100 on "prompt"
      positions), logits [B,T,V] F32 and loss [] F32 (transformers' loss: mean CE over the
      shifted targets != -100); for longrope also short_input_ids / short_logits (the first
      original_max_position_embeddings tokens, which take the short factors); logits_fp64, the
      same forward in float64 (the exact value both fp32 forwards are measured against: at a logit
      scale of 30, transformers' own fp32 logits are 0.7e-5 to 2.2e-5 from it, and its eager and
      sdpa paths, or 1 and 4 threads, differ from each other by as much).

Each family's features must matter, or a parity test could not tell them apart: a sliding window
shorter than the sequence, soft-capping that caps, longrope's factor sets and partial rotary are
each turned off in a second model with the same weights, and the logits must move by > 1e-2.

And the other way: with --check-saved, transformers loads what sftctl saved of each family
(OUT/<family>/sftctl-saved, written by transformers_parity_test) and must give the same logits.

Usage: python3 tests/reference/transformers_reference.py --out DIR [--only FAMILY,...] [--check-saved]
Deterministic (fixed seeds); about 20 s with a cold import of transformers.
"""
import argparse
import copy
import json
import math
import os
import shutil
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import hf_reference as ref  # noqa: E402  (the family configs; its math is not used here)

from safetensors.torch import save_file  # noqa: E402
from transformers import AutoConfig, AutoModelForCausalLM  # noqa: E402

B, T = 3, 24

# Soft-caps that cap at the logit scale below: Gemma 2's real values are 50 and 30.
GEMMA2 = dict(ref.GEMMA2, attn_logit_softcapping=5.0, final_logit_softcapping=20.0)
# transformers checks that the special tokens are inside the vocabulary (a real Phi-3's 32000 is).
PHI3 = dict(ref.PHI3, eos_token_id=143, pad_token_id=143)
PHI3_LONGROPE = dict(ref.PHI3_LONGROPE, eos_token_id=135, pad_token_id=135)

# Gemma 3 4B and larger: Gemma3ForConditionalGeneration, a vision checkpoint whose text tower
# (gemma3_text's config, tied as the real ones are) sftctl trains; a tiny SigLIP tower and
# projector that sftctl carries through unchanged. The reference is the text-only forward of the
# whole model (input_ids without image tokens; image_token_index stays out of the vocabulary).
GEMMA3_VISION = {
    "architectures": ["Gemma3ForConditionalGeneration"], "model_type": "gemma3",
    "text_config": {k: v for k, v in dict(ref.GEMMA3, tie_word_embeddings=True).items()
                    if k not in ("architectures", "torch_dtype")},
    "vision_config": {"model_type": "siglip_vision_model", "hidden_size": 32, "intermediate_size": 48,
                      "num_hidden_layers": 1, "num_attention_heads": 2, "image_size": 28, "patch_size": 14},
    "mm_tokens_per_image": 4, "tie_word_embeddings": True, "bos_token_id": 2, "eos_token_id": [1, 106],
    "pad_token_id": 0,
}

# name -> config; every one in fp32.
FAMILIES = {
    "llama": ref.LLAMA,
    "qwen2": ref.QWEN2,
    "qwen3": ref.QWEN3,
    "qwen3_untied": ref.QWEN3_UNTIED,
    "mistral": ref.MISTRAL,
    "mistral_full": ref.MISTRAL_FULL,
    "gemma2": GEMMA2,
    "gemma3_text": ref.GEMMA3,
    "gemma3_nested": ref.GEMMA3_NESTED,
    "phi3": PHI3,
    "phi3_longrope": PHI3_LONGROPE,
    "gemma3_vision": GEMMA3_VISION,
}


def text_cfg(cfg):
    """The text model's config.json dict (a multimodal config's text_config)."""
    return cfg.get("text_config", cfg)


def hf_config(cfg, **changes):
    """transformers' config class for `cfg` (a config.json dict), in fp32, eager attention."""
    d = {k: v for k, v in dict(cfg, **changes).items() if k not in ("architectures", "model_type", "torch_dtype")}
    for sub in ("text_config", "vision_config"):  # (Gemma3Config builds its sub-configs from dicts)
        if sub in d:
            d[sub] = {k: v for k, v in d[sub].items() if k not in ("architectures", "model_type", "torch_dtype")}
    c = AutoConfig.for_model(cfg["model_type"], **d)
    c.architectures = cfg["architectures"]
    c.dtype = "float32"
    return c


def build(config):
    torch.manual_seed(0)  # (transformers' init; every parameter is drawn again below)
    model = AutoModelForCausalLM.from_config(config, attn_implementation="eager", dtype=torch.float32)
    return model.eval()


def redraw(model, family, gen):
    """Every parameter drawn again: norms around their neutral value (1, or 0 for Gemma's 1 + w),
    projections with std ~1.2/sqrt(fan_in), embeddings and the head so that logits reach ~30."""
    gemma = family.startswith("gemma")
    with torch.no_grad():
        for name, p in model.named_parameters():
            noise = torch.randn(p.shape, generator=gen)
            if name.endswith("norm.weight") or "layernorm" in name:
                p.copy_((0.0 if gemma else 1.0) + 0.25 * noise)
            elif name.endswith(".bias"):
                p.copy_(0.2 * noise)
            elif "embed_tokens" in name or name == "lm_head.weight":
                p.copy_(1.2 * noise)
            else:
                p.copy_(1.2 / math.sqrt(p.shape[-1]) * noise)


def rescale_logits(model, family, ids, scale=30.0):
    """The final norm's weight scaled so that the largest |logit| is `scale` (logits are linear in
    it): the parity bar is stated at that scale. Not with a final soft-cap, which bounds them."""
    if model.config.to_dict().get("final_logit_softcapping"):
        return
    text = getattr(model.model, "language_model", model.model)  # Gemma3ForConditionalGeneration's tower
    norm = text.norm.weight
    with torch.no_grad():
        k = scale / forward(model, ids)[0].abs().max().item()
        if family.startswith("gemma"):  # (1 + w) * k == 1 + w'
            norm.copy_((1.0 + norm) * k - 1.0)
        else:
            norm.mul_(k)


def forward(model, ids, labels=None):
    with torch.no_grad():
        out = model(input_ids=ids, labels=labels)
    return out.logits.float().contiguous(), (None if labels is None else out.loss.float().reshape(()))


def ablations(cfg):
    """Changes that must each move the logits: the features a parity test is there to check."""
    out = {}
    window = cfg.get("sliding_window")
    if window and window < T:
        out["sliding window"] = {"sliding_window": 4096}
    for cap in ("attn_logit_softcapping", "final_logit_softcapping"):
        if cfg.get(cap):
            out[cap] = {cap: None}
    if cfg["model_type"] == "phi3" and cfg.get("rope_scaling"):
        rs = cfg["rope_scaling"]
        out["longrope"] = {"rope_scaling": None}
        out["long factors"] = {"rope_scaling": dict(rs, long_factor=rs["short_factor"])}
        out["partial rotary"] = {"partial_rotary_factor": 1.0, "rope_scaling": None}
    return out


def make(out_dir, family, cfg, seed):
    d = os.path.join(out_dir, family)
    shutil.rmtree(d, ignore_errors=True)
    os.makedirs(d)
    gen = torch.Generator().manual_seed(seed)
    model = build(hf_config(cfg))
    redraw(model, family, gen)
    ids = torch.randint(0, text_cfg(cfg)["vocab_size"], (B, T), generator=gen)
    rescale_logits(model, family, ids)
    model.save_pretrained(d, safe_serialization=True)
    labels = ids.clone()
    labels[0, :5] = -100
    labels[1, :11] = -100
    labels[2, 20:] = -100
    logits, loss = forward(model, ids, labels)
    outputs = {"input_ids": ids, "labels": labels, "logits": logits, "loss": loss}
    # The exact forward, against which both fp32 forwards (transformers' and sftctl's) are measured.
    with torch.no_grad():
        outputs["logits_fp64"] = copy.deepcopy(model).double()(input_ids=ids).logits.float().contiguous()
    original = cfg.get("original_max_position_embeddings")
    if cfg["model_type"] == "phi3" and cfg.get("rope_scaling") and original < T:
        short_ids = ids[:, :original].contiguous()
        outputs["short_input_ids"] = short_ids
        outputs["short_logits"] = forward(model, short_ids)[0]
    save_file(outputs, os.path.join(d, "reference.safetensors"), {"format": "pt"})
    print(f"{family}: {type(model).__name__}, loss {loss.item():.6f}, logits |max| {logits.abs().max().item():.2f}, "
          f"argmax margin min {margin(logits):.3g} -> {d}")
    state = model.state_dict()
    for what, changes in ablations(cfg).items():
        other = build(hf_config(cfg, **changes))
        other.load_state_dict(state)
        diff = (forward(other, ids)[0] - logits).abs().max().item()
        assert diff > 1e-2, f"{family}: turning off the {what} does not change the logits ({diff})"
        print(f"{family}: the {what} changes logits by up to {diff:.3f}")


def margin(logits):
    """The smallest gap between the two largest logits of any position (an argmax check's slack)."""
    top = logits.topk(2, dim=-1).values
    return (top[..., 0] - top[..., 1]).min().item()


def check_lora(family, d, ids):
    """sftctl's adapter (transformers_parity_test writes OUT/<family>/sftctl-lora) applied to
    transformers' model as PEFT would: each key base_model.model.<module>.lora_A/B.weight names a
    module of transformers' model, whose weight gains s * B @ A (s = lora_alpha / r, or / sqrt(r)
    with use_rslora); the logits must be sftctl's adapted ones. Without PEFT installed (Debian has
    none), this is PEFT's documented layout checked against the real module names."""
    from safetensors.torch import load_file
    lora = os.path.join(d, "sftctl-lora")
    with open(os.path.join(lora, "adapter_config.json")) as f:
        cfg = json.load(f)
    tensors = load_file(os.path.join(lora, "adapter_model.safetensors"))
    want = load_file(os.path.join(lora, "sftctl_logits.safetensors"))["logits"]
    model = AutoModelForCausalLM.from_pretrained(d, attn_implementation="eager", dtype=torch.float32).eval()
    r = cfg["r"]
    scale = cfg["lora_alpha"] / (math.sqrt(r) if cfg.get("use_rslora") else r)
    problems = [f"{k} is {cfg.get(k)!r}" for k, v in (("peft_type", "LORA"), ("task_type", "CAUSAL_LM")) if cfg.get(k) != v]
    modules = set()
    for key in tensors:
        prefix, _, rest = key.partition("base_model.model.")
        module, _, suffix = rest.rpartition(".lora_")
        if prefix or suffix not in ("A.weight", "B.weight"):
            problems.append(f"'{key}' is not a PEFT LoRA key")
            continue
        modules.add(module)
    with torch.no_grad():
        for module in sorted(modules):
            try:
                linear = model.get_submodule(module)
            except AttributeError:
                problems.append(f"'{module}' is not a module of transformers' {type(model).__name__}")
                continue
            if module.rsplit(".", 1)[-1] not in cfg["target_modules"]:
                problems.append(f"'{module}' is not named by target_modules {cfg['target_modules']}")
            a, b = tensors[f"base_model.model.{module}.lora_A.weight"], tensors[f"base_model.model.{module}.lora_B.weight"]
            if a.shape[0] != r or b.shape[1] != r:
                problems.append(f"'{module}': A {list(a.shape)}, B {list(b.shape)} for r {r}")
                continue
            linear.weight += scale * (b.float() @ a.float())
    diff = (forward(model, ids)[0] - want).abs().max().item() if not problems else float("inf")
    print(f"{family}: sftctl's LoRA adapter on transformers' modules ({len(modules)} of them, "
          f"target_modules {cfg['target_modules']}, scale {scale:.3g}): logits differ by {diff:.3g}"
          + (f"; {'; '.join(problems)}" if problems else ""))
    return not problems and diff <= 5e-5


def check_saved(out_dir, families):
    """transformers loads what sftctl saved of each family (transformers_parity_test writes
    OUT/<family>/sftctl-saved): every tensor used, none left over, and the same logits as its own
    checkpoint gave, bit for bit (the same fp32 weights and config through the same code)."""
    from safetensors.torch import load_file
    failures = []
    for family in families:
        d = os.path.join(out_dir, family)
        ref = load_file(os.path.join(d, "reference.safetensors"))
        try:
            model, info = AutoModelForCausalLM.from_pretrained(
                os.path.join(d, "sftctl-saved"), attn_implementation="eager", dtype=torch.float32,
                output_loading_info=True)
        except Exception as e:  # (transformers' own message says which field or tensor)
            print(f"{family}: transformers cannot load sftctl's save: {type(e).__name__}: {e}")
            failures.append(family)
            continue
        problems = {k: v for k, v in info.items() if v}
        diff = (forward(model.eval(), ref["input_ids"])[0] - ref["logits"]).abs().max().item()
        print(f"{family}: transformers loads sftctl's save as {type(model).__name__}: logits differ by {diff:.3g}"
              + (f"; loading info {problems}" if problems else ""))
        if problems or diff != 0.0:
            failures.append(family)
        if os.path.isdir(os.path.join(d, "sftctl-lora")) and not check_lora(family, d, ref["input_ids"]):
            failures.append(family + " (LoRA)")
    if failures:
        sys.exit(f"transformers_reference.py --check-saved: sftctl's saved {', '.join(failures)} "
                 "do not load in transformers as the checkpoints they came from")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--only", default="", help="comma-separated families (default: all)")
    ap.add_argument("--check-saved", action="store_true",
                    help="load OUT/<family>/sftctl-saved (written by transformers_parity_test) instead")
    a = ap.parse_args()
    torch.set_num_threads(1)
    only = [f for f in a.only.split(",") if f]
    for f in only:
        if f not in FAMILIES:
            sys.exit(f"transformers_reference.py: unknown family '{f}' (known: {', '.join(FAMILIES)})")
    import transformers
    transformers.utils.logging.disable_progress_bar()
    print(f"transformers {transformers.__version__}, torch {torch.__version__}")
    if a.check_saved:
        check_saved(a.out, only or list(FAMILIES))
        return
    for i, (family, cfg) in enumerate(FAMILIES.items()):
        if not only or family in only:
            make(a.out, family, cfg, 9000 + i)
    with open(os.path.join(a.out, "families.json"), "w") as f:
        json.dump(only or list(FAMILIES), f)


if __name__ == "__main__":
    main()
