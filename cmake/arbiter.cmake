# arbiter_layer(NAME SOURCES ... DEPS ...): one static library per layer.
function(arbiter_layer name)
  cmake_parse_arguments(L "" "" "SOURCES;DEPS" ${ARGN})
  if(NOT L_SOURCES)  # a layer whose sources have not landed yet
    add_library(arbiter_${name} INTERFACE)
    target_include_directories(arbiter_${name} INTERFACE ${PROJECT_SOURCE_DIR}/include)
    target_link_libraries(arbiter_${name} INTERFACE ${L_DEPS})
    return()
  endif()
  add_library(arbiter_${name} STATIC ${L_SOURCES})
  target_include_directories(arbiter_${name} PUBLIC ${PROJECT_SOURCE_DIR}/include
                                            PRIVATE ${PROJECT_SOURCE_DIR}/src)
  target_link_libraries(arbiter_${name} PUBLIC ${L_DEPS})
endfunction()

# arbiter_test(NAME [LABEL unit|e2e] [TSAN] SOURCES ... DEPS ...): a GoogleTest binary registered with ctest.
# TSAN adds the ctest label `tsan` and the target to `tsan_tests`: the tests
# `make test-tsan` builds and runs under ThreadSanitizer (the ones that start
# threads and whose dependencies are TSan-clean; see the Makefile).
# Tests run with the source tree's root as ARBITER_SOURCE_DIR so they can find
# scripts (e.g. the numpy reference).
function(arbiter_test name)
  if(NOT ARBITER_TESTS)
    return()
  endif()
  cmake_parse_arguments(T "TSAN" "LABEL" "SOURCES;DEPS" ${ARGN})
  if(NOT T_LABEL)
    set(T_LABEL unit)
  endif()
  if(NOT T_SOURCES)
    return()
  endif()
  if(T_TSAN)
    set_property(GLOBAL APPEND PROPERTY ARBITER_TSAN_TESTS ${name})
  endif()
  if(T_LABEL STREQUAL "unit")
    set_property(GLOBAL APPEND PROPERTY ARBITER_UNIT_TESTS ${name})
  endif()
  add_executable(${name} ${T_SOURCES})
  target_include_directories(${name} PRIVATE ${PROJECT_SOURCE_DIR}/src)
  target_link_libraries(${name} PRIVATE ${T_DEPS} GTest::gtest GTest::gmock GTest::gtest_main)
  target_compile_definitions(${name} PRIVATE
    ARBITER_SOURCE_DIR="${PROJECT_SOURCE_DIR}"
    ARBITER_BINARY_DIR="${PROJECT_BINARY_DIR}")
  gtest_discover_tests(${name} DISCOVERY_TIMEOUT 60
    PROPERTIES LABELS ${T_LABEL} ENVIRONMENT "ARBITER_SOURCE_DIR=${PROJECT_SOURCE_DIR}")
  if(T_TSAN)
    # gtest_discover_tests flattens PROPERTIES into one list, so a second
    # label cannot go through it; this file runs after the discovered tests'
    # include file (which sets ${name}_TESTS) and labels them all.
    set(labels_file ${CMAKE_CURRENT_BINARY_DIR}/${name}_tsan_labels.cmake)
    file(WRITE ${labels_file}
      "if(${name}_TESTS)\n"
      "  set_tests_properties(\${${name}_TESTS} PROPERTIES LABELS \"${T_LABEL};tsan\")\n"
      "endif()\n")
    set_property(DIRECTORY APPEND PROPERTY TEST_INCLUDE_FILES ${labels_file})
  endif()
endfunction()
