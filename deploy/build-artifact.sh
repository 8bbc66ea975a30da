#!/usr/bin/env bash
# Build tiered's release artifact: the wheel, and a wheelhouse that installs it offline.
#
#   deploy/build-artifact.sh [--arch x86_64|aarch64] [--out DIR]
#
# Writes, under DIR (default dist/):
#   tiered-<version>-py3-none-any.whl    the wheel (PEP 517 build with the locked build
#                                        tools of requirements/build.txt; reproducible:
#                                        SOURCE_DATE_EPOCH is the time of the last commit
#                                        that changed the packaged sources)
#   wheelhouse-<arch>/                   what a node installs from, with no index:
#     *.whl                              every runtime dependency, exactly as locked in
#                                        requirements/runtime.txt, for CPython 3.11 on
#                                        manylinux <arch>, and tiered's wheel
#     requirements.txt                   the runtime lock plus `tiered==<version>` and the
#                                        wheel's hash: `pip install --no-index --find-links .
#                                        --require-hashes -r requirements.txt`
#     SHA256SUMS                         every other file's digest (what the boot script
#                                        fetches first and checks everything against)
#     wheelhouse.json                    version, architecture, Python, file count
#
# The Terraform modules upload the wheelhouse to the deployment's bucket and pass the
# digest of SHA256SUMS to the nodes (terraform/README.md). Needs python3 (3.11+) and
# pip; downloads from the index pip is configured with (every file is hash-checked).
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
arch=$(uname -m)
out="$here/dist"
while (($#)); do
  case $1 in
    --arch) arch=$2; shift 2 ;;
    --out) out=$2; shift 2 ;;
    -h | --help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) echo "build-artifact: unknown argument $1" >&2; exit 2 ;;
  esac
done
case $arch in
  x86_64 | amd64) arch=x86_64 ;;
  aarch64 | arm64) arch=aarch64 ;;
  *) echo "build-artifact: --arch must be x86_64 or aarch64, not $arch" >&2; exit 2 ;;
esac
mkdir -p "$out"
out="$(cd "$out" && pwd)"

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
log() { echo "build-artifact: $*" >&2; }

# The build tools, exactly as locked, in a venv of their own.
log "build tools (requirements/build.txt)"
python3 -m venv "$work/build-venv"
"$work/build-venv/bin/pip" install --quiet --disable-pip-version-check --require-hashes \
  -r "$here/requirements/build.txt"

# Build from a clean copy of the sources, so nothing stale in build/ or *.egg-info of
# the work tree can reach the wheel.
log "wheel"
mkdir "$work/src"
cp -r "$here/pyproject.toml" "$here/README.md" "$here/tiered" "$here/hot" "$here/cold" "$here/gc" "$work/src/"
mkdir -p "$work/src/clients/python"
cp -r "$here/clients/python/tiered_client" "$work/src/clients/python/"
find "$work/src" -name __pycache__ -prune -exec rm -rf {} +
# The time of the last commit that changed what the wheel holds: a commit elsewhere (the
# Terraform modules, the docs) leaves the wheel, and so the deployed artifact, unchanged.
epoch=$(git -C "$here" log -1 --format=%ct -- pyproject.toml README.md tiered hot cold gc clients/python/tiered_client 2>/dev/null || true)
epoch=${epoch:-315532800}
(cd "$work/src" && SOURCE_DATE_EPOCH=$epoch "$work/build-venv/bin/python" -m build --wheel \
  --no-isolation --outdir "$work/dist" >"$work/build.log" 2>&1) || {
  cat "$work/build.log" >&2
  exit 1
}
wheels=("$work"/dist/tiered-*.whl)
wheel=${wheels[0]}
name=$(basename "$wheel")
version=${name#tiered-}
version=${version%%-*}
cp "$wheel" "$out/$name"

# The wheelhouse: every locked runtime dependency for the target platform, hash-checked.
house="$out/wheelhouse-$arch"
rm -rf "$house"
mkdir -p "$house"
platforms=()
for glibc in 2_34 2_28 2_27 2_26 2_24 2_17 2_12 2_5; do
  platforms+=(--platform "manylinux_${glibc}_${arch}")
done
platforms+=(--platform "manylinux2014_${arch}")
[[ $arch == x86_64 ]] && platforms+=(--platform manylinux2010_x86_64 --platform manylinux1_x86_64)
log "wheelhouse-$arch (requirements/runtime.txt for CPython 3.11, manylinux $arch)"
"$work/build-venv/bin/pip" download --quiet --disable-pip-version-check --require-hashes \
  --only-binary=:all: --implementation cp --python-version 3.11 \
  --abi cp311 --abi abi3 --abi none "${platforms[@]}" \
  -r "$here/requirements/runtime.txt" -d "$house"
cp "$wheel" "$house/"

digest=$(sha256sum "$wheel" | cut -d' ' -f1)
{
  echo "# tiered $version and its runtime dependencies (requirements/runtime.txt): install with"
  echo "#   pip install --no-index --find-links <this directory> --require-hashes -r requirements.txt"
  grep -v '^#' "$here/requirements/runtime.txt"
  echo "tiered==$version \\"
  echo "    --hash=sha256:$digest"
} >"$house/requirements.txt"

(cd "$house" && find . -maxdepth 1 -type f -printf '%f\n' | LC_ALL=C sort | xargs sha256sum >"$work/SHA256SUMS")
mv "$work/SHA256SUMS" "$house/SHA256SUMS"
files=$(wc -l <"$house/SHA256SUMS")
printf '{"tiered_version": "%s", "architecture": "%s", "python": "3.11", "tiered_wheel": "%s", "files": %d}\n' \
  "$version" "$arch" "$name" "$files" >"$house/wheelhouse.json"

log "done: $out/$name"
log "      $house ($files files, $(du -sh "$house" | cut -f1)); SHA256SUMS $(sha256sum "$house/SHA256SUMS" | cut -d' ' -f1)"
