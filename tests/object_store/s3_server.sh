#!/usr/bin/env bash
# s3_server.sh - the S3-compatible server of the object-storage tests: moto_server (Debian's
# python3-moto) on 127.0.0.1, in strict mode (every SigV4 signature checked) unless told otherwise.
#
#   s3_server.sh install            (root) python3-moto from Debian 13 (an Architecture: all .deb whose
#                                   dependencies Debian 12 has) + python3-flask-cors; awscli, s3cmd.
#                                   The host's apt sources are left as they are. Called by
#                                   deploy/install-deps.sh; does nothing when moto is present.
#   s3_server.sh start DIR PORT [strict|lenient]
#                                   starts the server, waits until it answers, and in strict mode
#                                   creates an IAM user with an s3:* key, and a second one refused
#                                   every PutObject (an S3 policy's Deny: the server refuses uploads,
#                                   as a full quota would); writes DIR/env (KEY=VALUE lines:
#                                   S3_ENDPOINT, AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY,
#                                   S3_REFUSED_ACCESS_KEY_ID, S3_REFUSED_SECRET_ACCESS_KEY) and
#                                   DIR/server.pid. Fails when PORT already answers.
#   s3_server.sh stop DIR           stops the server whose pid is in DIR/server.pid (that pid only).
# State is in memory: each start is an empty store.
set -euo pipefail

MOTO=/usr/bin/moto_server # Debian's, never one from a pip/pyenv PATH entry

fail() {
  echo "s3_server.sh: $*" >&2
  exit 1
}

install_moto() {
  if [[ -x $MOTO ]] && /usr/bin/python3 -c 'import moto, flask_cors' 2>/dev/null; then
    [[ -x /usr/bin/aws && -x /usr/bin/s3cmd ]] && return 0
  fi
  local mirror work
  mirror=$(grep -hoE 'https?://[^ ]+/debian/?$' /etc/apt/sources.list.d/*.sources /etc/apt/sources.list \
    2>/dev/null | head -n1 || true)
  mirror=${mirror%/}
  [[ -n $mirror ]] || mirror=http://deb.debian.org/debian
  work=$(mktemp -d /tmp/sftctl-moto-deb.XXXXXX)
  trap 'rm -rf "$work"' RETURN
  mkdir -p "$work/lists/partial" "$work/archives/partial"
  # A private apt configuration that sees only Debian 13's main, to fetch the one package.
  echo "deb [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] $mirror trixie main" >"$work/trixie.list"
  cat >"$work/apt.conf" <<CONF
Dir::Etc::SourceList "$work/trixie.list";
Dir::Etc::SourceParts "/nonexistent";
Dir::State::Lists "$work/lists";
Dir::Cache "$work";
CONF
  APT_CONFIG=$work/apt.conf apt-get update -qq
  (cd "$work" && APT_CONFIG=$work/apt.conf apt-get download -qq python3-moto 2>&1 | grep -v unsandboxed || true)
  ls "$work"/python3-moto_*_all.deb >/dev/null 2>&1 || fail "could not download python3-moto from $mirror trixie"
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
    "$work"/python3-moto_*_all.deb python3-flask-cors awscli s3cmd >/dev/null
}

server_pid() { # prints the pid in $1/server.pid when it is a live moto_server
  local pid
  [[ -s $1/server.pid ]] || return 1
  pid=$(tr -dc 0-9 <"$1/server.pid")
  [[ -n $pid && -r /proc/$pid/cmdline ]] || return 1
  tr '\0' ' ' <"/proc/$pid/cmdline" | grep -q moto_server || return 1
  echo "$pid"
}

iam_call() { # one of the unchecked requests strict mode allows at its start
  curl -sS --fail --aws-sigv4 "aws:amz:us-east-1:iam" --user setup:setup "$@" "$ENDPOINT/"
}

xml_field() { sed -n "s:.*<$1>\\(.*\\)</$1>.*:\\1:p"; }

start_server() {
  local dir=$1 port=$2 mode=${3:-strict} i reply key secret
  [[ $mode == strict || $mode == lenient ]] || fail "mode must be strict or lenient, got '$mode'"
  [[ -x $MOTO ]] || fail "$MOTO is missing: run deploy/install-deps.sh (or '$0 install') as root"
  ENDPOINT=http://127.0.0.1:$port
  curl -s -o /dev/null --max-time 2 "$ENDPOINT/" && fail "port $port already answers"
  mkdir -p "$dir"
  if [[ $mode == strict ]]; then
    # moto checks signatures after the first N requests; the 6 spent below make the IAM users.
    INITIAL_NO_AUTH_ACTION_COUNT=6 "$MOTO" -H 127.0.0.1 -p "$port" >"$dir/server.log" 2>&1 &
  else
    env -u INITIAL_NO_AUTH_ACTION_COUNT "$MOTO" -H 127.0.0.1 -p "$port" >"$dir/server.log" 2>&1 &
  fi
  echo $! >"$dir/server.pid"
  for ((i = 0; i < 600; i++)); do
    curl -s -o /dev/null --fail "$ENDPOINT/moto-api/data.json" && break
    server_pid "$dir" >/dev/null || { cat "$dir/server.log" >&2; fail "moto_server exited"; }
    sleep 0.05
  done
  curl -s -o /dev/null --fail "$ENDPOINT/moto-api/data.json" || fail "moto_server does not answer on $ENDPOINT"
  key=test secret=test refused=test:test
  if [[ $mode == strict ]]; then
    local all='{"Effect":"Allow","Action":"s3:*","Resource":"*"}'
    IFS=: read -r key secret < <(make_user sftctl-test "$all")
    refused=$(make_user sftctl-refused "$all"',{"Effect":"Deny","Action":"s3:PutObject","Resource":"*"}')
  fi
  printf 'S3_ENDPOINT=%s\nAWS_ACCESS_KEY_ID=%s\nAWS_SECRET_ACCESS_KEY=%s\n' "$ENDPOINT" "$key" "$secret" >"$dir/env"
  printf 'S3_REFUSED_ACCESS_KEY_ID=%s\nS3_REFUSED_SECRET_ACCESS_KEY=%s\n' "${refused%%:*}" "${refused#*:}" >>"$dir/env"
}

make_user() { # NAME STATEMENTS: an IAM user with that policy; prints KEY:SECRET (3 unchecked requests)
  local reply key secret
  iam_call -d "Action=CreateUser&UserName=$1&Version=2010-05-08" >/dev/null
  reply=$(iam_call -d "Action=CreateAccessKey&UserName=$1&Version=2010-05-08")
  key=$(xml_field AccessKeyId <<<"$reply")
  secret=$(xml_field SecretAccessKey <<<"$reply")
  iam_call -d "Action=PutUserPolicy&UserName=$1&PolicyName=s3&Version=2010-05-08" \
    --data-urlencode "PolicyDocument={\"Version\":\"2012-10-17\",\"Statement\":[$2]}" >/dev/null
  [[ -n $key && -n $secret ]] || fail "could not create the IAM key of $1: $reply"
  echo "$key:$secret"
}

stop_server() {
  local dir=$1 pid i
  if pid=$(server_pid "$dir"); then
    kill -TERM "$pid"
    for ((i = 0; i < 100; i++)); do
      [[ -d /proc/$pid ]] || break
      sleep 0.05
    done
    [[ -d /proc/$pid ]] && kill -KILL "$pid"
  fi
  rm -f "$dir/server.pid" "$dir/env"
}

case ${1:-} in
  install) install_moto ;;
  start) [[ $# -ge 3 ]] || fail "usage: $0 start DIR PORT [strict|lenient]"; start_server "$2" "$3" "${4:-strict}" ;;
  stop) [[ $# -ge 2 ]] || fail "usage: $0 stop DIR"; stop_server "$2" ;;
  *) fail "usage: $0 install | start DIR PORT [strict|lenient] | stop DIR" ;;
esac
