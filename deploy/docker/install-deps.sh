#!/bin/sh
# Image build only (Dockerfile, stage deps): /opt/venv with pyproject.toml's dependencies.
set -eu
python3 -m venv /opt/venv
PIP="/opt/venv/bin/pip --disable-pip-version-check --no-cache-dir --quiet"
python3 /build/requirements.py --pyproject /build/pyproject.toml \
    --torch "$TORCH_VERSION" --extras "$EXTRAS" > /build/requirements.txt
if [ "$WHEELHOUSE" = 1 ]; then
    if ! ls /build/wheels/*.whl >/dev/null 2>&1; then
        echo "deploy/docker/wheels/ is empty: run deploy/docker/build-wheelhouse.sh first," \
             "or build with --build-arg WHEELHOUSE=0" >&2
        exit 1
    fi
    $PIP install --no-index --find-links /build/wheels -r /build/requirements.txt "setuptools>=64" wheel
else
    if ls /build/ca-certificates/*.crt >/dev/null 2>&1; then
        # pip trusts its own bundle; add the site's CAs (a TLS-inspecting proxy) to it.
        bundle=$(/opt/venv/bin/python -c "import pip._vendor.certifi as c; print(c.where())")
        cat "$bundle" /build/ca-certificates/*.crt > /build/ca-bundle.pem
        export PIP_CERT=/build/ca-bundle.pem
    fi
    $PIP install --index-url "$TORCH_INDEX_URL" "torch==$TORCH_VERSION"
    $PIP install -r /build/requirements.txt "setuptools>=64" wheel
fi
# torch's C++ test binaries and headers (~190 MB): the engine neither runs them nor
# compiles extensions (no torch.compile / cpp_extension).
torch=/opt/venv/lib/python3.11/site-packages/torch
rm -rf "$torch/test" "$torch/include" "$torch"/bin/*Test "$torch"/bin/test_* "$torch"/bin/protoc*
