#!/usr/bin/env bash
# Submit a soakd plan to Slurm: one array task per plan cell, then the merge + gate job once
# every task has ended (afterany: failed cells included, the gate must see them).
#
#   docs/fleet/slurm/submit.sh PLAN RESULTS [SBATCH_OPTION...]
#   e.g. submit.sh release-1.4.toml /shared/soak/1.4.0 --partition=gpu --gpus-per-task=1 --time=30
#
# PLAN: the plan file; RESULTS: a folder every node can write (created). The extra options go
# to the array job (the cells); sbatch's own input variables (SBATCH_PARTITION,
# SBATCH_ACCOUNT, ...) apply to both jobs. SOAKD_ARRAY_PARALLEL=K runs at most K cells at
# once (--array=0-N%K). SOAKD (default `soakd`) and PYTHON (default `python3`) name the
# commands, here and, exported by sbatch, in the jobs.
#
# Prints "ARRAY_JOB_ID GATE_JOB_ID" on stdout, what was submitted on stderr. Afterwards:
#   scontrol show job GATE_JOB_ID          # JobState, ExitCode = the gate's verdict
#   cat RESULTS/gate.txt RESULTS/gate.rc   # the cell -> verdict table and exit code
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
[ $# -ge 2 ] || { echo "usage: submit.sh PLAN RESULTS [SBATCH_OPTION...]" >&2; exit 2; }
plan=$(realpath "$1")
mkdir -p "$2/logs" "$2/cells"
results=$(realpath "$2")
shift 2
read -ra soakd <<<"${SOAKD:-soakd}"

# the plan is checked here, on the login node: a bad plan is one error now, not N failed tasks
shown=$("${soakd[@]}" plan show "$plan" -f json)
cells=$("${PYTHON:-python3}" -c 'import json, sys; print(len(json.loads(sys.argv[1])["cells"]))' \
  "$shown")
[ "$cells" -gt 0 ] || { echo "submit.sh: $plan has no cells" >&2; exit 2; }
range="0-$((cells - 1))${SOAKD_ARRAY_PARALLEL:+%$SOAKD_ARRAY_PARALLEL}"

array=$(sbatch --parsable --array="$range" --output="$results/logs/cell-%A_%a.out" \
  "$@" "$here/soakd-array.sbatch" "$plan" "$results")
array=${array%%;*}  # --parsable prints "id" or "id;cluster"
gate=$(sbatch --parsable --dependency="afterany:$array" --output="$results/logs/gate-%j.out" \
  "$here/soakd-merge-gate.sbatch" "$plan" "$results")
gate=${gate%%;*}
echo "submit.sh: $cells cells as array job $array (--array=$range), merge + gate job $gate" \
  "(afterany:$array); results in $results" >&2
echo "$array $gate"
