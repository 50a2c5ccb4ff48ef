# The `quiver` binary in a small image: built in a Rust image, run as a non-root user in a
# slim Debian one, `quiver serve` on 0.0.0.0:7345 with its store on the /var/lib/quiver
# volume.
#
#   docker build -t quiver .
#   docker run -p 7345:7345 -v quiver-data:/var/lib/quiver quiver
#
# The binary links glibc dynamically (the SQLite engine is compiled in; the sentence model
# is not in the image: `quiver model install` into the volume, and `[search] model_dir`).
# Listening beyond the container's loopback, configure `[[auth.tokens]]` in
# /var/lib/quiver/quiver.toml (`quiver serve` warns while there are none), and `[admin]
# token` for `GET /metrics` and `POST /admin/reload`. Upstream MCP servers started over
# stdio need their runtime (node, python) in the image: build FROM this one and add it.

FROM rust:1.89-bookworm AS build
WORKDIR /src
COPY . .
RUN cargo build --release --locked -p quiver-host \
    && install -m 0755 target/release/quiver /usr/local/bin/quiver

FROM debian:bookworm-slim
RUN apt-get update \
    && apt-get install -y --no-install-recommends ca-certificates \
    && rm -rf /var/lib/apt/lists/* \
    && useradd --system --uid 10001 --home-dir /var/lib/quiver --shell /usr/sbin/nologin quiver \
    && mkdir -p /var/lib/quiver \
    && chown quiver:quiver /var/lib/quiver
COPY --from=build /usr/local/bin/quiver /usr/local/bin/quiver
USER quiver
# The store (quiver.db and its -wal, -shm and -lock files) and an optional quiver.toml live
# here: `quiver` reads ./quiver.toml when present, and the store defaults to ./quiver.db.
WORKDIR /var/lib/quiver
VOLUME ["/var/lib/quiver"]
EXPOSE 7345
STOPSIGNAL SIGTERM
ENTRYPOINT ["/usr/local/bin/quiver"]
CMD ["serve", "--listen", "0.0.0.0:7345"]
