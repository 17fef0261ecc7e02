// GptConfig checks and closed-form size; see gpt_config.h.
#include "trireme/models/gpt_config.h"

#include "trireme/common/error.h"

namespace trireme::models {
namespace {

// The most parameters a config may have: a thousand times today's largest models, and
// small enough that counts of bytes (weights, gradients, AdamW state) stay far inside
// int64. A mistyped size beyond it would overflow num_parameters() and the planner's sums.
constexpr long double kMaxParameters = 1e15L;

// num_parameters()'s formula in any arithmetic type (long double: no overflow to check).
template <typename Number>
Number count_parameters(const GptConfig& c) {
  const Number C = c.dim, V = c.vocab, T = c.seq_len, R = c.mlp_ratio, L = c.layers;
  const Number block = 2 * C + (3 * C * C + 3 * C) + (C * C + C) + 2 * C + (R * C * C + R * C) +
                       (R * C * C + C);
  return V * C + T * C + L * block + 2 * C + C * V;
}

}  // namespace

void GptConfig::validate() const {
  TRIREME_CHECK(vocab >= 1, "--vocab must be positive, got ", vocab);
  TRIREME_CHECK(seq_len >= 1, "--seq must be positive, got ", seq_len);
  TRIREME_CHECK(layers >= 1, "--layers must be positive, got ", layers);
  TRIREME_CHECK(dim >= 1, "--dim must be positive, got ", dim);
  TRIREME_CHECK(heads >= 1, "--heads must be positive, got ", heads);
  TRIREME_CHECK(dim % heads == 0, "--dim ", dim, " is not divisible by --heads ", heads,
                "; choose a dim that is a multiple of heads");
  TRIREME_CHECK(mlp_ratio >= 1, "--mlp-ratio must be positive, got ", mlp_ratio);
  TRIREME_CHECK(dropout >= 0.0 && dropout < 1.0, "--dropout ", dropout,
                " is outside [0, 1); choose a probability such as 0.1");
  const long double count = count_parameters<long double>(*this);
  TRIREME_CHECK(count <= kMaxParameters, "the model ", flags(), " has ", static_cast<double>(count),
                " parameters, more than the ", static_cast<double>(kMaxParameters),
                " Trireme can size; choose smaller sizes");
}

std::string GptConfig::flags() const {
  return "--vocab " + std::to_string(vocab) + " --seq " + std::to_string(seq_len) + " --layers " +
         std::to_string(layers) + " --dim " + std::to_string(dim) + " --heads " + std::to_string(heads) +
         " --mlp-ratio " + std::to_string(mlp_ratio);
}

int64_t GptConfig::num_parameters() const { return count_parameters<int64_t>(*this); }

}  // namespace trireme::models
