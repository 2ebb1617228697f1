#!/usr/bin/env bash
# Runs each fuzz target (fuzz/fuzz_targets/*.rs, libFuzzer through `cargo fuzz`) for SECONDS
# seconds, one per core side by side, and prints the executions and the crashes of each.
#
#   scripts/fuzz.sh SECONDS [TARGET...]     (default: every target of `cargo fuzz list`)
#
# Needs the nightly toolchain and cargo-fuzz (`rustup toolchain install nightly`,
# `cargo install cargo-fuzz`), and the vocabularies the targets read: the catalog models
# (`nucleus pull qwen2.5-coder-0.5b-instruct`, `nucleus pull gemma-3-270m`) and
# ../shared/tokenizer-vectors. Each target starts from its committed seeds (fuzz/seeds/TARGET)
# and the corpus of earlier runs (fuzz/corpus/TARGET, not committed); an input that crashes is
# saved under fuzz/artifacts/TARGET/ (reproduce it with `cargo +nightly fuzz run -O TARGET
# FILE`, then make it a test in crates/nucleus/tests/suite/fuzz_regressions.rs). Exits non-zero when a
# target crashed.
set -uo pipefail
cd "$(dirname "$0")/../fuzz"

if [[ $# -lt 1 || ! $1 =~ ^[0-9]+$ ]]; then
    echo "usage: scripts/fuzz.sh SECONDS [TARGET...]" >&2
    exit 2
fi
secs=$1
shift
if [[ $# -gt 0 ]]; then
    targets=("$@")
else
    mapfile -t targets < <(cargo +nightly fuzz list)
fi

cargo +nightly fuzz build -O || exit 1

# One target per core at a time (FUZZ_JOBS, default nproc): each libFuzzer process runs on one
# thread, so on CI's two cores two targets side by side take half the time, each still fuzzed
# for SECONDS on a core of its own.
jobs=${FUZZ_JOBS:-$(nproc)}

# Runs target $1 and writes its summary line to artifacts/$1/last-run.line.
run_one() {
    local t=$1
    mkdir -p "corpus/$t" "artifacts/$t"
    local log="artifacts/$t/last-run.log"
    # -timeout: an input that takes more than 30 s is a hang (reported as a crash).
    cargo +nightly fuzz run -O "$t" "corpus/$t" "seeds/$t" -- \
        -max_total_time="$secs" -timeout=30 -print_final_stats=1 >"$log" 2>&1
    local rc=$?
    local runs crashes corpus
    runs=$(grep -o 'stat::number_of_executed_units: *[0-9]*' "$log" | grep -o '[0-9]*$' | tail -1)
    crashes=$(find "artifacts/$t" -maxdepth 1 -type f \( -name 'crash-*' -o -name 'timeout-*' -o -name 'oom-*' -o -name 'leak-*' \) | wc -l)
    corpus=$(find "corpus/$t" -type f | wc -l)
    local line="$t: ${runs:-?} executions in ${secs}s, corpus $corpus, exit $rc, artifacts $crashes"
    if [[ $rc -ne 0 ]]; then
        line+="  <-- CRASH (see fuzz/$log)"$'\n'
        line+=$(grep -m5 -E 'panicked|ERROR|SUMMARY' "$log" | sed 's/^/    /')
    fi
    printf '%s\n' "$line" >"artifacts/$t/last-run.line"
    return $rc
}

pids=()
running=0
for t in "${targets[@]}"; do
    if [[ $running -ge $jobs ]]; then
        wait -n
        running=$((running - 1))
    fi
    echo "== $t: ${secs}s"
    run_one "$t" &
    pids+=($!)
    running=$((running + 1))
done

# Each target's exit status (bash keeps a status that `wait -n` collected for `wait PID`).
failed=0
for pid in "${pids[@]}"; do
    wait "$pid" || failed=1
done
echo "== summary"
for t in "${targets[@]}"; do
    cat "artifacts/$t/last-run.line"
done
exit $failed
