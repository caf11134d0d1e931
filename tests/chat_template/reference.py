#!/usr/bin/env python3
"""Reference chat-template renderings, rendered the way transformers' apply_chat_template does:
Python Jinja2's ImmutableSandboxedEnvironment with trim_blocks, lstrip_blocks and
jinja2.ext.loopcontrols, transformers' tojson (json.dumps, ensure_ascii=False), its
raise_exception and strftime_now globals, and the variables it passes: messages, tools (None
without tools), documents (None), add_generation_prompt, bos_token, eos_token.

  reference.py TEMPLATES_DIR OUT_DIR CONVERSATIONS.jsonl...

TEMPLATES_DIR holds real templates (written by extract_templates.js); the *.jinja files of this
folder are rendered too. Each CONVERSATIONS.jsonl line is {"messages": [...], "tools": [...]?}.
Writes OUT_DIR/chat-<name>.jsonl, one line per conversation (all files, in order), with each of
add_generation_prompt=False/True as "text"/"text_gen", or "error"/"error_gen" when rendering
raised: "raise_exception: <message>" for the template's own raise_exception, else
"<ExceptionType>: <message>".

strftime_now formats a fixed time, 2025-03-14 15:09:26, so renderings are reproducible.

Python Jinja2 rather than @huggingface/jinja (transformers.js): the latter ignores the
argument of str.lstrip/rstrip/strip (Qwen3's `content.lstrip('\\n')` strips all whitespace
there), while transformers, vLLM and TRL use Python Jinja2.
"""
import datetime
import json
import os
import sys

import jinja2
from jinja2.ext import Extension
from jinja2.sandbox import ImmutableSandboxedEnvironment

FIXED_NOW = datetime.datetime(2025, 3, 14, 15, 9, 26)


class RaisedByTemplate(jinja2.exceptions.TemplateError):
    pass


def raise_exception(message):
    raise RaisedByTemplate(message)


def strftime_now(fmt):
    return FIXED_NOW.strftime(fmt)


def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


class GenerationTracker(Extension):
    """transformers' AssistantTracker: {% generation %}...{% endgeneration %} renders its body."""

    tags = {"generation"}

    def parse(self, parser):
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(["name:endgeneration"], drop_needle=True)
        return jinja2.nodes.CallBlock(self.call_method("_render", []), [], [], body).set_lineno(lineno)

    def _render(self, caller):
        return caller()


def special_tokens(name, here):
    with open(os.path.join(here, "special_tokens.json"), encoding="utf-8") as f:
        table = json.load(f)
    best = max((p for p in table if not p.startswith("_") and name.startswith(p)), key=len)
    return table[best]


def render(t, ctx, gen):
    try:
        return "text", t.render(**ctx, add_generation_prompt=gen)
    except RaisedByTemplate as e:
        return "error", f"raise_exception: {e.message}"
    except Exception as e:  # noqa: BLE001 - any error is a reference outcome
        return "error", f"{type(e).__name__}: {e}"


def main():
    if len(sys.argv) < 4:
        sys.exit("usage: reference.py TEMPLATES_DIR OUT_DIR CONVERSATIONS.jsonl...")
    templates_dir, out_dir = sys.argv[1:3]
    here = os.path.dirname(os.path.abspath(__file__))
    sources = {}
    for d in (templates_dir, here):
        for f in sorted(os.listdir(d)):
            if f.endswith(".jinja"):
                with open(os.path.join(d, f), encoding="utf-8") as fh:
                    sources[f[: -len(".jinja")]] = fh.read()
    records = []
    for conv_file in sys.argv[3:]:
        with open(conv_file, encoding="utf-8") as f:
            records += [json.loads(line) for line in f if line.strip()]

    env = ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=["jinja2.ext.loopcontrols", GenerationTracker]
    )
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = strftime_now
    os.makedirs(out_dir, exist_ok=True)
    for name, template in sources.items():
        bos, eos = special_tokens(name, here)
        lines = []
        try:
            t = env.from_string(template)
        except Exception as e:  # noqa: BLE001
            outcome = ("error", f"{type(e).__name__}: {e}")
            t = None
        for rec in records:
            ctx = dict(messages=rec["messages"], tools=rec.get("tools"), documents=None, bos_token=bos, eos_token=eos)
            line = {}
            for gen, key in ((False, "text"), (True, "text_gen")):
                kind, value = render(t, ctx, gen) if t else outcome
                line[key if kind == "text" else key.replace("text", "error")] = value
            lines.append(json.dumps(line, ensure_ascii=False))
        with open(os.path.join(out_dir, f"chat-{name}.jsonl"), "w", encoding="utf-8") as f:
            f.write("\n".join(lines) + "\n")
    print(f"chat template reference: {len(sources)} templates x {len(records)} conversations in {out_dir}")


if __name__ == "__main__":
    main()
