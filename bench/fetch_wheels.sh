#!/usr/bin/env bash
# Download the wheels bench/gpu_suite.py installs on the lent GPU machine, which has Python 3.12,
# torch, numpy, pandas, httpx, huggingface_hub, typer, ... but neither gradio nor pydantic, and no
# network. Run it here (where pip reaches PyPI), then carry the folder: docs/gpu_suite.md.
#
#   bash bench/fetch_wheels.sh [DEST]        # default DEST: bench/wheels (git-ignored)
#
# Pure-Python packages are pinned to the versions installed here (the ones the tests run with);
# orjson is not, because its version here has no cp312 wheel. Each is fetched without its
# dependencies (--no-deps): the list below is the whole set the device lacks, so the suite can
# install the folder with `pip install --no-index --no-deps --target`. typing_extensions comes
# too, since pydantic needs a newer one than some images carry.
set -euo pipefail
cd "$(dirname "$0")/.."
DEST=${1:-bench/wheels}
PY=${PYTHON:-python3}

PINNED="gradio gradio_client hf-gradio pydantic pydantic-core annotated-types typing-inspection
typing-extensions fastapi starlette uvicorn opentelemetry-api safehttpx groovy python-multipart brotli
pydub pytz semantic-version tomlkit"
UNPINNED="orjson~=3.0"

specs=$("$PY" - $PINNED <<'EOF'
import importlib.metadata as m
import sys

missing = []
for name in sys.argv[1:]:
    try:
        print(f"{name}=={m.version(name)}")
    except m.PackageNotFoundError:
        missing.append(name)
if missing:
    sys.exit("not installed here, so no version to pin: " + " ".join(missing)
             + " (pip install -r requirements.txt first)")
EOF
)

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
# shellcheck disable=SC2086
"$PY" -m pip download --quiet --no-deps --only-binary=:all: --python-version 3.12 --implementation cp --abi cp312 \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64 \
    --platform manylinux2014_x86_64 --platform manylinux1_x86_64 -d "$tmp" $specs $UNPINNED
mkdir -p "$DEST"
rm -f "$DEST"/*.whl  # one version of each: two would stop the whole install
mv "$tmp"/*.whl "$DEST"/
ls -1 "$DEST"
echo "$(ls "$DEST"/*.whl | wc -l) wheels, $(du -sh "$DEST" | cut -f1) in $DEST (the device carries at most 64 MiB with the tree)"
