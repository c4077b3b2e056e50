# Sourced by scripts/build-pkg.sh and scripts/bootstrap.sh: how the shipped
# wasm is compiled.
#
# The package is built with a pinned nightly so that the standard library is
# rebuilt for size (cargo -Zbuild-std) with panics as a bare `unreachable`
# (-Cpanic=immediate-abort; no panic message formatting, no file/line data:
# -Zlocation-detail=none; no Debug bodies: -Zfmt-debug=none). Measured on the
# store-only module (gzip -9): 112,151 B with stable and panic=abort, 98,665 B
# with these flags. The Rust test suites and clippy stay on stable; only the
# artifact that ships (and that the e2e suites load) uses this toolchain.
# nightly-2026-05-20 is rustc 1.97.0-nightly (e50aa6fba 2026-05-19).
PKG_TOOLCHAIN=nightly-2026-05-20
PKG_RUSTFLAGS="-Zunstable-options -Cpanic=immediate-abort -Zlocation-detail=none -Zfmt-debug=none"
PKG_CARGO_ARGS=(-Zbuild-std=std,panic_abort -Zbuild-std-features=optimize_for_size)

# Installs the pinned toolchain with the sources -Zbuild-std needs (skips
# what is installed).
pkg_toolchain_install() {
  if ! rustup run "$PKG_TOOLCHAIN" rustc --print sysroot >/dev/null 2>&1 ||
    ! rustup component list --toolchain "$PKG_TOOLCHAIN" --installed 2>/dev/null | grep -q '^rust-src'; then
    echo "[pkg-toolchain] rustup toolchain install $PKG_TOOLCHAIN (rust-src, wasm32-unknown-unknown)"
    rustup toolchain install "$PKG_TOOLCHAIN" --profile minimal --component rust-src \
      --target wasm32-unknown-unknown
  fi
}
