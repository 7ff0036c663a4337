#!/bin/bash
# usage: shm-ab.sh LABEL [sizes-regex] [ops-regex]: medians (us) of bpl-bench-collectives on gloo, 2 ranks, one line per op and size
cd "$(dirname "$0")/../../.."  # the repository, built in build/
sizes=${2:-"65536|262144|1048576|4194304|16777216|67108864"}
ops=${3:-"broadcast|allreduce|reduce_scatter|allgather|copy"}
NXD_CPU_MODE=1 build/bin/bpl-run --nproc-per-node 2 build/bin/bpl-bench-collectives --min-bytes=${MIN_BYTES:-4} --max-bytes=${MAX_BYTES:-64M} --benchmark_filter="^($ops)/(f32|u8)/($sizes)/(backplane|memcpy)" --benchmark_report_aggregates_only=true --benchmark_color=false 2>/dev/null | sed "s/\x1b\[[0-9;]*m//g" | grep _median | awk -v l="$1" '{split($1,a,"/"); t=$2; if ($3=="ms") t*=1000; if ($3=="ns") t/=1000; printf "%s %-15s %9s %10.1f\n", l, a[1], a[3], t}' | sort -s -k2,2 -k3,3n
