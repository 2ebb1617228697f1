#!/usr/bin/env bash
# The Dockerfile's steps, run without a container engine (this project's CI has none: `docker
# build` finds no daemon), so that they cannot rot unnoticed. Reads the Dockerfile instruction by
# instruction and fails on any instruction it does not know, so a change there must be taught
# here. Into a scratch directory standing for the image's filesystem ($IMAGE_ROOT):
#   - the build stage's RUN, verbatim (its /out rewritten into the scratch directory), in the
#     checkout itself (COPY . . into /src);
#   - the runtime stage: its Debian packages checked to exist for this machine's apt sources
#     (apt-get and useradd need root and would change this machine: not run), its COPY steps
#     done, its ENV exported;
#   - the with-model stage's RUN, verbatim (/opt/nucleus rewritten), which pulls the model with
#     the copied binary (seeded from the local cache when it holds the file: `nucleus pull` then
#     finds it in place instead of downloading 491 MB again);
# then the image's entrypoint, as the Deployment runs it, reads the baked-in model by its path
# (`nucleus-entrypoint inspect $NUCLEUS_MODEL`: the ENV the with-model stage sets).
set -euo pipefail
cd "$(dirname "$0")/.."

IMAGE_ROOT=$(mktemp -d)
trap 'rm -rf "$IMAGE_ROOT"' EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }

# Instructions, comments and blank lines dropped, continuation lines joined.
mapfile -t STEPS < <(sed -e '/^[[:space:]]*#/d' -e '/^[[:space:]]*$/d' Dockerfile |
    awk '{ if (sub(/\\$/, "")) { buf = buf $0; next } print buf $0; buf = "" }')

rooted() { # a command or path with the image's absolute paths moved into $IMAGE_ROOT
    local s=$1
    s=${s//\/out\//$IMAGE_ROOT\/out\/}
    s=${s//\/opt\/nucleus/$IMAGE_ROOT\/opt\/nucleus}
    printf '%s' "$s"
}

stage=
for step in "${STEPS[@]}"; do
    echo "== $step"
    case $step in
        "FROM rust:1.95-trixie AS build")
            stage=build
            rustc --version | grep -q '^rustc 1\.95\.' || echo "   (note: here $(rustc --version))" ;;
        "WORKDIR /src" | "COPY . .")
            [[ $stage == build ]] || fail "$step outside the build stage" ;;
        "RUN cargo build --release --locked -p nucleus-cli "*)
            (eval "$(rooted "${step#RUN }")") ;;
        "FROM debian:trixie-slim AS runtime")
            stage=runtime ;;
        "RUN apt-get update "*)
            for pkg in $(sed -n 's/.*--no-install-recommends \([^&]*\)&&.*/\1/p' <<<"$step"); do
                candidate=$(apt-cache policy "$pkg" | sed -n 's/ *Candidate: //p')
                [[ $candidate =~ ^[0-9] ]] || fail "no Debian package $pkg"
                echo "   package $pkg: $candidate (this machine's Debian $(cat /etc/debian_version))"
            done
            mkdir -p "$IMAGE_ROOT/models" "$IMAGE_ROOT/home/nucleus" ;;
        "COPY --from=build /out/nucleus /usr/local/bin/nucleus")
            install -D -m 0755 "$IMAGE_ROOT/out/nucleus" "$IMAGE_ROOT/usr/local/bin/nucleus" ;;
        "COPY deploy/entrypoint.sh /usr/local/bin/nucleus-entrypoint")
            install -D -m 0755 deploy/entrypoint.sh "$IMAGE_ROOT/usr/local/bin/nucleus-entrypoint" ;;
        "ENV "*)
            eval "export $(rooted "${step#ENV }")" ;;
        "USER "* | "VOLUME "* | "EXPOSE 8080" | "ENTRYPOINT "* | 'CMD ["serve"]') ;;
        "FROM runtime AS with-model")
            stage=with-model ;;
        "RUN mkdir -p /opt/nucleus/models "*)
            cached=${HOME}/.cache/nucleus/models/qwen2.5-coder-0.5b-instruct-q4_k_m.gguf
            mkdir -p "$IMAGE_ROOT/opt/nucleus/models"
            if [[ -f $cached ]]; then cp "$cached" "$IMAGE_ROOT/opt/nucleus/models/"; fi
            (PATH=$IMAGE_ROOT/usr/local/bin:$PATH; eval "$(rooted "${step#RUN }")") ;;
        *)
            fail "a Dockerfile step this script does not know: teach deploy/build_image_steps.sh" ;;
    esac
done
[[ $stage == with-model ]] || fail "the last stage is $stage, not with-model (the Deployment's image)"

echo "== the image's entrypoint reads the baked-in model: NUCLEUS_MODEL=$NUCLEUS_MODEL"
[[ $NUCLEUS_MODEL == "$IMAGE_ROOT/opt/nucleus/models/"*.gguf ]] || fail "NUCLEUS_MODEL is not in the layer"
NUCLEUS_BIN=$IMAGE_ROOT/usr/local/bin/nucleus "$IMAGE_ROOT/usr/local/bin/nucleus-entrypoint" \
    inspect "$NUCLEUS_MODEL" >"$IMAGE_ROOT/inspect.txt"
head -5 "$IMAGE_ROOT/inspect.txt"
echo "image layout: $(cd "$IMAGE_ROOT" && find . -type f | sort | tr '\n' ' ')"
du -sh "$IMAGE_ROOT/opt/nucleus/models" "$IMAGE_ROOT/usr/local/bin/nucleus"
echo "ok: every Dockerfile step ran or was checked"
