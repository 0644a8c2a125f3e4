# Tokenizer side of the formats layer: the tokenizer.json reader.
# Included by src/formats/CMakeLists.txt; absolute paths.
set(FORMATS_TOKENIZER_SOURCES
  ${CMAKE_CURRENT_SOURCE_DIR}/tokenizer_json.cc)
set(FORMATS_TOKENIZER_TESTS
  ${CMAKE_CURRENT_SOURCE_DIR}/tokenizer_json_test.cc)
