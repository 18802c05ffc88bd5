# libdtrain_fleet's sources, relative to fleet/: one list for fleet/CMakeLists.txt
# and for the offline GPU bundle's build (scripts/gpu_apps/CMakeLists.txt).
set(DTRAIN_FLEET_SOURCES
    src/fleet.cc src/data_parallel.cc src/host_buckets.cc src/device_buckets.cc src/optimizer.cc src/metrics.cc src/ps.cc
    src/blocks.cc src/sync_batch_norm.cc src/optimizers.cc src/sharding.cc src/sharded_checkpoint.cc src/amp.cc src/elastic.cc)
