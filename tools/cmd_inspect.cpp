// pagellm inspect --model PATH [--tensors]: the parsed config of a checkpoint (a Hugging Face
// folder or a .gguf file), its tensor and parameter counts and its bytes per dtype. Reads headers
// only; the weights stay mapped and untouched.
#include <cstdio>
#include <map>
#include <string>

#include "io/model_config.h"
#include "io/weights.h"
#include "tools/args.h"

namespace pagellm::cli {
namespace {

// 8030261248 -> "8,030,261,248"
std::string grouped(int64_t v) {
  std::string digits = std::to_string(v);
  std::string out;
  const int n = static_cast<int>(digits.size());
  for (int i = 0; i < n; ++i) {
    if (i > 0 && (n - i) % 3 == 0 && digits[i - 1] != '-') out += ',';
    out += digits[i];
  }
  return out;
}

std::string human_bytes(int64_t b) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  double v = static_cast<double>(b);
  int u = 0;
  while (v >= 1024.0 && u < 4) {
    v /= 1024.0;
    ++u;
  }
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.2f %s", v, units[u]);
  return buf;
}

std::string human_count(int64_t n) {
  char buf[32];
  if (n >= 1000000000) {
    std::snprintf(buf, sizeof buf, "%.2f B", n / 1e9);
  } else if (n >= 1000000) {
    std::snprintf(buf, sizeof buf, "%.2f M", n / 1e6);
  } else if (n >= 1000) {
    std::snprintf(buf, sizeof buf, "%.2f K", n / 1e3);
  } else {
    std::snprintf(buf, sizeof buf, "%lld", static_cast<long long>(n));
  }
  return buf;
}

std::string shape_str(const std::vector<int64_t>& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

int fail(const Status& st) {
  std::fprintf(stderr, "pagellm: %s\n", st.to_string().c_str());
  return 1;
}

}  // namespace

int run_inspect(int argc, char** argv) {
  Args args("inspect",
            "Prints a checkpoint's parsed config, parameter count and bytes by dtype.\n"
            "  pagellm inspect --model PATH [--tensors]     (or pagellm inspect PATH)",
            {{"Input",
              {{"model", "PATH",
                "a Hugging Face model folder (config.json + *.safetensors) or a .gguf file"},
               {"tensors", "", "also list every tensor: name, dtype, shape"}}}});
  if (auto rc = parse_command_line(args, argc, argv)) return *rc;
  std::optional<std::string> model = args.get("model");
  const std::vector<std::string>& pos = args.positionals();
  if (!model && pos.size() == 1) {
    model = pos[0];  // `pagellm inspect PATH` works too
  } else if (!pos.empty()) {
    return fail(invalid_argument("inspect: unexpected argument '" + pos[0] + "'"));
  }
  if (!model)
    return fail(
        invalid_argument("inspect: expected --model PATH (a model folder or a .gguf file)"));

  Result<LoadedCheckpoint> ckpt = open_checkpoint(*model);
  if (!ckpt.ok()) return fail(ckpt.status());
  const WeightSource& w = *ckpt->weights;

  struct PerType {
    int64_t tensors = 0;
    int64_t params = 0;
    int64_t bytes = 0;
  };
  std::map<std::string, PerType> by_dtype;
  int64_t params = 0, bytes = 0;
  for (const TensorInfo& t : w.tensors()) {
    int64_t n = 1;
    for (int64_t d : t.shape) n *= d;  // validated by the reader: no overflow
    PerType& p = by_dtype[std::string(dtype_name(t.dtype))];
    p.tensors += 1;
    p.params += n;
    p.bytes += t.nbytes;
    params += n;
    bytes += t.nbytes;
  }

  std::printf("%s", describe(ckpt->config).c_str());
  if (w.description() != ckpt->config.source) {
    std::printf("%-24s%s\n", "weights", w.description().c_str());
  }
  std::printf("%-24s%s\n", "tensors", grouped(static_cast<int64_t>(w.tensors().size())).c_str());
  std::printf("%-24s%s (%s)\n", "parameters", grouped(params).c_str(), human_count(params).c_str());
  std::printf("%-24s%s (%s)\n", "bytes", grouped(bytes).c_str(), human_bytes(bytes).c_str());
  for (const auto& [name, p] : by_dtype) {
    std::printf("  %-22s%s bytes (%s), %s parameters in %s tensors\n", name.c_str(),
                grouped(p.bytes).c_str(), human_bytes(p.bytes).c_str(), grouped(p.params).c_str(),
                grouped(p.tensors).c_str());
  }
  if (args.flag("tensors")) {
    for (const TensorInfo& t : w.tensors()) {
      std::printf("  %-60s %-5s %s\n", t.name.c_str(), std::string(dtype_name(t.dtype)).c_str(),
                  shape_str(t.shape).c_str());
    }
  }
  return 0;
}

}  // namespace pagellm::cli
