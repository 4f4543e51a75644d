# xgrammar's C++ core, the grammar engine of structured outputs (src/runtime/grammar.h), built as a
# static library from the source distribution scripts/fetch-xgrammar.sh puts in third_party/ (the
# version is pinned there and here). Built with the project's own flags rather than through its
# CMakeLists, which adds -Werror, LTO and its Python bindings, none of which a C++ user needs.
set(PAGELLM_XGRAMMAR_DIR ${PROJECT_SOURCE_DIR}/third_party/xgrammar-0.2.8
    CACHE PATH "xgrammar's source distribution (scripts/fetch-xgrammar.sh)")
if(NOT EXISTS ${PAGELLM_XGRAMMAR_DIR}/include/xgrammar/xgrammar.h)
  message(FATAL_ERROR "xgrammar's sources are missing at ${PAGELLM_XGRAMMAR_DIR}: run "
                      "scripts/fetch-xgrammar.sh (scripts/setup.sh does)")
endif()
file(GLOB_RECURSE _xgrammar_srcs CONFIGURE_DEPENDS ${PAGELLM_XGRAMMAR_DIR}/cpp/*.cc)
list(FILTER _xgrammar_srcs EXCLUDE REGEX "/cpp/tvm_ffi/")  # the Python bindings
add_library(xgrammar STATIC ${_xgrammar_srcs})
target_include_directories(xgrammar PUBLIC ${PAGELLM_XGRAMMAR_DIR}/include)
target_include_directories(xgrammar SYSTEM PUBLIC ${PAGELLM_XGRAMMAR_DIR}/3rdparty/picojson
                                                  ${PAGELLM_XGRAMMAR_DIR}/3rdparty/dlpack/include)
target_compile_definitions(xgrammar PUBLIC XGRAMMAR_ENABLE_CPPTRACE=0
                                           XGRAMMAR_ENABLE_INTERNAL_CHECK=0)
target_compile_options(xgrammar PRIVATE -w)  # third-party code: its warnings are not ours to fix
target_link_libraries(xgrammar PUBLIC Threads::Threads)
