# Source this on a GPU machine that has torch, numba and numba-cuda but no network, from the
# repository root:
#   source bench/gpu/setup_env.sh
# It puts numpy 2.4 (numba-cuda 0.30 breaks on numpy 2.5) and this project (numba_flash and
# numba_flash_reference) on the path from wheels carried in .whl/ (download them with the command in
# bench/gpu/README.md), then prints the backend. Sourcing it again in the same shell (or from a
# script started by one that sourced it) skips the installs. It leaves the caller's shell options alone.
_nf_site=/tmp/numba-flash-site
if [ "${NUMBA_FLASH_ENV:-}" != "$_nf_site" ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$_nf_site" .whl/numpy-2.4*.whl \
    || { echo "setup_env: could not install .whl/numpy-2.4*.whl (see bench/gpu/README.md)" >&2; return 1; }
  python3 -m pip install -q --no-index --no-deps --no-build-isolation --no-cache-dir --upgrade --target "$_nf_site" . >/dev/null \
    || { echo "setup_env: could not install numba-flash from $(pwd)" >&2; return 1; }
  export PYTHONPATH="$_nf_site${PYTHONPATH:+:$PYTHONPATH}"
  export NUMBA_FLASH_ENV="$_nf_site"
fi
export PYTHONUNBUFFERED=1
python3 -c "import numpy, numba, numba_flash; print('numpy', numpy.__version__, '| numba', numba.__version__, '|', numba_flash.describe())" || return 1
