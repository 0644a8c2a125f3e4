# Memory-pressure sources (memory_pressure.h and friends). Paths are relative
# to src/memory; included by src/memory/CMakeLists.txt.
set(MEMORY_PRESSURE_SOURCES
  memory_pressure.cc
  meminfo_pressure_source.cc
  psi_pressure_source.cc
  cgroup_pressure_source.cc)
set(MEMORY_PRESSURE_TESTS
  memory_pressure_test.cc
  psi_cgroup_pressure_test.cc)
