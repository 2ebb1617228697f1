#!/usr/bin/env bash
# `nucleus chat` in a real terminal (tmux), typed as a user would: /help, a question, /set (a good
# and a bad value; reasoning), /system, a two-line message ending a line with a backslash, a paste of two
# lines, Ctrl-C during an answer, history (Up), /save, /clear, /load, and Ctrl-D to leave.
# Needs tmux, target/release/nucleus and the default catalog model. Prints the transcript and
# writes it to target/repl_transcript.txt; exits 1 naming the first step that failed.
set -euo pipefail
cd "$(dirname "$0")/.."

BIN=${NUCLEUS_BIN:-target/release/nucleus}
MODEL=${MODEL:-qwen2.5-coder-0.5b-instruct}
WAIT=${WAIT:-180} # seconds for any one step (a loaded machine answers slowly)
S=nucleus-repl-$$
WORK=$(mktemp -d)
SAVED=$WORK/conversation.json
trap 'tmux kill-session -t "$S" 2>/dev/null || true; rm -rf "$WORK"' EXIT

command -v tmux >/dev/null || { echo "repl_test: tmux is not installed" >&2; exit 1; }
[[ -x $BIN ]] || { echo "repl_test: build $BIN first" >&2; exit 1; }

screen() { tmux capture-pane -p -J -S - -t "$S"; }
count() { screen | grep -c -F -- "$1" || true; }
fail() {
    echo "repl_test: FAILED: $1" >&2
    screen | tee target/repl_transcript.txt >&2
    exit 1
}
# wait_for TEXT N: until TEXT appears at least N times on the screen.
wait_for() {
    local deadline=$((SECONDS + WAIT))
    while (($(count "$1") < $2)); do
        ((SECONDS < deadline)) || fail "waited ${WAIT}s for \"$1\" (x$2)"
        sleep 0.5
    done
}
type_line() { tmux send-keys -t "$S" -l -- "$1"; tmux send-keys -t "$S" Enter; }
prompts() { count ">>> "; }

tmux new-session -d -s "$S" -x 160 -y 50 \
    "$BIN chat $MODEL --temperature 0 -n 24 -t 2 --ctx 2048; echo \"[exit status \$?]\"; sleep 600"
tmux set-option -t "$S" history-limit 5000 >/dev/null
wait_for ">>> " 1

type_line "/help"
wait_for "/save FILE" 1
wait_for ">>> " 2

type_line "What is the capital of France? One word."
wait_for " tok/s; prompt " 1
wait_for ">>> " 3
screen | grep -q "Paris" || fail "the answer does not name Paris"

type_line "/set top-p 7"
wait_for "top_p" 1
type_line "/set temperature 0.0"
wait_for "temperature 0 top-k" 1
type_line "/set reasoning dim"
wait_for "must be show, hide or raw" 1
type_line "/set reasoning hide"
wait_for "reasoning hide" 1

type_line "/system Answer in as few words as possible."
wait_for "(the system prompt is set)" 1

# Two lines through a trailing backslash: the second line gets the continuation prompt.
tmux send-keys -t "$S" -l -- 'What is 2+2?\'
tmux send-keys -t "$S" Enter
wait_for "... " 1
type_line "Reply with the number only."
wait_for " tok/s; prompt " 2

# A paste of two lines (bracketed, as a terminal pastes) is one message.
n=$(prompts)
tmux set-buffer -b repl "Name a colour.
Just one."
tmux paste-buffer -p -b repl -t "$S"
tmux send-keys -t "$S" Enter
wait_for " tok/s; prompt " 3
wait_for ">>> " $((n + 1))

# Ctrl-C stops a long answer and the chat goes on.
type_line "/set max-tokens 2000"
wait_for "max-tokens 2000" 1
type_line "Write a very long story about a dragon who learns to bake bread."
wait_for "dragon" 2
sleep 3
tmux send-keys -t "$S" C-c
wait_for "(stopped)" 1
stopped=$(screen | grep -F "(stopped)" | sed -E 's/^\[([0-9]+) tokens?.*/\1/')
((stopped < 1000)) || fail "Ctrl-C did not stop the answer ($stopped tokens)"
n=$(prompts)

# History: Up brings back the last message; Ctrl-C clears the line again.
tmux send-keys -t "$S" Up
sleep 1
screen | grep -v "^\s*$" | tail -n 2 | grep -q "learns to bake bread" || fail "Up did not bring back the last message"
tmux send-keys -t "$S" C-c
wait_for ">>> " $((n + 1))

type_line "/save $SAVED"
wait_for "messages saved to" 1
python3 - "$SAVED" <<'EOF' || fail "/save did not write the conversation"
import json, sys
m = json.load(open(sys.argv[1]))
roles = [x["role"] for x in m]
assert roles == ["system"] + ["user", "assistant"] * 4, roles
assert m[0]["content"] == "Answer in as few words as possible.", m[0]
assert m[3]["content"] == "What is 2+2?\nReply with the number only.", m[3]
assert m[5]["content"] == "Name a colour.\nJust one.", m[5]
assert "Paris" in m[2]["content"], m[2]
EOF

type_line "/clear"
wait_for "(the conversation is cleared)" 1
type_line "/load $SAVED"
wait_for "(9 messages loaded from" 1
type_line "/frobnicate"
wait_for "unknown command /frobnicate" 1

tmux send-keys -t "$S" C-d
wait_for "[exit status 0]" 1

screen | sed -e :a -e '/^\n*$/{$d;N;ba' -e '}' | tee target/repl_transcript.txt
echo "repl_test: ok"
