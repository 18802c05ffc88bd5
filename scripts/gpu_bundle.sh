#!/usr/bin/env bash
# Builds here what an offline GPU machine cannot (it has CUDA, CMake, ninja and
# a PyTorch wheel, but none of Debian's -dev packages) and packs it into one
# archive: an install prefix with dtrain's core, plugins (gloo, ucx, nccl,
# ps_grpc), the launcher, dtrain-conformance, dtrain-bench (with its raw-NCCL
# reference) and the GPU tests (with the withheld-rank probe),
# the runtime libraries they need that such a machine lacks (Gloo, UCX,
# TOML++, spdlog, fmt, gRPC/protobuf, ...), the dtrain sources and
# scripts/gpu_apps (the libtorch part: libdtrain_fleet, dtrain-gpu-smoke and
# dtrain-cls without OpenCV, built there against the wheel's libtorch by
# build_apps.sh, with the CLI11, fmt and zlib headers carried here), and the
# Fashion-MNIST files the default cls job reads (Debian's
# dataset-fashion-mnist, 30 MB). docs/gpu.md says how to use it.
#
#   scripts/gpu_bundle.sh [OUT.tar.gz]        default: dtrain-gpu-bundle.tar.gz
#   BUILD_DIR=build-bundle (default) is configured with the apps off; a
#   build tree with them on serves too (its libtorch parts are left out).
#
# Checks before it packs: every ELF file resolves every library it needs from
# the prefix or from the base system / CUDA (which the GPU machine has), and
# the archive is under 64 MiB. Run it under the build lock (it compiles).
set -euo pipefail
src=$(cd "$(dirname "$0")/.." && pwd)
out=$(realpath -m "${1:-dtrain-gpu-bundle.tar.gz}")
build=$(realpath -m "${BUILD_DIR:-$src/build-bundle}")
stage=$(mktemp -d)
trap 'rm -rf "$stage"' EXIT
name=dtrain-gpu
pfx=$stage/$name

# ccache (where installed) keeps its cache in the build folder unless CCACHE_DIR names one.
export CCACHE_DIR=${CCACHE_DIR:-$build/ccache} CCACHE_BASEDIR=${CCACHE_BASEDIR:-$(dirname "$src")} CCACHE_NOHASHDIR=1
launcher=()
command -v ccache > /dev/null && launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache -DCMAKE_C_COMPILER_LAUNCHER=ccache)
if [[ ! -f $build/CMakeCache.txt ]]; then
  cmake -S "$src" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DDTRAIN_WITH_APPS=OFF "${launcher[@]}" > /dev/null
fi
targets=(dtrain dtrain-conformance dtrain_gloo dtrain_ucx dtrain_nccl dtrain_ps_grpc nccl_test cuda_staging_test
         cuda_fake_staging_test communicator_test fake_cudart dtrain-nccl-withhold-probe)
grep -q '^dtrain-bench:' <(ninja -C "$build" -t targets all 2> /dev/null) && targets+=(dtrain-bench)
cmake --build "$build" -j"$(nproc)" --target "${targets[@]}"

# The prefix: the build tree's layout is the install's (bin/, lib/, lib/dtrain/plugins/).
mkdir -p "$pfx/bin" "$pfx/lib/dtrain/plugins" "$pfx/include" "$pfx/tests"
for t in dtrain dtrain-conformance dtrain-bench nccl_test cuda_staging_test cuda_fake_staging_test communicator_test \
  dtrain-nccl-withhold-probe; do
  [[ -x $build/bin/$t ]] && cp "$build/bin/$t" "$pfx/bin/"
done
# Not libdtrain_fleet where BUILD_DIR has the apps on: build_apps.sh builds it
# there against the wheel's libtorch.
find "$build/lib" -maxdepth 1 -name 'libdtrain_*.so*' ! -name 'libdtrain_fleet.*' -exec cp -P {} "$pfx/lib/" \;
cp "$build"/lib/dtrain/plugins/libdtrain_*.so "$pfx/lib/dtrain/plugins/"
# The unit tests look for these folders by their build-tree paths: the run
# script passes them through the environment instead (tests/ in the bundle).
cp "$build/tests/bad_plugins/libfake_cudart.so" "$build/tests/bad_plugins/libdtrain_v10.so" "$pfx/tests/"
cp -r "$src/core/include/dtrain" "$src/sdk/include/dtrain" "$pfx/include/"
# What apps/common and apps/cls include besides libtorch and dtrain (the GPU
# machine has no -dev packages), and libfmt, which they link.
mkdir -p "$pfx/include/third_party"
for h in CLI fmt zlib.h zconf.h; do
  [[ -e /usr/include/$h ]] || { echo "gpu_bundle: /usr/include/$h missing (libcli11-dev libfmt-dev zlib1g-dev)" >&2; exit 1; }
  cp -rL "/usr/include/$h" "$pfx/include/third_party/"
done
fmtlib=$(ldconfig -p | awk '/libfmt\.so\.[0-9]+ / && !f {print $NF; f = 1}')  # no early exit: pipefail
[[ -n $fmtlib ]] || { echo "gpu_bundle: no libfmt.so.N (libfmt-dev)" >&2; exit 1; }
cp -L "$fmtlib" "$pfx/lib/$(basename "$fmtlib")"
# The default cls job's data (apps/cls.toml, rewritten by build_apps.sh to read it here).
fm=${DTRAIN_FASHION_MNIST:-/usr/share/datasets/fashion-mnist}
mkdir -p "$pfx/data/fashion-mnist"
for f in train-images-idx3-ubyte train-labels-idx1-ubyte t10k-images-idx3-ubyte t10k-labels-idx1-ubyte; do
  [[ -e $fm/$f.gz ]] || { echo "gpu_bundle: $fm/$f.gz missing (Debian: dataset-fashion-mnist)" >&2; exit 1; }
  cp "$fm/$f.gz" "$pfx/data/fashion-mnist/"
done
strip --strip-debug "$pfx"/bin/* "$pfx"/lib/*.so* "$pfx"/lib/dtrain/plugins/*.so "$pfx"/tests/*.so 2> /dev/null || true

# UCX loads its transport modules at run time from its module folder
# (UCX_MODULE_DIR in env.sh): CMA for one host; the InfiniBand ones stay out
# (the GPU machine has no RDMA fabric to use them on).
ucxmod=$(dirname "$(ldconfig -p | awk '/libucp.so.0 / {print $NF; exit}')")/ucx
if [[ -e $ucxmod/libuct_cma.so.0 ]]; then
  mkdir -p "$pfx/lib/ucx"
  cp -L "$ucxmod/libuct_cma.so.0" "$pfx/lib/ucx/"
fi

# Runtime libraries: everything the ELF files need except the base system
# (glibc, libstdc++, libgcc) and CUDA/NCCL (the GPU machine's own, from its
# CUDA toolkit and the nvidia-nccl wheel).
base='^(linux-vdso|libc\.so|libm\.so|libdl\.so|librt\.so|libpthread\.so|ld-linux|libstdc\+\+\.so|libgcc_s\.so|libcuda\.so|libcudart\.so|libnccl\.so|libz\.so)'
elfs() {
  find "$pfx/bin" "$pfx/lib" "$pfx/tests" -type f \( -perm -u+x -o -name '*.so*' \) -print | while read -r f; do
    [[ $(head -c 4 "$f" | tr -d '\0') == $'\x7fELF' ]] && echo "$f"
  done
}
for round in 1 2 3; do
  while read -r f; do
    LD_LIBRARY_PATH=$pfx/lib:$pfx/lib/ucx ldd "$f" 2> /dev/null | awk '$2 == "=>" && $3 ~ /^\// {print $1, $3}'
  done < <(elfs) | sort -u | while read -r soname path; do
    [[ $soname =~ $base ]] && continue
    [[ -e $pfx/lib/$soname ]] || cp -L "$path" "$pfx/lib/$soname"
  done
done

# Check: nothing unresolved, nothing outside the prefix but the base system and CUDA.
bad=0
while read -r f; do
  while read -r line; do
    soname=${line%% *}
    if [[ $line == *"not found"* ]]; then
      [[ $soname =~ ^(libcudart|libnccl|libcuda)\. ]] && continue  # /usr/local/cuda here, the wheel there
      echo "gpu_bundle: $f: $soname not found" >&2
      bad=1
    elif [[ ! $soname =~ $base && $line != *"$pfx/"* && $line == *"=> /"* ]]; then
      echo "gpu_bundle: $f: $line resolves outside the prefix" >&2
      bad=1
    fi
  done < <(LD_LIBRARY_PATH=$pfx/lib:$pfx/lib/ucx ldd "$f" 2> /dev/null | sed 's/^[[:space:]]*//')
done < <(elfs)
[[ $bad == 0 ]] || { echo "gpu_bundle: unresolved or outside libraries (above)" >&2; exit 1; }

# The sources (the libtorch apps and the GPU-only steps are built there).
git -C "$src" archive --format=tar --prefix=src/ HEAD | tar -x -C "$pfx"
cp "$src/scripts/gpu_apps/build_apps.sh" "$src/scripts/gpu_apps/env.sh" "$pfx/"
chmod +x "$pfx/build_apps.sh"
{
  echo "dtrain GPU bundle, built $(date -u +%Y-%m-%dT%H:%MZ) from $(git -C "$src" rev-parse --short HEAD)"
  echo "on $(. /etc/os-release; echo "$PRETTY_NAME"), glibc $(ldd --version | head -1 | awk '{print $NF}')"
  echo "needs on the target: glibc >= the highest GLIBC_ version below, libstdc++ with the GLIBCXX below,"
  echo "CUDA 12/13 runtime (libcudart) and libnccl.so.2 (the nvidia-nccl wheel) for nccl"
  objdump -T "$pfx"/bin/* "$pfx"/lib/*.so* 2> /dev/null | grep -o 'GLIBC_[0-9.]*' | sort -uV | tail -1
  objdump -T "$pfx"/bin/* "$pfx"/lib/*.so* 2> /dev/null | grep -o 'GLIBCXX_[0-9.]*' | sort -uV | tail -1
} > "$pfx/BUNDLE.txt"

tar -C "$stage" -czf "$out" "$name"
size=$(stat -c %s "$out")
echo "gpu_bundle: $out: $((size / 1024 / 1024)) MiB ($size bytes), $(find "$pfx/lib" -maxdepth 1 -name '*.so*' | wc -l) libraries"
cat "$pfx/BUNDLE.txt"
((size < 64 * 1024 * 1024)) || { echo "gpu_bundle: the archive is over 64 MiB" >&2; exit 1; }
