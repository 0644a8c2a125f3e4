# The server's layering rule, run as the ctest `server_layering`:
#   cmake -DROOT=<source dir> -P cmake/check_server_includes.cmake
# The server (src/server, include/arbiter/server) speaks to the engine, kv and
# weights layers only through the runtime: a non-test source that includes
# an arbiter/engine/, arbiter/kv/ or arbiter/weights/ header fails the test
# with the file, line and include. The types it needs of them come from
# arbiter/runtime/vocabulary.h and arbiter/runtime/snapshots.h. Tests
# (*_test.cc) may include anything.
if(NOT ROOT)
  message(FATAL_ERROR "usage: cmake -DROOT=<source dir> -P check_server_includes.cmake")
endif()
file(GLOB_RECURSE sources
  "${ROOT}/src/server/*.cc" "${ROOT}/src/server/*.h" "${ROOT}/include/arbiter/server/*.h")
set(checked 0)
set(offenders "")
foreach(path IN LISTS sources)
  if(path MATCHES "_test\\.cc$")
    continue()
  endif()
  math(EXPR checked "${checked} + 1")
  file(STRINGS "${path}" lines REGEX "^[ \t]*#[ \t]*include[ \t]*[\"<]arbiter/(engine|kv|weights)/")
  foreach(line IN LISTS lines)
    file(RELATIVE_PATH rel "${ROOT}" "${path}")
    string(STRIP "${line}" line)
    string(APPEND offenders "  ${rel}: ${line}\n")
  endforeach()
endforeach()
if(checked EQUAL 0)
  message(FATAL_ERROR "no server sources found under ${ROOT}/src/server")
endif()
if(offenders)
  message(FATAL_ERROR "server sources include engine/kv/weights headers (use "
                      "arbiter/runtime/vocabulary.h or arbiter/runtime/snapshots.h):\n${offenders}")
endif()
message(STATUS "server_layering: ${checked} server sources include no engine, kv or weights header")
