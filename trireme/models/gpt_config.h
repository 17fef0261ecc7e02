// Shape of the reference GPT, and what follows from it without building the model.
//
// Pure C++ (no libtorch) so the planner and the CLI can size a model cheaply. The field
// names map to the CLI flags --vocab --seq --layers --dim --heads --mlp-ratio --dropout
// (the last of `trireme train gpt` only).
#pragma once

#include <cstdint>
#include <string>

namespace trireme::models {

struct GptConfig {
  int64_t vocab = 256;    // byte-level tokenizer
  int64_t seq_len = 128;  // context length T
  int64_t layers = 4;     // transformer blocks L
  int64_t dim = 128;      // model width C
  int64_t heads = 4;      // attention heads; head size = dim / heads
  int64_t mlp_ratio = 4;  // MLP hidden width = mlp_ratio * dim
  double dropout = 0.0;   // on attention probabilities and residual branches

  // Throws InvalidArgument with one line naming the flag, e.g.
  // "--dim 130 is not divisible by --heads 4; choose a dim that is a multiple of heads".
  void validate() const;

  // Closed-form parameter count of GptImpl for this config:
  //   V*C + T*C                                   wte, wpe
  //   + L * (2C + 3C*C + 3C + C*C + C             ln_1, attn.qkv, attn.proj
  //          + 2C + R*C*C + R*C + R*C*C + C)      ln_2, mlp.fc, mlp.proj   (R = mlp_ratio)
  //   + 2C + C*V                                  ln_f, head (no bias, not tied)
  int64_t num_parameters() const;
  // The flags that give this shape, e.g. "--vocab 256 --seq 128 --layers 4 --dim 128
  // --heads 4 --mlp-ratio 4" (checkpoints record it; dropout is not part of the shape).
  std::string flags() const;
};

}  // namespace trireme::models
