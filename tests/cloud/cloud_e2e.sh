#!/usr/bin/env bash
# Renting a host end to end (issue 41, "The check"), with the real sftctl, sftd and sftctl-trainer
# against fake provider APIs on 127.0.0.1 (tests/util/fake_cloud.py) whose instances are real sshd
# processes (tests/cloud/fake_instance.sh) running as this user; the images "have sftd" (--no-bootstrap
# with --sftd and --agent-data-dir: tests/remote/bootstrap_e2e.sh covers the bootstrap itself):
#   1. submit --provider fake-lambda --down-when-done: the cheapest offer has no capacity (the next is
#      taken), the job runs, its final checkpoint comes to the laptop, the provider reports no instance,
#      and `list`/`status` name the host as given back instead of dialling it;
#   2. up / hosts / down on fake-runpod (SSH on a mapped port), an orphan flagged by `hosts`, `down`
#      refused while a job runs there (--force ends it);
#   3. the laptop's sftctl killed mid-job (--terminate-from-host): the host still terminates itself;
#   4. --max-cost reached: the agent cancels the job (saying so in logs and status) and terminates the host;
#   5. Ctrl-C on `submit --provider --down-when-done`: the host is given back, exit 130;
#   6. the provider takes the host away mid-run (preempted): `--replace-lost 1` rents another, which
#      continues from the newest checkpoint pulled home, within what is left of --max-cost;
#   7. the host drops off the network for longer than a follow's reconnect budget and comes back: the
#      provider still runs it, so its job is followed again (every event printed once), not replaced;
#   and no file, log or process argument holds the planted API key (but the instance's agent env file).
# 1, 3 and 4 run against both fake providers (Lambda's host terminates itself with the key the user
# sent, --terminate-from-host; a RunPod pod with its own key and runpodctl, as a real pod has them).
# Usage: tests/cloud/cloud_e2e.sh BUILD_DIR ["N [lambda|runpod]"...]   (default: every scenario)
set -euo pipefail
cd "$(dirname "$0")/../.."
SRC=$PWD
BIN=$(cd "${1:?usage: cloud_e2e.sh BUILD_DIR [SCENARIO...]}" && pwd)/bin
shift
SCENARIOS=("$@")
[ ${#SCENARIOS[@]} -gt 0 ] || SCENARIOS=("1 lambda" "1 runpod" 2 "3 lambda" "3 runpod" "4 lambda" "4 runpod" 5 "6 lambda" "7 runpod")
SFTCTL=$BIN/sftctl
T0=$SECONDS
TMP=$(mktemp -d "${TMPDIR:-/tmp}/sftctl-cloud-e2e.XXXXXX")
FAKE_PID=""
KEY="sk-planted-$(od -An -N8 -tx1 /dev/urandom | tr -d ' \n')"
export HOME=$TMP/home XDG_CONFIG_HOME=$TMP/config
export FAKE_LAMBDA_API_KEY=$KEY FAKE_RUNPOD_API_KEY=$KEY FAKE_INSTANCE_ROOT=$TMP/instances
mkdir -p "$FAKE_INSTANCE_ROOT"
mkdir -p "$HOME/.ssh" "$XDG_CONFIG_HOME/sftctl"
ssh-keygen -q -t ed25519 -N '' -C laptop -f "$HOME/.ssh/id_ed25519"

phase() { echo "cloud_e2e: [$((SECONDS - T0)) s] $*"; }
fail() {
  echo "cloud_e2e: FAILED: $*" >&2
  for f in "$TMP"/*.err "$TMP"/fake-*/*.log; do
    [ -f "$f" ] && { echo "--- $f (last 30 lines)" >&2; tail -n 30 "$f" >&2; }
  done
  exit 1
}
# stop_fake: the fake goes, and its profile with it (`hosts` asks every profile with a key, and exits
# non-zero when one cannot be asked).
stop_fake() {
  if [ -n "$FAKE_PID" ]; then kill "$FAKE_PID" 2>/dev/null || true; wait "$FAKE_PID" 2>/dev/null || true; fi
  FAKE_PID=""
  [ -n "${FAKE_NAME:-}" ] && [ -f "$XDG_CONFIG_HOME/sftctl/providers.json" ] &&
    python3 - "$XDG_CONFIG_HOME/sftctl/providers.json" "$FAKE_NAME" <<'PY'
import json, sys
doc = json.load(open(sys.argv[1]))
doc["providers"].pop(sys.argv[2], None)
json.dump(doc, open(sys.argv[1], "w"), indent=2)
PY
  FAKE_NAME=""
}
cleanup() {
  stop_fake
  for d in "$TMP"/agent-*; do [ -d "$d" ] && "$BIN/sftd" stop --data-dir "$d" >/dev/null 2>&1 || true; done
  pkill -KILL -f -- "$TMP/agent-" 2>/dev/null || true  # trainers of jobs still running
  [ -n "${CLOUD_E2E_KEEP:-}" ] && echo "cloud_e2e: kept $TMP" || rm -rf "$TMP"
}
trap cleanup EXIT
expect_in() {  # FILE TEXT
  grep -qF -- "$2" "$1" || { echo "--- $1:" >&2; cat "$1" >&2; fail "expected '$2' in $(basename "$1")"; }
}
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }
fake_state() { curl -fsS "http://127.0.0.1:$FAKE_PORT/_fake/state"; }
# The number of the fake's instances (not orphans) that nobody asked it to terminate.
live_instances() {
  fake_state | python3 -c 'import json,sys; s=json.load(sys.stdin)
print(sum(1 for i in s["instances"] if not i["orphan"] and i["phase"] not in ("terminating", "terminated", "gone")))'
}

# start_fake DIALECT NAME AGENT_DIR CONFIG_JSON: a fake provider whose instances stop AGENT_DIR's
# agent when terminated; writes the profile NAME into providers.json.
start_fake() {
  local dialect=$1 name=$2 agent=$3 config=$4 dir
  FAKES=$((${FAKES:-0} + 1))
  dir=$TMP/fake-$FAKES-$2
  mkdir -p "$dir"
  echo "$config" >"$dir/config.json"
  SSH_PORT=$(free_port)
  # A terminated instance takes its processes with it: the agent, and the jobs it left running (an
  # agent that stops leaves its jobs to the next one; a VM that goes away does not).
  FAKE_AGENT_STOP="pkill -KILL -f -- '$agent/jobs/'; $BIN/sftd stop --data-dir $agent" FAKE_POD_API_KEY=$KEY python3 "$SRC/tests/util/fake_cloud.py" \
    --dialect "$dialect" --api-key "$KEY" --config "$dir/config.json" --log "$dir/requests.jsonl" \
    --state-dir "$dir" --ssh-port "$SSH_PORT" --launch-interval 1 \
    --instance-command "exec sh $SRC/tests/cloud/fake_instance.sh" >"$dir/out" 2>"$TMP/fake-$FAKES-$name.err" &
  FAKE_PID=$!
  FAKE_NAME=$name
  for _ in $(seq 1 300); do grep -q '^PORT' "$dir/out" 2>/dev/null && break; sleep 0.1; done
  FAKE_PORT=$(awk '/^PORT/ {print $2}' "$dir/out")
  [ -n "$FAKE_PORT" ] || fail "fake_cloud.py ($dialect) did not start within 30 s (running: $(kill -0 $FAKE_PID 2>&1 && echo yes))"
  local url=http://127.0.0.1:$FAKE_PORT
  [ "$dialect" = lambda ] && url=$url/api/v1
  python3 - "$XDG_CONFIG_HOME/sftctl/providers.json" "$name" "$dialect" "$url" "$SSH_PORT" "$(id -un)" <<'PY'
import json, os, sys
path, name, dialect, url, port, user = sys.argv[1:]
doc = json.load(open(path)) if os.path.exists(path) else {"providers": {}}
entry = {"type": dialect, "api_url": url, "ssh_user": user}
if dialect == "lambda":
    entry["ssh_port"] = int(port)
doc["providers"][name] = entry
json.dump(doc, open(path, "w"), indent=2)
PY
}

# The tiny job: a 1-layer model from scratch on addition lines, on CPU, one thread (ctest runs another
# test beside this one: two LibTorch threads on two busy cores made each step ten times slower).
for i in $(seq 0 63); do echo "{\"prompt\": \"What is $i+1?\\n\", \"completion\": \"$((i + 1))\"}"; done >"$TMP/train.jsonl"
job_spec() {  # STEPS [CHECKPOINT_INTERVAL] -> $TMP/job-STEPS.yaml
  cat >"$TMP/job-$1.yaml" <<EOF
model:
  config: {hidden_size: 32, intermediate_size: 64, num_hidden_layers: 1, num_attention_heads: 4,
           max_position_embeddings: 64}
tokenizer: byte
device: cpu
threads: 1
train: {max_steps: $1, batch_size: 4}
checkpoint: {interval: ${2:-2}}
data: {train: $TMP/train.jsonl}
EOF
  echo "$TMP/job-$1.yaml"
}
# offers DIALECT "ID:GPU:PRICE:REGION" ...: the fake's catalog (one GPU each).
offers() {
  local dialect=$1 out="" id gpu price region
  shift
  for o in "$@"; do
    IFS=: read -r id gpu price region <<<"$o"
    out+="${out:+,}{\"id\": \"$id\", \"gpu\": \"$gpu\", \"gpu_count\": 1, \"gpu_memory_gib\": 80,
            \"price_per_hour\": $price, \"vcpus\": 26, \"memory_gib\": 200, \"regions\": {\"$region\": true}}"
  done
  echo "[$out]"
}
cheap_id() { [ "$1" = lambda ] && echo gpu_1x_h100_pcie || echo "NVIDIA H100 PCIe"; }
dear_id() { [ "$1" = lambda ] && echo gpu_1x_h100_sxm5 || echo "NVIDIA H100 80GB HBM3"; }
two_offers() { offers "$1" "$(cheap_id "$1"):H100 PCIe:2.49:us-east-1" "$(dear_id "$1"):H100 SXM:3.29:us-west-2"; }
AGENT_FLAGS=(--no-bootstrap --sftd "$BIN/sftd")

scenario_1() {  # DIALECT
  phase "1. submit --provider fake-$1 --down-when-done (the cheapest offer has no capacity)"
  local agent=$TMP/agent-1-$1
  start_fake "$1" "fake-$1" "$agent" "{\"offers\": $(two_offers "$1"), \"capacity_fail\": [\"$(cheap_id "$1")\"],
                                       \"boot_polls\": 2, \"rate_limit_once\": true}"
  "$SFTCTL" submit --provider "fake-$1" --gpu H100 "${AGENT_FLAGS[@]}" --agent-data-dir "$agent" \
    --down-when-done --sync-to "$TMP/out-1-$1" --wait 2m "$(job_spec 4)" >"$TMP/s1-$1.out" 2>"$TMP/s1-$1.err" ||
    fail "submit --down-when-done exited $?"
  sed 's/^/  | /' "$TMP/s1-$1.err" | grep -v '^  | \[' | tail -n 25
  expect_in "$TMP/s1-$1.err" "trying the next offer"
  expect_in "$TMP/s1-$1.err" "renting $(dear_id "$1")"
  expect_in "$TMP/s1-$1.err" "was given back"
  [ -f "$TMP/out-1-$1/checkpoint-000004/DONE" ] || { ls -R "$TMP/out-1-$1" >&2 || true; fail "no final checkpoint pulled"; }
  [ "$(live_instances)" = 0 ] || { fake_state >&2; fail "the provider still has an instance"; }
  python3 - "$XDG_CONFIG_HOME/sftctl/hosts.json" "$(dear_id "$1")" <<'PY' || fail "the registry does not say down"
import json, sys
hosts = [h for h in json.load(open(sys.argv[1]))["hosts"] if h["instance_type"] == sys.argv[2]]
assert len(hosts) == 1 and hosts[0]["state"] == "down" and hosts[0]["ended_unix_ms"] > 0, hosts
assert hosts[0]["price_per_hour"] == 3.29, hosts
PY
  # Its job went with it: `list` names the host as given back (not dialled, no error), `status` says so.
  "$SFTCTL" list >"$TMP/s1-$1-list.out" 2>"$TMP/s1-$1-list.err" || fail "list after the host was given back exited $?"
  expect_in "$TMP/s1-$1-list.out" "given back"
  local ref rc=0
  ref=$(sed -n 's/^submitted \([^ ]*\) .*/\1/p' "$TMP/s1-$1.err")
  "$SFTCTL" status "$ref" >"$TMP/s1-$1-status.out" 2>"$TMP/s1-$1-status.err" || rc=$?
  [ "$rc" = 4 ] || fail "status of a job on a given-back host exited $rc, not 4"
  expect_in "$TMP/s1-$1-status.err" "given back"
  stop_fake
}

scenario_2() {
  phase "2. offers / up / list / hosts / down on fake-runpod, an orphan flagged"
  local agent=$TMP/agent-2
  start_fake runpod fake-runpod "$agent" "{\"offers\": $(two_offers runpod), \"boot_polls\": 1}"
  "$SFTCTL" offers --provider fake-runpod --gpu h100 >"$TMP/s2-offers.out" 2>"$TMP/s2-offers.err" || fail "offers"
  head -n 1 "$TMP/s2-offers.out" | grep -q PROVIDER || fail "offers printed no table"
  sed -n 2p "$TMP/s2-offers.out" | grep -qF "NVIDIA H100 PCIe" || fail "offers is not cheapest first"
  "$SFTCTL" up --provider fake-runpod --gpu H100 --name pod-one "${AGENT_FLAGS[@]}" --agent-data-dir "$agent" \
    --wait 2m >"$TMP/s2-up.out" 2>"$TMP/s2-up.err" || fail "up exited $?"
  [ "$(cat "$TMP/s2-up.out")" = pod-one ] || fail "up printed '$(cat "$TMP/s2-up.out")', not the host name"
  "$SFTCTL" list --host pod-one >"$TMP/s2-list.out" 2>"$TMP/s2-list.err" || fail "list --host pod-one"
  expect_in "$TMP/s2-list.out" "2.49"
  curl -fsS -X POST -d '{"name": "forgotten"}' "http://127.0.0.1:$FAKE_PORT/_fake/orphan" >/dev/null
  "$SFTCTL" hosts >"$TMP/s2-hosts.out" 2>"$TMP/s2-hosts.err" || fail "hosts"
  expect_in "$TMP/s2-hosts.out" "pod-one"
  expect_in "$TMP/s2-hosts.out" "ORPHAN"
  # A job still running there: `down` refuses (its disk goes with it) and says what runs; --force ends it.
  "$SFTCTL" submit --host pod-one "$(job_spec 1000000 100000)" >"$TMP/s2-submit.out" 2>"$TMP/s2-submit.err" ||
    fail "submit to pod-one"
  local rc=0
  "$SFTCTL" down pod-one >"$TMP/s2-down.out" 2>"$TMP/s2-down.err" || rc=$?
  [ "$rc" = 5 ] || fail "down of a host with a running job exited $rc, not 5"
  expect_in "$TMP/s2-down.err" "pod-one still runs job-1 ("
  [ "$(live_instances)" = 1 ] || { fake_state >&2; fail "the pod was terminated though its job runs"; }
  "$SFTCTL" down pod-one --force >"$TMP/s2-down.out" 2>"$TMP/s2-down.err" || fail "down --force exited $?"
  expect_in "$TMP/s2-down.err" "pod-one is gone"
  [ "$(live_instances)" = 0 ] || { fake_state >&2; fail "the pod is still there"; }
  stop_fake
}

scenario_3() {  # DIALECT
  phase "3. fake-$1: the laptop's sftctl killed mid-job, the host terminates itself"
  local agent=$TMP/agent-3-$1 consent=()
  [ "$1" = lambda ] && consent=(--terminate-from-host)  # a pod has its own key
  start_fake "$1" "fake-$1" "$agent" "{\"offers\": $(two_offers "$1")}"
  "$SFTCTL" submit --provider "fake-$1" --gpu H100 "${AGENT_FLAGS[@]}" --agent-data-dir "$agent" \
    --down-when-done "${consent[@]}" --host-name "killed-$1" --sync-to "$TMP/out-3-$1" --wait 2m \
    --agent-arg=--stop-pull-timeout=3s --agent-arg=--stop-grace=1s --agent-arg=--stop-check=500ms \
    "$(job_spec 600 200)" >"$TMP/s3-$1.out" 2>"$TMP/s3-$1.err" &
  local pid=$!
  for _ in $(seq 1 600); do grep -q "^submitted" "$TMP/s3-$1.err" 2>/dev/null && break; sleep 0.2; done
  grep -q "^submitted" "$TMP/s3-$1.err" || { kill -9 $pid; fail "the job was not submitted"; }
  if grep -a -q -F -- "$KEY" "/proc/$(cat "$agent/sftd.pid")/cmdline"; then fail "the key is in the agent's argv"; fi
  kill -9 $pid
  wait $pid 2>/dev/null || true
  for _ in $(seq 1 300); do [ "$(live_instances)" = 0 ] && break; sleep 1; done
  [ "$(live_instances)" = 0 ] || { fake_state >&2; fail "the host did not terminate itself"; }
  stop_fake
}

scenario_5() {
  phase "5. Ctrl-C on submit --provider fake-runpod --down-when-done gives the host back"
  local agent=$TMP/agent-5 rc=0
  start_fake runpod fake-runpod "$agent" "{\"offers\": $(two_offers runpod)}"
  set -m  # (job control: a background job of a script would ignore SIGINT)
  "$SFTCTL" submit --provider fake-runpod --gpu H100 "${AGENT_FLAGS[@]}" --agent-data-dir "$agent" \
    --down-when-done --host-name interrupted --wait 2m "$(job_spec 1000000 100000)" \
    >"$TMP/s5.out" 2>"$TMP/s5.err" &
  local pid=$!
  set +m
  for _ in $(seq 1 600); do grep -q "^submitted" "$TMP/s5.err" 2>/dev/null && break; sleep 0.2; done
  grep -q "^submitted" "$TMP/s5.err" || { kill -9 $pid; fail "the job was not submitted"; }
  kill -INT $pid
  wait $pid || rc=$?
  [ "$rc" = 130 ] || fail "submit exited $rc after SIGINT, not 130"
  expect_in "$TMP/s5.err" "interrupted: giving interrupted back"
  [ "$(live_instances)" = 0 ] || { fake_state >&2; fail "the pod is still there after Ctrl-C"; }
  python3 -c 'import json,sys; h=[h for h in json.load(open(sys.argv[1]))["hosts"] if h["name"] == "interrupted"]
assert h and h[0]["state"] == "down", h' "$XDG_CONFIG_HOME/sftctl/hosts.json" || fail "the registry does not say down"
  stop_fake
}

scenario_4() {  # DIALECT
  phase "4. fake-$1: --max-cost reached, the agent cancels the job and terminates the host"
  local agent=$TMP/agent-4-$1 consent=()
  [ "$1" = lambda ] && consent=(--terminate-from-host)
  # $36/h is a cent a second. The agent stops when the cap would be passed within its lead (a check,
  # the jobs' kill grace, the stop action's 120 s: about 132 s here, $1.32), so a $1.80 cap stops
  # the host about 48 s after the launch.
  start_fake "$1" "fake-$1" "$agent" "{\"offers\": $(offers "$1" "$(dear_id "$1"):H100 SXM:36.0:us-east-1")}"
  "$SFTCTL" up --provider "fake-$1" --gpu H100 --name "capped-$1" "${AGENT_FLAGS[@]}" --agent-data-dir "$agent" \
    --max-cost 1.80 "${consent[@]}" --agent-arg=--stop-check=500ms --wait 2m \
    >"$TMP/s4-$1-up.out" 2>"$TMP/s4-$1-up.err" || fail "up --max-cost exited $?"
  "$SFTCTL" submit --host "capped-$1" "$(job_spec 1000000 100000)" >"$TMP/s4-$1.out" 2>"$TMP/s4-$1.err" ||
    fail "submit to capped-$1"
  local job ref
  job=$(head -n 1 "$TMP/s4-$1.out")
  # The job registry records the host's SSH target; its own known_hosts file is still the one used.
  ref=$(sed -n 's/^submitted \([^ ]*\) .*/\1/p' "$TMP/s4-$1.err")
  "$SFTCTL" status "$ref" >"$TMP/s4-$1-status.out" 2>"$TMP/s4-$1-status.err" || fail "status $ref"
  expect_in "$TMP/s4-$1-status.out" "cost cap \$1.80"
  "$SFTCTL" logs -f "capped-$1/$job" >"$TMP/s4-$1-logs.out" 2>"$TMP/s4-$1-logs.err" && fail "the capped job succeeded"
  expect_in "$TMP/s4-$1-logs.out" "cost cap \$1.80 reached"
  for _ in $(seq 1 120); do [ "$(live_instances)" = 0 ] && break; sleep 1; done
  [ "$(live_instances)" = 0 ] || { fake_state >&2; fail "the capped host was not terminated"; }
  stop_fake
}

# rented_instance NAME: the provider's instance id of the rented host NAME (from hosts.json).
rented_instance() {
  python3 -c 'import json,sys
print([h for h in json.load(open(sys.argv[1]))["hosts"] if h["name"] == sys.argv[2]][0]["instance_id"])' \
    "$XDG_CONFIG_HOME/sftctl/hosts.json" "$1"
}
# submit_20000 DIALECT HOST_NAME OUT LOG [FLAG...]: `submit --provider fake-DIALECT --down-when-done` of
# 20000 steps of a few milliseconds, a checkpoint every 2000, synced to OUT, in the background
# (SUBMIT_PID); returns once the first checkpoint came home, the run far from its end.
submit_20000() {
  local dialect=$1 name=$2 out=$3 log=$4 agent=$TMP/agent-$2
  shift 4
  "$SFTCTL" submit --provider "fake-$dialect" --gpu H100 "${AGENT_FLAGS[@]}" --agent-data-dir "$agent" \
    --down-when-done --host-name "$name" --sync-to "$out" --sync-interval 0.2 --wait 2m "$@" \
    "$(job_spec 20000 2000)" >"$log.out" 2>"$log.err" &
  SUBMIT_PID=$!
  for _ in $(seq 1 1200); do [ -f "$out/checkpoint-002000/DONE" ] && return 0; sleep 0.1; done
  kill -9 $SUBMIT_PID
  fail "no checkpoint of $name came home within 120 s"
}

scenario_6() {  # DIALECT
  phase "6. fake-$1: the provider takes the host away mid-run; --replace-lost rents another, which continues"
  local out=$TMP/out-6-$1 id rc=0
  start_fake "$1" "fake-$1" "$TMP/agent-lost-$1" "{\"offers\": $(two_offers "$1")}"
  submit_20000 "$1" "lost-$1" "$out" "$TMP/s6-$1" --replace-lost 1 --max-cost 5
  # A checkpoint folder without DONE (a partial download, or the user's own): moved aside, never deleted.
  mkdir -p "$out/checkpoint-099999" && echo mine >"$out/checkpoint-099999/notes.txt"
  id=$(rented_instance "lost-$1")
  phase "preempting $id (the newest complete checkpoint home: $(basename "$(dirname "$(ls -d "$out"/checkpoint-*/DONE | tail -n 1)")"))"
  curl -fsS -X POST -d "{\"id\": \"$id\"}" "http://127.0.0.1:$FAKE_PORT/_fake/preempt" >/dev/null
  wait $SUBMIT_PID || rc=$?
  sed 's/^/  | /' "$TMP/s6-$1.err" | grep -v '^  | \[' | tail -n 25
  [ "$rc" = 0 ] || fail "submit --replace-lost exited $rc"
  expect_in "$TMP/s6-$1.err" "lost lost-$1: fake-$1 "
  expect_in "$TMP/s6-$1.err" "renting lost-$1-2 to continue from $out/checkpoint-"
  expect_in "$TMP/s6-$1.out" "resuming at step "
  grep -q "resuming at step 0 " "$TMP/s6-$1.out" && fail "the replacement started over"
  [ "$(cat "$out/checkpoint-099999.partial-lost-$1/notes.txt" 2>/dev/null)" = mine ] ||
    fail "the folder without DONE was not moved aside intact"
  [ ! -e "$out/checkpoint-099999" ] || fail "the folder without DONE is still in the way"
  [ -f "$out/checkpoint-020000/DONE" ] || { ls "$out" >&2 || true; fail "no final checkpoint pulled"; }
  [ "$(live_instances)" = 0 ] || { fake_state >&2; fail "an instance is still there"; }
  python3 - "$XDG_CONFIG_HOME/sftctl/hosts.json" "$1" <<'PY' || fail "the registry does not say both are down"
import json, sys
hosts = {h["name"]: h for h in json.load(open(sys.argv[1]))["hosts"]}
for name in ("lost-" + sys.argv[2], "lost-" + sys.argv[2] + "-2"):
    assert hosts[name]["state"] == "down" and hosts[name]["ended_unix_ms"] > 0, hosts
# --max-cost covers both: the replacement may cost only what the lost host left of it.
first, second = hosts["lost-" + sys.argv[2]], hosts["lost-" + sys.argv[2] + "-2"]
assert first["max_cost"] == 5, first
assert 4.5 < second["max_cost"] < 5, second
PY
  expect_in "$TMP/s6-$1.err" "of --max-cost \$5.00 spent; the replacement may cost the rest"
  stop_fake
}

scenario_7() {  # DIALECT
  phase "7. fake-$1: the host drops off the network mid-run and comes back: its job is followed again"
  local out=$TMP/out-7-$1 id rc=0
  start_fake "$1" "fake-$1" "$TMP/agent-away-$1" "{\"offers\": $(two_offers "$1")}"
  submit_20000 "$1" "away-$1" "$out" "$TMP/s7-$1" --replace-lost 1
  id=$(rented_instance "away-$1")
  phase "taking $id off the network for 30 s (longer than a follow's reconnect budget)"
  curl -fsS -X POST -d "{\"id\": \"$id\", \"seconds\": 30}" "http://127.0.0.1:$FAKE_PORT/_fake/pause" >/dev/null
  wait $SUBMIT_PID || rc=$?
  sed 's/^/  | /' "$TMP/s7-$1.err" | grep -v '^  | \[' | grep -v 'pulled step' | tail -n 15
  [ "$rc" = 0 ] || fail "submit exited $rc after the host came back"
  expect_in "$TMP/s7-$1.err" "still reports away-$1 running; following its job again"
  if grep -q "renting away-$1-2" "$TMP/s7-$1.err"; then fail "a host that was only out of reach was replaced"; fi
  [ -f "$out/checkpoint-020000/DONE" ] || { ls "$out" >&2 || true; fail "no final checkpoint pulled"; }
  # Every event printed once, across the outage: no step line twice, the last one there.
  [ -z "$(grep '^step ' "$TMP/s7-$1.out" | sort | uniq -d | head -n 3)" ] || fail "step lines printed twice"
  expect_in "$TMP/s7-$1.out" "step 20000/20000"
  [ "$(live_instances)" = 0 ] || { fake_state >&2; fail "the host is still there"; }
  stop_fake
}

for s in "${SCENARIOS[@]}"; do
  read -r n dialect <<<"$s"
  "scenario_$n" $dialect
done

phase "no file, log or output holds the planted API key"
# (The instances' disks are the hosts': a Lambda host's sftd/env holds it by the user's choice,
# --terminate-from-host, and a pod has its own key; they go with the instances.)
hits=$(grep -rl -a -F --exclude-dir=instances -- "$KEY" "$TMP" || true)
[ -z "$hits" ] || fail "the API key was found in: $hits"
phase "passed"
