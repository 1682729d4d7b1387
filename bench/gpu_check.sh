#!/usr/bin/env bash
# The prepared GPU check (issue 37): one command on a GPU machine, within 8 minutes, one
# results file. Run from the repository root after the three calls bench/gpu_pack.py
# describes carried .gpu/a, .gpu/b and .gpu/c there:
#
#   bench/gpu_check.sh [DEVICE [PYTHON]]        # $OUT/gpu_check.md, and its log
#   bench/gpu_check.sh cpu .venv/bin/python     # the same steps here, to check the script
#
# DEVICE: cuda (cpu for the dry run); PYTHON: python3 (the image's, which holds CuPy).
#
# Steps, each under its own deadline (the sum is 8 minutes): the GPU tests; doctor; the
# engine's decode steps at batch 1, 8 and 32, eager then replayed as CUDA graphs
# (WARMFLEET_DECODE_GRAPHS=1); `warmfleet up --workers 1` with the 8-agent
# workload; the cluster tests of sticky, warm and exact sessions, restores from disk,
# forks and preemption (their workers take the GPU: --device auto; test_cuda_cluster's,
# --device cuda with a float32 and a q8_0 pool). A failed step is recorded and the next one
# runs. Where no GPU is found the tests run the CUDA sources on the CPU (tests/cuda_emu), so
# a dry run checks them too.
set -uo pipefail

DEVICE=${1:-cuda}
PY=${2:-python3}
OUT=${OUT:-$PWD/gpu-check-out} # the device tool's folder that comes back, else a local one
HTTP_PORT=18000                # and the next two: gRPC, the kvstore
mkdir -p "$OUT"
RESULTS=$OUT/gpu_check.md
SECTIONS=$OUT/sections.md
LOG=$OUT/gpu_check.log
: >"$LOG"
export PYTHONUNBUFFERED=1

exec 2> >(tee -a "$LOG" >&2) # what the script says goes to the log too
say() { echo "gpu_check: $*" >&2; }

# The model from its pieces (checked against its sha256), the wheels, redis-server.
setup() {
    if [ -f .gpu/c/model.txt ]; then
        read -r name sha _ <.gpu/c/model.txt
        local models=$HOME/.cache/warmfleet/models
        mkdir -p "$models"
        cat .gpu/a/model.part0 .gpu/b/model.part1 .gpu/c/model.part2 >"$models/$name.tmp" || return 1
        echo "$sha  $models/$name.tmp" | sha256sum -c --quiet - || { say "the model's pieces do not join: carry .gpu/a and .gpu/b first"; return 1; }
        mv "$models/$name.tmp" "$models/$name"
    fi
    local site=/tmp/warmfleet-site
    # the wheels are built for the GPU machine's Python, 3.12 (a dry run here has its venv)
    if [ -d .gpu/c/wheels ] && "$PY" -c 'import sys; sys.exit(sys.version_info[:2] != (3, 12))'; then
        "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
            --target "$site" .gpu/c/wheels/*.whl || return 1
    fi
    export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
    [ -d "$site" ] && export PYTHONPATH=$site:$PYTHONPATH
    [ -d .gpu/b/redis ] && export PATH=$PWD/.gpu/b/redis:$PATH
    command -v redis-server >/dev/null || { say "no redis-server"; return 1; }
    say "python $("$PY" -c 'import sys; print(sys.version.split()[0])'), device $DEVICE"
    command -v nvidia-smi >/dev/null && nvidia-smi -L >&2
    return 0
}

# step NAME SECONDS COMMAND...: runs it under its deadline; a row in the results' table
# and the end of its output below it.
step() {
    local name=$1 limit=$2
    shift 2
    say "== $name (at most ${limit} s)"
    local start=$SECONDS
    timeout --kill-after=10 "$limit" "$@" >"$OUT/step.txt" 2>&1
    local rc=$?
    local took=$((SECONDS - start))
    cat "$OUT/step.txt" >>"$LOG"
    local note=""
    [ "$rc" = 124 ] && note="timed out"
    echo "| $name | $rc | $took | $note |" >>"$RESULTS"
    { echo; echo "## $name"; echo; echo '```'; grep -v "^$" "$OUT/step.txt" | tail -n 40; echo '```'; } >>"$SECTIONS"
    say "$name: rc $rc in $took s"
}

# `warmfleet up` with one worker in the background, the 8-agent workload against its HTTP
# API once it is up, then Ctrl-C to it.
agents_on_up() {
    local up_log=$OUT/up.log
    "$PY" -m warmfleet.cli up --workers 1 --device "$DEVICE" --http-port "$HTTP_PORT" \
        --port $((HTTP_PORT + 1)) --kvstore-port $((HTTP_PORT + 2)) \
        --spill-dir "$OUT/spill" >"$up_log" 2>&1 &
    local up=$!
    for _ in $(seq 1 120); do
        grep -q "warmfleet is up" "$up_log" && break
        kill -0 "$up" 2>/dev/null || { cat "$up_log"; return 1; }
        sleep 0.5
    done
    grep -q "warmfleet is up" "$up_log" || { cat "$up_log"; kill -INT "$up"; return 1; }
    grep -E "starting|ready" "$up_log"
    "$PY" -m bench.agents --target "http://127.0.0.1:$HTTP_PORT"
    local rc=$?
    kill -INT "$up"
    wait "$up"
    return $rc
}

{
    echo "# GPU check ($(date -u +%Y-%m-%dT%H:%MZ), device $DEVICE, $(git rev-parse --short HEAD 2>/dev/null))"
    echo
    echo "| step | rc | s | note |"
    echo "|---|---|---|---|"
} >"$RESULTS"
: >"$SECTIONS"
if ! setup; then
    echo "| setup | 1 | 0 | see gpu_check.log |" >>"$RESULTS"
    cat "$RESULTS"
    exit 1
fi
export DEVICE PY OUT HTTP_PORT
export -f agents_on_up
PYTEST=("$PY" -m pytest -q -p no:cacheprovider)
step "GPU tests" 100 "${PYTEST[@]}" tests/unit/test_cuda_forward.py tests/unit/test_cuda_kernels.py \
    tests/unit/test_gpu_ops.py tests/unit/test_head_rms_norm.py tests/unit/test_families_tiny.py \
    tests/unit/test_decode_graphs.py tests/unit/test_cuda_experts.py \
    tests/unit/test_graph_steps.py::test_on_cuda_the_graphs_give_the_eager_tokens \
    "tests/unit/test_gpt_oss_tiny.py::test_float_products_match_llama_cpp_at_every_position[cuda]"
step "doctor --device $DEVICE" 40 "$PY" -m warmfleet.cli doctor --device "$DEVICE"
step "engine decode steps" 60 "$PY" -m bench.engine_context --device "$DEVICE" --batches 1 8 32 \
    --contexts 128 --steps 16
step "engine decode steps, CUDA graphs" 60 env WARMFLEET_DECODE_GRAPHS=1 \
    "$PY" -m bench.engine_context --device "$DEVICE" --batches 1 8 32 --contexts 128 --steps 16
step "up --workers 1, 8 agents" 80 bash -c agents_on_up
step "cluster sessions on the GPU" 140 "${PYTEST[@]}" tests/test_cuda_cluster.py \
    tests/test_cluster.py \
    tests/test_small_warm_budget.py \
    tests/test_kvstore_cluster.py::test_fork_then_both_continue_and_delete_leaves_nothing \
    tests/test_kvstore_cluster.py::test_fork_of_a_session_on_disk \
    tests/test_tenants_cluster.py::test_an_interactive_request_preempts_a_batch_one_which_loses_nothing
cat "$SECTIONS" >>"$RESULTS"
rm -f "$OUT/step.txt" "$SECTIONS"
cat "$RESULTS"
