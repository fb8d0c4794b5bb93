#!/usr/bin/env bash
# Build (once) and install Horovod 0.28.1 for the CPU build of torch, with Gloo and no MPI.
#
# Horovod ships only as an sdist, and its build needs three adjustments for torch >= 2.1: no build
# isolation (it must see the installed torch), CMake policy floor 3.5 (CMake 4 rejects the bundled
# gloo CMakeLists), and C++17 instead of the C++14 its CMake forces (torch's headers need C++17).
# The build takes several minutes on 2 cores, so the wheel is cached outside the repository
# (DISTIFY_WHEEL_CACHE, default ~/.cache/distify-wheels) and reused on the next run.
set -euo pipefail

HOROVOD_VERSION=0.28.1
cache="${DISTIFY_WHEEL_CACHE:-$HOME/.cache/distify-wheels}"
mkdir -p "$cache"

if python -c "import horovod.torch" >/dev/null 2>&1; then
  echo "horovod: already installed ($(python -c 'import horovod; print(horovod.__version__)'))"
  exit 0
fi

# The wheel is only valid for the torch it was compiled against: key the cache on torch's version.
torch_version=$(python -c 'import torch; print(torch.__version__)')
wheel_dir="$cache/horovod-$HOROVOD_VERSION-torch-$torch_version"
mkdir -p "$wheel_dir"

if ! ls "$wheel_dir"/horovod-*.whl >/dev/null 2>&1; then
  echo "horovod: building $HOROVOD_VERSION against torch $torch_version (several minutes)"
  python -m pip install -q cloudpickle psutil pyyaml packaging wheel 'setuptools<70'
  shim=$(mktemp -d)
  real_cxx=$(command -v g++)
  # Horovod's CMake forces -std=c++14; torch's headers need C++17.
  cat > "$shim/g++" <<WRAP
#!/usr/bin/env bash
args=()
for a in "\$@"; do
  case "\$a" in -std=c++14|-std=c++11) args+=("-std=c++17") ;; *) args+=("\$a") ;; esac
done
exec "$real_cxx" "\${args[@]}"
WRAP
  chmod +x "$shim/g++"
  build_tmp=$(mktemp -d)
  ( cd "$build_tmp" && \
    CXX="$shim/g++" \
    CMAKE_POLICY_VERSION_MINIMUM=3.5 \
    HOROVOD_WITH_PYTORCH=1 HOROVOD_WITHOUT_MPI=1 HOROVOD_WITH_GLOO=1 \
    HOROVOD_WITHOUT_TENSORFLOW=1 HOROVOD_WITHOUT_MXNET=1 HOROVOD_CPU_OPERATIONS=GLOO \
    MAKEFLAGS="-j$(nproc)" HOROVOD_BUILD_ARCH_FLAGS="" \
    python -m pip wheel --no-build-isolation --no-deps --no-binary horovod \
      -w "$wheel_dir" "horovod==$HOROVOD_VERSION" )
  rm -rf "$shim" "$build_tmp"
fi

python -m pip install -q cloudpickle psutil pyyaml packaging
python -m pip install -q --no-deps "$wheel_dir"/horovod-*.whl
python -c "import horovod.torch as hvd; print('horovod:', __import__('horovod').__version__, 'gloo built:', hvd.gloo_built())"
