#include "bench/arrival.h"

#include <cmath>
#include <random>

namespace pagellm::bench {

Result<ArrivalKind> parse_arrival_kind(std::string_view name) {
  if (name == "poisson") return ArrivalKind::kPoisson;
  if (name == "gamma") return ArrivalKind::kGamma;
  if (name == "mix") return ArrivalKind::kMix;
  if (name == "constant") return ArrivalKind::kConstant;
  return invalid_argument("--arrival: '" + std::string(name) + "' is not poisson|gamma|mix|constant");
}

const char* arrival_kind_name(ArrivalKind kind) {
  switch (kind) {
    case ArrivalKind::kPoisson: return "poisson";
    case ArrivalKind::kGamma: return "gamma";
    case ArrivalKind::kMix: return "mix";
    case ArrivalKind::kConstant: return "constant";
  }
  return "?";
}

Result<std::vector<double>> arrival_times(const ArrivalOptions& o, int64_t n) {
  if (n < 0) return invalid_argument("number of requests must be >= 0");
  if (!(o.rate > 0)) return invalid_argument("--request-rate must be > 0 or inf");
  std::vector<double> t(static_cast<size_t>(n), 0.0);
  if (std::isinf(o.rate)) return t;
  if (o.kind == ArrivalKind::kGamma && !(o.burstiness > 0 && std::isfinite(o.burstiness)))
    return invalid_argument("--burstiness must be a positive number");
  if (o.kind == ArrivalKind::kMix &&
      (!(o.pareto_alpha > 1) || !(o.heavy_fraction >= 0 && o.heavy_fraction <= 1)))
    return invalid_argument("mix arrivals need pareto alpha > 1 and a heavy fraction in [0, 1]");
  std::mt19937_64 rng(o.seed);
  const double mean_gap = 1.0 / o.rate;
  std::exponential_distribution<double> expo(o.rate);
  // Gamma(shape k, scale theta) has mean k * theta: theta = mean_gap / k keeps the rate.
  const double k = o.kind == ArrivalKind::kGamma ? o.burstiness : 1.0;
  std::gamma_distribution<double> gamma(k, mean_gap / k);
  // Pareto(x_m, alpha) has mean alpha * x_m / (alpha - 1): pick x_m to keep the rate.
  const double x_m = mean_gap * (o.pareto_alpha - 1.0) / o.pareto_alpha;
  std::uniform_real_distribution<double> unif(0.0, 1.0);
  double now = 0;
  for (int64_t i = 0; i < n; ++i) {
    double gap = mean_gap;
    switch (o.kind) {
      case ArrivalKind::kPoisson: gap = expo(rng); break;
      case ArrivalKind::kGamma: gap = gamma(rng); break;
      case ArrivalKind::kConstant: gap = mean_gap; break;
      case ArrivalKind::kMix:
        if (unif(rng) < o.heavy_fraction) {
          // Inverse CDF; 1 - u lies in (0, 1], so the power is finite.
          gap = x_m / std::pow(1.0 - unif(rng), 1.0 / o.pareto_alpha);
        } else {
          gap = expo(rng);
        }
        break;
    }
    now += gap;
    t[static_cast<size_t>(i)] = now;
  }
  return t;
}

}  // namespace pagellm::bench
