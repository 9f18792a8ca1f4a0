#!/usr/bin/env bash
# Fills deploy/docker/wheels/ with every wheel the image's Python needs (Linux x86-64,
# CPython 3.11.2 = Debian 12's python3), from pyproject.toml's dependency list, so the
# image build installs with --no-index: no registry or TLS needed inside the build.
#   TORCH_VERSION   (default 2.13.0)
#   TORCH_INDEX_URL extra index for torch (e.g. https://download.pytorch.org/whl/cpu);
#                   default: pip's own configuration (PyPI's torch is the CUDA build).
#   EXTRAS          optional-dependency groups to add, comma-separated (e.g. gpu)
set -euo pipefail
cd "$(dirname "$0")/../.."
PY=${PYTHON:-python3}
OUT=deploy/docker/wheels
TORCH_VERSION=${TORCH_VERSION:-2.13.0}

reqs=$(mktemp)
trap 'rm -f "$reqs"' EXIT
"$PY" deploy/docker/requirements.py --torch "$TORCH_VERSION" --extras "${EXTRAS:-}" > "$reqs"
extra=()
[ -n "${TORCH_INDEX_URL:-}" ] && extra+=(--extra-index-url "$TORCH_INDEX_URL")
echo "wheelhouse: $(tr '\n' ' ' < "$reqs")-> $OUT"
echo "setuptools>=64" >> "$reqs"; echo wheel >> "$reqs"   # the image's editable install
download() {
    "$PY" -m pip download --quiet --dest "$OUT" ${extra[@]+"${extra[@]}"} \
        --only-binary=:all: --implementation cp --python-version 3.11.2 \
        --abi cp311 --abi abi3 --abi none \
        --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 \
        --platform manylinux2014_x86_64 --platform any "$@"
}
download -r "$reqs"
mapfile -t top < "$reqs"
# pip judged markers by this Python; add what the image's Python needs besides.
for _ in 1 2 3 4 5; do
    mapfile -t more < <("$PY" deploy/docker/wheelhouse_missing.py "$OUT" "${top[@]}")
    ((${#more[@]})) || break
    echo "wheelhouse: for Python 3.11.2 also: ${more[*]}"
    download "${more[@]}"
done
((${#more[@]} == 0)) || { echo "wheelhouse: still missing: ${more[*]}" >&2; exit 1; }
echo "wheelhouse: $(find "$OUT" -name '*.whl' | wc -l) wheels, $(du -sh "$OUT" | cut -f1)"
