# Defines granule_xgrammar, a static library of xgrammar's C++ core (Apache-2.0), from the
# sources `packaging/setup.sh xgrammar` fetched into GRANULE_XGRAMMAR_DIR (never committed here:
# its licence, LICENSE and NOTICE, sits beside them). Leaves it undefined, saying why, when they
# are absent: the engine then refuses constrained requests with a message naming setup.sh.
include_guard(GLOBAL)

if(NOT "$ENV{XDG_DATA_HOME}" STREQUAL "")
  set(granule_xgrammar_default "$ENV{XDG_DATA_HOME}/granule/third_party/xgrammar")
else()
  set(granule_xgrammar_default "$ENV{HOME}/.local/share/granule/third_party/xgrammar")
endif()
set(GRANULE_XGRAMMAR_DIR "${granule_xgrammar_default}" CACHE PATH
    "xgrammar's C++ core fetched by setup.sh xgrammar (cpp/, include/, 3rdparty picojson and dlpack)")

if(NOT EXISTS "${GRANULE_XGRAMMAR_DIR}/cpp/grammar_matcher.cc"
   OR NOT EXISTS "${GRANULE_XGRAMMAR_DIR}/3rdparty/picojson/picojson.h")
  message(STATUS "Granule: no structured output (${GRANULE_XGRAMMAR_DIR} has no xgrammar sources; "
                 "run 'bash packaging/setup.sh xgrammar')")
else()
  message(STATUS "Granule: structured output with xgrammar from ${GRANULE_XGRAMMAR_DIR}")
  file(GLOB granule_xgrammar_sources "${GRANULE_XGRAMMAR_DIR}/cpp/*.cc"
       "${GRANULE_XGRAMMAR_DIR}/cpp/converter_ext/*.cc" "${GRANULE_XGRAMMAR_DIR}/cpp/support/*.cc")
  add_library(granule_xgrammar STATIC ${granule_xgrammar_sources})
  target_include_directories(granule_xgrammar SYSTEM PUBLIC "${GRANULE_XGRAMMAR_DIR}/include")
  target_include_directories(
    granule_xgrammar SYSTEM PUBLIC "${GRANULE_XGRAMMAR_DIR}/3rdparty/picojson"
                                   "${GRANULE_XGRAMMAR_DIR}/3rdparty/dlpack/include")
  target_compile_definitions(granule_xgrammar PUBLIC XGRAMMAR_ENABLE_CPPTRACE=0)
  set_target_properties(granule_xgrammar PROPERTIES CXX_STANDARD 17 POSITION_INDEPENDENT_CODE ON)
  target_link_libraries(granule_xgrammar PRIVATE Threads::Threads)
  # Third-party code: its own warnings are not ours to fix; optimised even in Debug builds,
  # since masks are computed on every step.
  target_compile_options(granule_xgrammar PRIVATE -w -O2)
endif()
