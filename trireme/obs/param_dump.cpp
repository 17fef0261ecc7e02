#include "trireme/obs/param_dump.h"

#include <fstream>

#include "trireme/common/error.h"

namespace trireme::obs {

void write_parameter_dump(const std::string& path,
                          const std::vector<std::pair<std::string, at::Tensor>>& parameters) {
  std::ofstream out(path, std::ios::binary);
  TRIREME_CHECK(out.good(), "cannot write the parameter dump ", path, "; choose a writable path");
  for (const auto& [name, tensor] : parameters) {
    const at::Tensor values = tensor.detach().to(at::kFloat).contiguous();
    const uint32_t name_len = static_cast<uint32_t>(name.size());
    const uint64_t count = static_cast<uint64_t>(values.numel());
    out.write(reinterpret_cast<const char*>(&name_len), sizeof(name_len));
    out.write(name.data(), name_len);
    out.write(reinterpret_cast<const char*>(&count), sizeof(count));
    out.write(reinterpret_cast<const char*>(values.data_ptr<float>()), count * sizeof(float));
  }
  TRIREME_CHECK(out.good(), "failed writing the parameter dump ", path);
}

}  // namespace trireme::obs
