# Sourced by bench/gpu's two-rank scripts (two_rank_nccl.sh, zero_ranks.sh): the one way they start
# two trainer ranks on this host, as torchrun would (LOCAL_RANK picks the GPU).
#
# launch NAME: starts `$trainer train --spec $work/NAME.json` as ranks 0 and 1 (logs
# $work/NAME-rank{0,1}.log), their pids in the array `pids`; the next launch takes the next `port`.
# REQUIRES: trainer, work and port set.
launch() {
  pids=()
  for r in 0 1; do
    WORLD_SIZE=2 RANK=$r LOCAL_RANK=$r LOCAL_WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=$port \
      "$trainer" train --spec "$work/$1.json" > "$work/$1-rank$r.log" 2>&1 &
    pids+=($!)
  done
  port=$((port + 1))
}
