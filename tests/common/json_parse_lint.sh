#!/usr/bin/env bash
# ctest common.json_parse_lint: JSON that comes from outside the process (provider and Hub API answers,
# agent and host answers the client parses, files from a host, a bucket or the Hub, files a user may
# have copied from someone) is parsed only through common/json_parse.h (ParseJson / ParseOrderedJson:
# never throws, nests at most 64 deep, so no later dump, copy or walk recurses without bound). A bare
# nlohmann parse (json::parse, ordered_json::parse, sax_parse, from_cbor, ...) in client/, common/,
# agent/ or trainer/ fails this check with its file:line, unless the file is on the allow-list
# (tests/common/json_parse_allowlist.txt: files that parse only this program's own data, or bound the
# depth themselves, each with its reason). An allow-list entry whose file no longer has a bare parse
# fails too, so the list stays exact.
#
# Usage: json_parse_lint.sh SOURCE_DIR [ALLOWLIST]    (ALLOWLIST: default tests/common/json_parse_allowlist.txt)
#        json_parse_lint.sh --self-test               (the check fails on a planted bare parse)
set -uo pipefail

# Calls that parse text into a json value without ParseJson's bound; comment lines are not code.
readonly PATTERN='(\b|::)(json|ordered_json|basic_json<[^>]*>)::(parse|sax_parse|accept|from_cbor|from_msgpack|from_ubjson|from_bjdata|from_bson)[[:space:]]*\('
readonly DIRS=(client common agent trainer)

lint() {
  local src=$1 allowlist=$2 failed=0
  declare -A allowed=() seen=()
  if [ ! -r "$allowlist" ]; then
    echo "FAILED: cannot read the allow-list $allowlist"
    return 1
  fi
  while IFS= read -r line; do
    line=${line%%#*}
    line=$(echo "$line" | tr -d '[:space:]')
    [ -n "$line" ] && allowed[$line]=1
  done <"$allowlist"
  local dirs=()
  for d in "${DIRS[@]}"; do [ -d "$src/$d" ] && dirs+=("$d"); done
  if [ ${#dirs[@]} -eq 0 ]; then
    echo "FAILED: none of ${DIRS[*]} under $src"
    return 1
  fi
  local hits
  hits=$(cd "$src" && grep -rnE --include='*.cpp' --include='*.cc' --include='*.h' --include='*.hpp' \
    "$PATTERN" "${dirs[@]}" | grep -vE '^[^:]+:[0-9]+:[[:space:]]*//')
  while IFS= read -r hit; do
    [ -z "$hit" ] && continue
    local file=${hit%%:*}
    if [ -n "${allowed[$file]:-}" ]; then
      seen[$file]=1
      continue
    fi
    local rest=${hit#*:}
    echo "FAILED: $file:${rest%%:*}: a bare JSON parse: use ParseJson (common/json_parse.h), or add $file" \
      "to $(basename "$allowlist") with why its input is trusted: ${rest#*:}"
    failed=1
  done <<<"$hits"
  for file in "${!allowed[@]}"; do
    if [ -z "${seen[$file]:-}" ]; then
      echo "FAILED: $file is on $(basename "$allowlist") but has no bare JSON parse (any more): remove it"
      failed=1
    fi
  done
  [ $failed -eq 0 ] && echo "ok: no bare JSON parse outside $(basename "$allowlist") (${#allowed[@]} files allowed)"
  return $failed
}

self_test() {
  local tmp failed=0 out
  tmp=$(mktemp -d "${TMPDIR:-/tmp}/json-lint-XXXXXX")
  trap 'rm -rf "$tmp"' RETURN
  mkdir -p "$tmp/client/cloud" "$tmp/common"
  printf '%s\n' '#include "common/json_parse.h"' '// json::parse( in a comment is no call' \
    'auto a = ParseJson(body, "x");' >"$tmp/common/clean.cpp"
  printf '%s\n' 'int x;' '  out.body = nlohmann::json::parse(r->body, nullptr, false);' >"$tmp/client/cloud/api.cpp"
  printf '%s\n' 'auto j = ordered_json::parse (text);' >"$tmp/common/own.cpp"
  printf '%s\n' 'common/own.cpp  # our own file' >"$tmp/allow.txt"
  out=$(lint "$tmp" "$tmp/allow.txt")
  if [ $? -eq 0 ] || ! grep -q "FAILED: client/cloud/api.cpp:2: a bare JSON parse" <<<"$out" ||
    grep -q "common/own.cpp\|common/clean.cpp" <<<"$out"; then
    echo "FAILED: the planted bare parse at client/cloud/api.cpp:2 was not reported alone:"
    echo "$out"
    failed=1
  else
    echo "ok: a planted bare parse is reported with its file:line"
  fi
  rm "$tmp/client/cloud/api.cpp"
  if ! out=$(lint "$tmp" "$tmp/allow.txt"); then
    echo "FAILED: a clean tree was refused:"
    echo "$out"
    failed=1
  else
    echo "ok: a clean tree passes"
  fi
  echo 'common/gone.cpp  # converted since' >>"$tmp/allow.txt"
  out=$(lint "$tmp" "$tmp/allow.txt")
  if [ $? -eq 0 ] || ! grep -q "common/gone.cpp is on allow.txt but has no bare JSON parse" <<<"$out"; then
    echo "FAILED: a stale allow-list entry was not reported:"
    echo "$out"
    failed=1
  else
    echo "ok: a stale allow-list entry is reported"
  fi
  return $failed
}

if [ "${1:-}" = "--self-test" ]; then
  self_test
  exit $?
fi
src=$1
lint "$src" "${2:-$src/tests/common/json_parse_allowlist.txt}"
