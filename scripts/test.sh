#!/usr/bin/env bash
# The whole test suite, from a fresh clone on a fresh machine. `.ci/run` runs exactly this.
#
# It installs what the tests need when it is missing, then runs every test in the dev profile
# (a release build of DataFusion alone takes ~15 minutes on 2 cores). The target directory is
# kept outside the checkout so later runs and fresh clones reuse the compiled dependencies.
# Besides the Rust toolchain the tests need, from Debian: `prometheus` (a real Prometheus that
# scrapes the services, and `promtool` for the rules), `chromium` with `chromium-driver` (the
# status page and the dashboard previews in a real headless browser), and `slurm-wlm` with
# `munge` (a real slurmctld and slurmd that the Slurm test starts on loopback); and from PyPI
# moto's S3 server (an S3 endpoint on loopback for the `s3://` data directory); and from
# crates.io cargo-deb (the Debian package test). They are installed here when missing.
set -euo pipefail
cd "$(dirname "$0")/.."

missing=()
command -v prometheus >/dev/null 2>&1 && command -v promtool >/dev/null 2>&1 || missing+=(prometheus)
command -v chromium >/dev/null 2>&1 || missing+=(chromium)
command -v chromedriver >/dev/null 2>&1 || missing+=(chromium-driver)
[ -x /usr/sbin/slurmctld ] && [ -x /usr/sbin/slurmd ] && command -v sbatch >/dev/null 2>&1 || missing+=(slurm-wlm)
[ -x /usr/sbin/munged ] && [ -x /usr/sbin/mungekey ] || missing+=(munge)
if [ ${#missing[@]} -gt 0 ]; then
  echo "== installing Debian's ${missing[*]} for the tests"
  sudo=""
  if [ "$(id -u)" -ne 0 ]; then sudo="sudo"; fi
  export DEBIAN_FRONTEND=noninteractive
  $sudo apt-get update -q >/dev/null
  $sudo apt-get install -y -q --no-install-recommends "${missing[@]}" >/dev/null
fi

# moto's S3 server: a real S3 REST endpoint on loopback for the object-store data directory.
if ! python3 -c "import moto.server, flask, flask_cors" >/dev/null 2>&1; then
  echo "== installing moto's S3 server (Python) for the object-store test"
  python3 -m pip install -q --disable-pip-version-check 'moto>=5,<6' flask flask-cors
fi

if ! command -v cargo >/dev/null 2>&1; then
  echo "cargo not found: install Rust with rustup (https://rustup.rs), toolchain 1.94 or newer" >&2
  exit 1
fi

# cargo-deb: cli/tests/package.rs builds the Debian package with it (scripts/package-deb.sh),
# installs it with dpkg -i and purges it. About 1.5 minutes to build on 2 cores, once.
if ! cargo deb --version >/dev/null 2>&1; then
  echo "== installing cargo-deb for the package test"
  cargo install --quiet --locked cargo-deb --version 3.8.0
fi

export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$HOME/.cache/gpuledger/target}"
export CARGO_TERM_COLOR="${CARGO_TERM_COLOR:-never}"
echo "== gpuledger tests (target dir: $CARGO_TARGET_DIR)"

if rustfmt --version >/dev/null 2>&1; then
  cargo fmt --all -- --check
fi
# The crate graph keeps the house rules (ARCHITECTURE.md: dependencies that must never appear).
bash scripts/check-deps.sh
python3 scripts/check-cycles.py
# The lints the root manifest declares, every warning an error, over every target.
if ! cargo clippy --version >/dev/null 2>&1; then
  echo "== installing clippy"
  rustup component add clippy
fi
cargo clippy --workspace --all-targets --locked -- -D warnings
cargo test --workspace --locked
# The README's first command is `cargo run --release -- demo`: `cargo run` must pick the main
# binary (there are two). Checked from the manifest, without another build.
if ! cargo metadata --locked --no-deps --format-version 1 | grep -q '"default_run":"gpuledger"'; then
  echo "cli/Cargo.toml must keep default-run = \"gpuledger\" (README: cargo run --release -- demo)" >&2
  exit 1
fi
