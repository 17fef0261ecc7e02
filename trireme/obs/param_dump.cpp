#include "trireme/obs/param_dump.h"

namespace trireme::obs {

std::string parameter_dump_bytes(const std::vector<std::pair<std::string, at::Tensor>>& parameters) {
  std::string out;
  auto put = [&out](const void* data, size_t n) { out.append(static_cast<const char*>(data), n); };
  for (const auto& [name, tensor] : parameters) {
    const at::Tensor values = tensor.detach().to(at::kFloat).cpu().contiguous();
    const uint32_t name_len = static_cast<uint32_t>(name.size());
    const uint64_t count = static_cast<uint64_t>(values.numel());
    put(&name_len, sizeof(name_len));
    put(name.data(), name_len);
    put(&count, sizeof(count));
    put(values.data_ptr<float>(), count * sizeof(float));
  }
  return out;
}

}  // namespace trireme::obs
