#include "sample/rejection_sampler.h"

#include <algorithm>
#include <vector>

namespace pagellm {

double probability_of(std::span<const TokenProb> dist, int32_t token) {
  auto it = std::lower_bound(dist.begin(), dist.end(), token,
                             [](const TokenProb& tp, int32_t t) { return tp.token < t; });
  return it != dist.end() && it->token == token ? it->prob : 0.0;
}

int32_t draw_from(std::span<const TokenProb> dist, double u) {
  if (dist.empty()) return -1;
  double total = 0.0;
  for (const TokenProb& tp : dist) total += tp.prob;
  const double target = u * total;
  double acc = 0.0;
  for (const TokenProb& tp : dist) {
    acc += tp.prob;
    if (acc > target) return tp.token;
  }
  return dist.back().token;
}

bool keep_guess(std::span<const TokenProb> p, std::span<const TokenProb> q, int32_t guess,
                double u) {
  const double pg = probability_of(p, guess), qg = probability_of(q, guess);
  if (pg <= 0.0) return false;
  if (qg <= 0.0 || pg >= qg) return true;  // q never draws a token it gives no mass (defensive)
  return u < pg / qg;
}

int32_t draw_residual(std::span<const TokenProb> p, std::span<const TokenProb> q, double u) {
  // p's support only: max(0, p - q) is zero wherever p is.
  thread_local std::vector<TokenProb> residual;
  residual.clear();
  size_t j = 0;
  for (const TokenProb& tp : p) {
    while (j < q.size() && q[j].token < tp.token) ++j;
    const double qt = j < q.size() && q[j].token == tp.token ? q[j].prob : 0.0;
    if (tp.prob > qt) residual.push_back({tp.token, tp.prob - qt});
  }
  return residual.empty() ? draw_from(p, u) : draw_from(residual, u);
}

}  // namespace pagellm
