# Tokenizer side of the engine layer (paths relative to src/engine).
set(ENGINE_TOKENIZER_SOURCES)
set(ENGINE_TOKENIZER_TESTS)
