# The MemoryLedger part of the memory layer (see CMakeLists.txt here).
# Paths are relative to src/memory.
set(MEMORY_LEDGER_SOURCES memory_ledger.cc)
set(MEMORY_LEDGER_TESTS memory_ledger_test.cc)
