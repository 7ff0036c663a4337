#!/bin/bash
# usage: mpi-ab.sh LABEL PLUGIN_DIR sizes-regex ops-regex [extra flags]: medians (us) of backplane and raw, and the ratio
cd "$(dirname "$0")/../../.."  # the repository, built in build/
label=$1; dir=$2; sizes=$3; ops=$4; shift 4
BPL_PLUGIN_PATH=$dir BPL_BACKEND=mpi mpirun --allow-run-as-root -np 2 build/bin/bpl-bench-collectives --max-bytes=64M --benchmark_filter="^($ops)/(f32)/($sizes)/(backplane|raw)" --benchmark_report_aggregates_only=true --benchmark_color=false "$@" 2>/dev/null | sed "s/\x1b\[[0-9;]*m//g" | grep _median | awk -v l="$label" '{split($1,a,"/"); t=$2; if ($3=="ms") t*=1000; if ($3=="ns") t/=1000; key=a[1]" "a[3]; if (a[4]=="raw") raw[key]=t; else bp[key]=t} END {for (k in bp) printf "%s %-28s %9.2f %9.2f %6.3f\n", l, k, bp[k], raw[k], bp[k]/raw[k]}' | sort -k2,2 -k3,3n
