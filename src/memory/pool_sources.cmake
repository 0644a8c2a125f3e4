# The device arena part of the memory layer: DeviceBackend (cpu, fake) and
# the MemoryPool allocator over it. Paths are relative to src/memory;
# included by src/memory/CMakeLists.txt.
set(MEMORY_POOL_SOURCES
  device_backend.cc
  memory_pool.cc)
set(MEMORY_POOL_TESTS
  device_backend_test.cc
  memory_pool_test.cc)
