// The version and the commit this binary was built from (cmake/version_info.cmake writes their
// definitions at build time).
#pragma once

namespace pagellm {

// The project version, "0.1.0" (CMakeLists.txt's project()).
const char* version();
// The git commit, 12 hex digits with "-dirty" when the tree had uncommitted changes; the
// PAGELLM_BUILD_COMMIT CMake variable when set (builds without .git); else "unknown".
const char* build_commit();

}  // namespace pagellm
