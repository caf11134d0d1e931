#!/usr/bin/env bash
# ctest common.spec_parse_lint: each process turns a job spec's text into a JobSpec once, at its edge,
# and asks every later question of the type (docs/architecture.md, "Data flow"). The functions that
# parse a spec (PARSERS below) take text or JSON; everything after them takes `const JobSpec&` or
# `JobSpec*`. This check holds the code to that: every call of a parser in client/, common/, agent/ or
# trainer/ must be on tests/common/spec_parse_sites.txt (file, parser, number of calls, and why), so a
# second parse anywhere (a round trip through ToJson and ParseSpec, a second LoadSpecFile in a command, a
# second read of spec.json in the trainer) fails with its file:line until someone writes down why. A
# listed call that is gone fails too, so the list stays exact. The agent's one parse per submit and per
# recovery is also checked at run time (SupervisorClock.TheSpecIsParsedOnceAtSubmitAndOnceAtRecovery).
#
# A call is NAME( on a line of code; a line that starts in column 0 is a declaration or definition
# (this code base indents every statement), so its first NAME( is not a call. Comments are not code.
#
# Usage: spec_parse_lint.sh SOURCE_DIR [SITES]    (SITES: default tests/common/spec_parse_sites.txt)
#        spec_parse_lint.sh --self-test           (the check fails on a planted extra parse)
set -uo pipefail

readonly PARSERS=(ParseSpec LoadSpecFile OverrideSpec ValidateSpec ParseStoredSpec ReadSpecJson)
readonly DIRS=(client common agent trainer)

# "FILE PARSER LINE" for every call of a parser under $1.
calls() {
  local src=$1 dirs=() d
  for d in "${DIRS[@]}"; do [ -d "$src/$d" ] && dirs+=("$d"); done
  [ ${#dirs[@]} -eq 0 ] && return 1
  local names
  names=$(IFS='|'; echo "${PARSERS[*]}")
  (cd "$src" && grep -rnE --include='*.cpp' --include='*.cc' --include='*.h' --include='*.hpp' \
    "\\b($names)[[:space:]]*\\(" "${dirs[@]}") |
    awk -v names="$names" '
      {
        file = $0; sub(/:.*/, "", file)
        rest = substr($0, length(file) + 2)
        line = rest; sub(/:.*/, "", line)
        code = substr(rest, length(line) + 2)
        sub(/\/\/.*/, "", code)                       # a comment is not code
        declared = code ~ /^[^[:space:]#]/            # column 0: a declaration or definition
        while (match(code, "(^|[^A-Za-z0-9_])(" names ")[[:space:]]*\\(")) {
          hit = substr(code, RSTART, RLENGTH)
          sub(/^[^A-Za-z]/, "", hit); sub(/[[:space:]]*\($/, "", hit)
          if (declared) declared = 0; else print file, hit, line
          code = substr(code, RSTART + RLENGTH)
        }
      }'
}

lint() {
  local src=$1 sites=$2 failed=0
  if [ ! -r "$sites" ]; then
    echo "FAILED: cannot read the list of parse sites $sites"
    return 1
  fi
  declare -A allowed=() found=() where=()
  local file parser count line
  while read -r file parser count; do
    [ -z "$file" ] && continue
    allowed["$file $parser"]=$count
  done < <(sed -e 's/#.*//' "$sites" | awk 'NF >= 3 { print $1, $2, $3 }')
  local all
  if ! all=$(calls "$src"); then
    echo "FAILED: none of ${DIRS[*]} under $src"
    return 1
  fi
  while read -r file parser line; do
    [ -z "$file" ] && continue
    found["$file $parser"]=$((${found["$file $parser"]:-0} + 1))
    where["$file $parser"]+=" $file:$line"
  done <<<"$all"
  local key
  for key in "${!found[@]}"; do
    if [ "${found[$key]}" != "${allowed[$key]:-0}" ]; then
      echo "FAILED: ${key#* } is called ${found[$key]} time(s) in ${key% *} (at${where[$key]}), and" \
        "$(basename "$sites") allows ${allowed[$key]:-none}: a spec is parsed once per process; pass the" \
        "JobSpec on instead, or list the call with why"
      failed=1
    fi
  done
  for key in "${!allowed[@]}"; do
    if [ -z "${found[$key]:-}" ]; then
      echo "FAILED: $(basename "$sites") lists ${key#* } in ${key% *}, which no longer calls it:" \
        "remove the line"
      failed=1
    fi
  done
  [ $failed -eq 0 ] && echo "ok: every spec parse is one of the ${#allowed[@]} listed in $(basename "$sites")"
  return $failed
}

self_test() {
  local tmp failed=0 out
  tmp=$(mktemp -d "${TMPDIR:-/tmp}/spec-parse-lint-XXXXXX")
  trap 'rm -rf "$tmp"' RETURN
  mkdir -p "$tmp/client" "$tmp/common/spec" "$tmp/trainer"
  printf '%s\n' 'StatusOr<JobSpec> LoadSpecFile(const std::string& path) { return ParseSpec(j); }' \
    '// ParseSpec( in a comment is no call' 'StatusOr<JobSpec> ParseSpec(const json& j);' \
    >"$tmp/common/spec/spec.cpp"
  printf '%s\n' 'int Run() {' '  auto s = LoadSpecFile(p);  // the one parse, ParseSpec( inside' '}' \
    >"$tmp/client/run.cpp"
  printf '%s\n' 'common/spec/spec.cpp ParseSpec 1  # LoadSpecFile' 'client/run.cpp LoadSpecFile 1  # run' \
    >"$tmp/sites.txt"
  if ! out=$(lint "$tmp" "$tmp/sites.txt"); then
    echo "FAILED: a tree that parses once was refused:"
    echo "$out"
    failed=1
  else
    echo "ok: a tree that parses once passes"
  fi
  printf '%s\n' 'void Train(const JobSpec& spec) {' '  auto again = ParseSpec(ToJson(spec));' '}' \
    >"$tmp/trainer/train.cpp"
  out=$(lint "$tmp" "$tmp/sites.txt")
  if [ $? -eq 0 ] ||
    ! grep -q "ParseSpec is called 1 time(s) in trainer/train.cpp (at trainer/train.cpp:2)" <<<"$out"; then
    echo "FAILED: a planted round trip at trainer/train.cpp:2 was not reported:"
    echo "$out"
    failed=1
  else
    echo "ok: a planted round trip is reported with its file:line"
  fi
  rm "$tmp/trainer/train.cpp"
  printf '%s\n' '  auto twice = LoadSpecFile(p);' >>"$tmp/client/run.cpp"
  out=$(lint "$tmp" "$tmp/sites.txt")
  if [ $? -eq 0 ] || ! grep -q "LoadSpecFile is called 2 time(s) in client/run.cpp" <<<"$out"; then
    echo "FAILED: a second parse in a listed file was not reported:"
    echo "$out"
    failed=1
  else
    echo "ok: a second call of a listed parse is reported"
  fi
  printf '%s\n' 'int Run() {' '  auto s = LoadSpecFile(p);' '}' >"$tmp/client/run.cpp"
  echo 'client/gone.cpp LoadSpecFile 1  # removed since' >>"$tmp/sites.txt"
  out=$(lint "$tmp" "$tmp/sites.txt")
  if [ $? -eq 0 ] || ! grep -q "lists LoadSpecFile in client/gone.cpp, which no longer calls it" <<<"$out"
  then
    echo "FAILED: a stale line was not reported:"
    echo "$out"
    failed=1
  else
    echo "ok: a stale line is reported"
  fi
  return $failed
}

if [ "${1:-}" = "--self-test" ]; then
  self_test
  exit $?
fi
src=$1
lint "$src" "${2:-$src/tests/common/spec_parse_sites.txt}"
