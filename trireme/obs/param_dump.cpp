#include "trireme/obs/param_dump.h"

#include <fstream>

#include "trireme/common/error.h"

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

void write_parameter_dump(const std::string& path,
                          const std::vector<std::pair<std::string, at::Tensor>>& parameters) {
  std::ofstream out(path, std::ios::binary);
  TRIREME_CHECK(out.good(), "cannot write the parameter dump ", path, "; choose a writable path");
  const std::string bytes = parameter_dump_bytes(parameters);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  TRIREME_CHECK(out.good(), "failed writing the parameter dump ", path);
}

}  // namespace trireme::obs
