#include "bench/workload.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

namespace pagellm::bench {

int64_t LengthDist::sample(std::mt19937_64& rng) const {
  double x = static_cast<double>(length);
  switch (kind) {
    case Kind::kFixed: return length;
    case Kind::kUniform: return std::uniform_int_distribution<int64_t>(lo, hi)(rng);
    case Kind::kLogNormal: {
      // mean of lognormal(mu, s) = exp(mu + s^2 / 2): choose mu so the mean is `length`.
      const double mu = std::log(static_cast<double>(length)) - param * param / 2;
      x = std::lognormal_distribution<double>(mu, param)(rng);
      break;
    }
    case Kind::kPareto: {
      const double x_m = static_cast<double>(length) * (param - 1) / param;
      const double u = std::uniform_real_distribution<double>(0.0, 1.0)(rng);
      x = x_m / std::pow(1.0 - u, 1.0 / param);
      break;
    }
  }
  const double cap = 16.0 * static_cast<double>(length);
  return static_cast<int64_t>(std::llround(std::clamp(x, 1.0, cap)));
}

Result<LengthDist> parse_length_dist(std::string_view spec, int64_t length, const std::string& option) {
  if (length < 1) return invalid_argument(option + ": the length must be >= 1");
  LengthDist d;
  d.length = length;
  const std::string s(spec);
  const size_t colon = s.find(':');
  const std::string kind = s.substr(0, colon), arg = colon == std::string::npos ? "" : s.substr(colon + 1);
  auto number = [&](const std::string& t, double& out) {
    char* e = nullptr;
    out = std::strtod(t.c_str(), &e);
    return !t.empty() && *e == 0 && std::isfinite(out);
  };
  if (kind == "fixed" && arg.empty()) return d;
  if (kind == "uniform") {
    const size_t comma = arg.find(',');
    double lo = 0, hi = 0;
    if (comma == std::string::npos || !number(arg.substr(0, comma), lo) || !number(arg.substr(comma + 1), hi) ||
        lo < 1 || hi < lo || lo != std::floor(lo) || hi != std::floor(hi))
      return invalid_argument(option + ": '" + s + "' must be uniform:LO,HI with integers 1 <= LO <= HI");
    d.kind = LengthDist::Kind::kUniform;
    d.lo = static_cast<int64_t>(lo);
    d.hi = static_cast<int64_t>(hi);
    return d;
  }
  if (kind == "lognormal") {
    if (!number(arg, d.param) || !(d.param > 0))
      return invalid_argument(option + ": '" + s + "' must be lognormal:SIGMA with SIGMA > 0");
    d.kind = LengthDist::Kind::kLogNormal;
    return d;
  }
  if (kind == "pareto") {
    if (!number(arg, d.param) || !(d.param > 1))
      return invalid_argument(option + ": '" + s + "' must be pareto:ALPHA with ALPHA > 1");
    d.kind = LengthDist::Kind::kPareto;
    return d;
  }
  return invalid_argument(option + ": '" + s + "' is not fixed|uniform:LO,HI|lognormal:SIGMA|pareto:ALPHA");
}

namespace {

std::vector<int32_t> random_ids(std::mt19937_64& rng, int64_t n, int64_t vocab) {
  std::uniform_int_distribution<int32_t> d(kFirstRandomId, static_cast<int32_t>(vocab - 1));
  std::vector<int32_t> ids(static_cast<size_t>(n));
  for (auto& x : ids) x = d(rng);
  return ids;
}

Status check_random(const RandomWorkloadOptions& o) {
  if (o.n < 1) return invalid_argument("--num-prompts must be >= 1");
  if (o.vocab_size <= kFirstRandomId + 1)
    return invalid_argument("--random-vocab-size must be > " + std::to_string(kFirstRandomId + 1));
  return {};
}

Result<std::string> read_file(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) return not_found(path + ": cannot open the dataset");
  std::ostringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

}  // namespace

Result<std::vector<BenchRequest>> random_workload(const RandomWorkloadOptions& o) {
  PAGELLM_RETURN_IF_ERROR(check_random(o));
  std::mt19937_64 rng(o.seed);
  std::vector<BenchRequest> reqs(static_cast<size_t>(o.n));
  for (BenchRequest& r : reqs) {
    const int64_t in = o.input.sample(rng);
    r.max_tokens = o.output.sample(rng);
    r.prompt_ids = random_ids(rng, in, o.vocab_size);
    r.prompt_len = in;
  }
  return reqs;
}

Result<std::vector<BenchRequest>> shared_prefix_workload(const SharedPrefixOptions& o) {
  PAGELLM_RETURN_IF_ERROR(check_random(o.base));
  if (o.n_prefixes < 1 || o.prefix_len < 1)
    return invalid_argument("--num-prefixes and --prefix-len must be >= 1");
  std::mt19937_64 rng(o.base.seed);
  std::vector<std::vector<int32_t>> prefixes;
  for (int64_t p = 0; p < o.n_prefixes; ++p) prefixes.push_back(random_ids(rng, o.prefix_len, o.base.vocab_size));
  std::vector<BenchRequest> reqs(static_cast<size_t>(o.base.n));
  for (size_t i = 0; i < reqs.size(); ++i) {
    BenchRequest& r = reqs[i];
    const int64_t suffix = o.base.input.sample(rng);
    r.max_tokens = o.base.output.sample(rng);
    r.prompt_ids = prefixes[i % prefixes.size()];
    const auto tail = random_ids(rng, suffix, o.base.vocab_size);
    r.prompt_ids.insert(r.prompt_ids.end(), tail.begin(), tail.end());
    r.prompt_len = static_cast<int64_t>(r.prompt_ids.size());
  }
  return reqs;
}

int64_t estimate_tokens(std::string_view text) {
  return std::max<int64_t>(1, static_cast<int64_t>((text.size() + 3) / 4));
}

Result<std::vector<BenchRequest>> sharegpt_workload(const std::string& path, int64_t n,
                                                    int64_t fixed_output_len, uint64_t seed,
                                                    const TokenCounter& count_tokens, int64_t first,
                                                    int64_t* pool_size) {
  if (n < 1) return invalid_argument("--num-prompts must be >= 1");
  if (first < 0) return invalid_argument("sharegpt_workload: first must be >= 0");
  auto text = read_file(path);
  if (!text.ok()) return text.status();
  nlohmann::json j = nlohmann::json::parse(*text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return data_loss(path + ": not valid JSON");
  if (!j.is_array()) return data_loss(path + ": a ShareGPT file is a JSON array of conversations");
  std::vector<BenchRequest> pool;
  for (const auto& item : j) {
    if (!item.is_object() || !item.contains("conversations")) continue;
    const auto& c = item["conversations"];
    if (!c.is_array() || c.size() < 2) continue;
    if (!c[0].is_object() || !c[1].is_object()) continue;
    const auto p = c[0].find("value"), r = c[1].find("value");
    if (p == c[0].end() || r == c[1].end() || !p->is_string() || !r->is_string()) continue;
    BenchRequest req;
    req.prompt_text = p->get<std::string>();
    if (req.prompt_text.empty()) continue;
    req.prompt_len = count_tokens(req.prompt_text);
    req.max_tokens = fixed_output_len > 0 ? fixed_output_len : std::max<int64_t>(1, count_tokens(r->get<std::string>()));
    pool.push_back(std::move(req));
  }
  if (pool.empty()) return data_loss(path + ": no conversation with a human turn and a gpt turn");
  std::mt19937_64 rng(seed);
  std::shuffle(pool.begin(), pool.end(), rng);
  if (pool_size) *pool_size = static_cast<int64_t>(pool.size());
  std::vector<BenchRequest> out;
  for (int64_t i = 0; i < n; ++i) out.push_back(pool[static_cast<size_t>(first + i) % pool.size()]);
  return out;
}

Result<std::vector<BenchRequest>> jsonl_workload(const std::string& path, int64_t n,
                                                 int64_t default_max_tokens,
                                                 const TokenCounter& count_tokens, int64_t first,
                                                 int64_t* pool_size) {
  if (n < 1) return invalid_argument("--num-prompts must be >= 1");
  if (first < 0) return invalid_argument("jsonl_workload: first must be >= 0");
  std::ifstream f(path);
  if (!f) return not_found(path + ": cannot open the dataset");
  std::vector<BenchRequest> pool;
  std::string line;
  for (int64_t lineno = 1; std::getline(f, line); ++lineno) {
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    const std::string where = path + ":" + std::to_string(lineno);
    nlohmann::json j = nlohmann::json::parse(line, nullptr, false);
    if (j.is_discarded() || !j.is_object()) return data_loss(where + ": not a JSON object");
    BenchRequest r;
    const auto p = j.find("prompt");
    if (p == j.end()) return data_loss(where + ": missing 'prompt'");
    if (p->is_string()) {
      r.prompt_text = p->get<std::string>();
      r.prompt_len = count_tokens(r.prompt_text);
    } else if (p->is_array() && !p->empty()) {
      for (const auto& t : *p) {
        if (!t.is_number_integer() || t.get<int64_t>() < 0 || t.get<int64_t>() > INT32_MAX)
          return data_loss(where + ": 'prompt' token ids must be non-negative integers");
        r.prompt_ids.push_back(t.get<int32_t>());
      }
      r.prompt_len = static_cast<int64_t>(r.prompt_ids.size());
    } else {
      return data_loss(where + ": 'prompt' must be a string or a non-empty array of token ids");
    }
    r.max_tokens = default_max_tokens;
    if (const auto m = j.find("max_tokens"); m != j.end()) {
      if (!m->is_number_integer() || m->get<int64_t>() < 1) return data_loss(where + ": 'max_tokens' must be an integer >= 1");
      r.max_tokens = m->get<int64_t>();
    }
    pool.push_back(std::move(r));
  }
  if (pool.empty()) return data_loss(path + ": no requests");
  if (pool_size) *pool_size = static_cast<int64_t>(pool.size());
  std::vector<BenchRequest> out;
  for (int64_t i = 0; i < n; ++i) out.push_back(pool[static_cast<size_t>(first + i) % pool.size()]);
  return out;
}

uint64_t run_workload_seed(uint64_t base_seed, int64_t run_index) {
  if (run_index == 0) return base_seed;
  // splitmix64 of the pair: nearby (seed, index) pairs give unrelated mt19937_64 streams.
  uint64_t z = base_seed + 0x9e3779b97f4a7c15ull * static_cast<uint64_t>(run_index + 1);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

Result<Workload> make_workload(const WorkloadSpec& spec, int64_t run_index) {
  if (run_index < 0) return invalid_argument("make_workload: run_index must be >= 0");
  Workload w;
  const int64_t n = spec.random.n;
  if (spec.dataset == "random" || spec.dataset == "shared-prefix") {
    RandomWorkloadOptions o = spec.random;
    o.seed = w.seed = run_workload_seed(spec.random.seed, run_index);
    auto reqs = spec.dataset == "random" ? random_workload(o)
                                         : shared_prefix_workload({o, spec.n_prefixes, spec.prefix_len});
    if (!reqs.ok()) return reqs.status();
    w.requests = std::move(*reqs);
    return w;
  }
  if (spec.dataset == "sharegpt" || spec.dataset == "jsonl") {
    if (spec.path.empty()) return invalid_argument("--dataset-name " + spec.dataset + " needs --dataset-path");
    // One shuffle (ShareGPT) for every run, and consecutive windows of it: distinct entries for
    // as many runs as the file holds.
    w.seed = spec.random.seed;
    w.first = run_index * n;
    auto reqs = spec.dataset == "sharegpt"
                    ? sharegpt_workload(spec.path, n, spec.fixed_output_len, w.seed, spec.count_tokens, w.first,
                                        &w.pool_size)
                    : jsonl_workload(spec.path, n, spec.default_max_tokens, spec.count_tokens, w.first, &w.pool_size);
    if (!reqs.ok()) return reqs.status();
    w.requests = std::move(*reqs);
    w.reuses_entries = (run_index + 1) * n > w.pool_size;
    if (w.pool_size > 0) w.first %= w.pool_size;
    return w;
  }
  return invalid_argument("--dataset-name '" + spec.dataset + "' is not random|sharegpt|jsonl|shared-prefix");
}

}  // namespace pagellm::bench
