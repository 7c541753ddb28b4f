// fc_build_info: the build's version, CUDA toolkit, architectures, tile set and commit as JSON.
// CMake passes the values as compile definitions (src/CMakeLists.txt), fixed at configure time.
#include <string>

#include "flashcute/flashcute.h"

#ifndef FLASHCUTE_BUILD_VERSION
#define FLASHCUTE_BUILD_VERSION "unknown"
#endif
#ifndef FLASHCUTE_BUILD_CUDA_VERSION
#define FLASHCUTE_BUILD_CUDA_VERSION "unknown"
#endif
#ifndef FLASHCUTE_BUILD_CUDA_ARCHS
#define FLASHCUTE_BUILD_CUDA_ARCHS ""
#endif
#ifndef FLASHCUTE_BUILD_TILE_SET
#define FLASHCUTE_BUILD_TILE_SET "unknown"
#endif
#ifndef FLASHCUTE_BUILD_GIT_COMMIT
#define FLASHCUTE_BUILD_GIT_COMMIT "unknown"
#endif

namespace {

// A JSON string literal; the values are CMake strings, so quotes and backslashes are escaped and
// control characters dropped.
std::string json_string(const std::string& value) {
  std::string out = "\"";
  for (char c : value) {
    if (c == '"' || c == '\\') out += '\\';
    if (static_cast<unsigned char>(c) >= 0x20) out += c;
  }
  return out + "\"";
}

// "80,90a" -> ["80", "90a"]
std::string json_string_list(const std::string& comma_separated) {
  std::string out = "[";
  size_t start = 0;
  while (start < comma_separated.size()) {
    size_t end = comma_separated.find(',', start);
    if (end == std::string::npos) end = comma_separated.size();
    if (end > start) {
      if (out.size() > 1) out += ", ";
      out += json_string(comma_separated.substr(start, end - start));
    }
    start = end + 1;
  }
  return out + "]";
}

std::string make_build_info() {
  return "{\"version\": " + json_string(FLASHCUTE_BUILD_VERSION) +
         ", \"cuda_version\": " + json_string(FLASHCUTE_BUILD_CUDA_VERSION) +
         ", \"cuda_archs\": " + json_string_list(FLASHCUTE_BUILD_CUDA_ARCHS) +
         ", \"tile_set\": " + json_string(FLASHCUTE_BUILD_TILE_SET) +
         ", \"git_commit\": " + json_string(FLASHCUTE_BUILD_GIT_COMMIT) + "}";
}

}  // namespace

extern "C" const char* fc_build_info(void) {
  static const std::string info = make_build_info();
  return info.c_str();
}
