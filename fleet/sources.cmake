# libdtrain_fleet's sources, relative to fleet/: one list for fleet/CMakeLists.txt
# and for the offline GPU bundle's build (scripts/gpu_apps/CMakeLists.txt).
set(DTRAIN_FLEET_SOURCES
    src/fleet.cc src/data_parallel.cc src/host_buckets.cc src/device_buckets.cc src/optimizer.cc src/metrics.cc src/ps.cc
    src/blocks.cc src/sync_batch_norm.cc src/optimizers.cc src/sharding.cc src/sharded_checkpoint.cc src/amp.cc src/elastic.cc)

# The C++ standard libtorch's headers need, in `out`: 17, or 20 where
# <torch/all.h> says so (its #error "C++20 or later compatible compiler is
# required", as Debian's PyTorch 2.14 has).
function(dtrain_torch_cxx_standard out)
  set(std 17)
  foreach(dir IN LISTS TORCH_INCLUDE_DIRS)
    if(EXISTS ${dir}/torch/all.h)
      file(STRINGS ${dir}/torch/all.h need20 REGEX "C\\+\\+20 or later")
      if(need20)
        set(std 20)
      endif()
    endif()
  endforeach()
  set(${out} ${std} PARENT_SCOPE)
endfunction()
