# Compute side of the engine layer (paths relative to src/engine).
set(ENGINE_COMPUTE_SOURCES)
set(ENGINE_COMPUTE_TESTS)
