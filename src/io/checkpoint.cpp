// open_checkpoint: decides the format from what the path holds and hands over to its opener.
#include <filesystem>
#include <string>
#include <vector>

#include "io/weights.h"

namespace pagellm {
namespace {

namespace fs = std::filesystem;

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() &&
         s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

}  // namespace

Result<LoadedCheckpoint> open_checkpoint(const std::string& path) {
  std::error_code ec;
  const fs::file_status st = fs::status(path, ec);
  if (ec || !fs::exists(st)) return not_found(path + ": no such file or directory");

  if (!fs::is_directory(st)) {
    if (ends_with(path, ".gguf")) return open_gguf_checkpoint(path);
    if (ends_with(path, ".safetensors")) {
      // The weights alone are not enough: config.json lives next to them.
      return invalid_argument(path +
                              ": pass the model folder that holds this file and its config.json");
    }
    return invalid_argument(path + ": not a model folder or a .gguf file");
  }

  std::vector<std::string> ggufs;
  bool has_safetensors = false;
  for (const fs::directory_entry& e : fs::directory_iterator(path, ec)) {
    const std::string name = e.path().filename().string();
    if (ends_with(name, ".safetensors") || name == "model.safetensors.index.json")
      has_safetensors = true;
    if (ends_with(name, ".gguf") && e.is_regular_file(ec)) ggufs.push_back(e.path().string());
  }
  if (ec) return invalid_argument(path + ": cannot list the folder: " + ec.message());
  // Safetensors first: a folder with both is a Hugging Face repo that also ships a GGUF export.
  if (has_safetensors) return open_safetensors_checkpoint(path);
  if (ggufs.size() == 1) return open_gguf_checkpoint(ggufs[0]);
  if (ggufs.size() > 1) {
    return invalid_argument(path + ": holds " + std::to_string(ggufs.size()) +
                            " .gguf files; pass the one to load");
  }
  return not_found(path + ": no model.safetensors, model.safetensors.index.json or .gguf file");
}

}  // namespace pagellm
