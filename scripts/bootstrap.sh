#!/usr/bin/env bash
# Installs what a fresh Debian machine lacks to build and test tally: libclang
# (rocksdb's bindgen), the -dev packages librdkafka is built against (OpenSSL,
# libcurl, zstd), the PostgreSQL server binaries and Chromium (headless, for
# the status page test).
# Idempotent and quiet when everything is already there.
set -euo pipefail

need=()
if ! ls /usr/lib/llvm-*/lib/libclang.so* /usr/lib/x86_64-linux-gnu/libclang*.so* >/dev/null 2>&1; then
  need+=(libclang-dev)
fi
if ! ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1; then
  need+=(postgresql)
fi
# A -dev package is there when pkg-config finds its library.
for pkg in openssl:libssl-dev libcurl:libcurl4-openssl-dev libzstd:libzstd-dev; do
  pkg-config --exists "${pkg%%:*}" 2>/dev/null || need+=("${pkg#*:}")
done
command -v pkg-config >/dev/null 2>&1 || need+=(pkg-config)
command -v make >/dev/null 2>&1 || need+=(make)
# clang builds RocksDB's C++ about a third faster than g++ (scripts/toolchain/).
command -v clang++ >/dev/null 2>&1 || need+=(clang)
command -v g++ >/dev/null 2>&1 || need+=(g++)
command -v promtool >/dev/null 2>&1 || need+=(prometheus)
# The S3-compatible test server (scripts/s3.sh): moto in a venv, checked with curl.
command -v curl >/dev/null 2>&1 || need+=(curl)
python3 -c 'import venv, ensurepip' >/dev/null 2>&1 || need+=(python3-venv)
# The status page test (tests/it/status_page.rs) loads /status in headless
# Chromium; a font so its screenshot shows text.
[ -x /usr/bin/chromium ] || need+=(chromium)
ls /usr/share/fonts/truetype/dejavu/DejaVuSans.ttf >/dev/null 2>&1 || need+=(fonts-dejavu-core)

if [ ${#need[@]} -gt 0 ]; then
  echo "bootstrap: installing ${need[*]}" >&2
  SUDO=""
  [ "$(id -u)" -eq 0 ] || SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
fi
