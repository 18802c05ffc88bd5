# Source this in the unpacked bundle (bash): `source dtrain-gpu/env.sh`.
# dtrain's own libraries and the runtime libraries it carries, the CUDA
# toolkit's, and the NCCL and libtorch of the machine's PyTorch wheel.
_dt=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
export DTRAIN_PREFIX=$_dt
export PATH=$_dt/bin:$_dt/build-gpu${PATH:+:$PATH}
_ld=$_dt/lib:$_dt/lib/dtrain/plugins
for _p in "${CUDA_HOME:-/usr/local/cuda}/lib64" "${CUDA_HOME:-/usr/local/cuda}/lib"; do [[ -d $_p ]] && _ld=$_ld:$_p; done
if command -v python3 > /dev/null; then
  for _m in nvidia.nccl nvidia.cuda_runtime nvidia.cu13 torch; do
    _d=$(python3 -c "import $_m, os; print(os.path.dirname(list($_m.__path__)[0] + '/x'))" 2> /dev/null) || continue
    for _l in "$_d/lib" "$_d/lib64"; do [[ -d $_l ]] && _ld=$_ld:$_l; done
  done
fi
export LD_LIBRARY_PATH=$_ld${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
# UCX finds its transport modules here; the tests find their helper libraries here.
[[ -d $_dt/lib/ucx ]] && export UCX_MODULE_DIR=$_dt/lib/ucx
export DTRAIN_BAD_PLUGIN_DIR=$_dt/tests DTRAIN_BUILT_PLUGIN_DIR=$_dt/lib/dtrain/plugins
export NCCL_SOCKET_IFNAME=${NCCL_SOCKET_IFNAME:-lo}
unset _dt _ld _p _m _d _l
