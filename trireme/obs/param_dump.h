// A raw dump of named parameters, for parity checks across layouts (read back by
// tests/integration/common.py read_params). Per parameter, little-endian:
//   u32 name length, name bytes, u64 element count, float32 values
#pragma once

#include <ATen/ATen.h>

#include <string>
#include <utility>
#include <vector>

namespace trireme::obs {

// The dump's bytes (written with obs::write_text_file, in one piece); dumps of disjoint
// parameter sets concatenate into one dump.
std::string parameter_dump_bytes(const std::vector<std::pair<std::string, at::Tensor>>& parameters);

}  // namespace trireme::obs
