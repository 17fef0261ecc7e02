// Backend selection and the NCCL plugin loader; see dist/backend.h.
#include "trireme/dist/backend.h"

#include <ATen/Context.h>
#include <dlfcn.h>

#include <mutex>

#include "trireme/common/error.h"

namespace trireme::dist {

std::string error_text(const std::exception& error) {
  if (const auto* c10_error = dynamic_cast<const c10::Error*>(&error))
    return c10_error->what_without_backtrace();
  return error.what();
}

void wait_work(const c10::intrusive_ptr<c10d::Work>& work, const char* what) {
  try {
    work->wait();
  } catch (const std::exception& e) {
    TRIREME_THROW(CommError, what, " failed: ", error_text(e));
  }
}

void run_collective(const char* what,
                    const std::function<c10::intrusive_ptr<c10d::Work>()>& issue) {
  c10::intrusive_ptr<c10d::Work> work;
  try {
    work = issue();
  } catch (const std::exception& e) {
    TRIREME_THROW(CommError, what, " could not be issued: ", error_text(e));
  }
  wait_work(work, what);
}

at::Tensor all_reduce(const Group& group, const at::Tensor& values, c10d::ReduceOp::RedOpType op,
                      at::Device device, const char* what) {
  std::vector<at::Tensor> buffer{values.to(device)};
  if (group->getSize() == 1) return buffer[0];
  c10d::AllreduceOptions options;
  options.reduceOp = op;
  run_collective(what, [&] { return group->allreduce(buffer, options); });
  return buffer[0];
}

BackendKind parse_backend(const std::string& name) {
  if (name == "gloo") return BackendKind::kGloo;
  if (name == "nccl") return BackendKind::kNccl;
  TRIREME_THROW(InvalidArgument, "unknown backend '", name, "'; use gloo (CPU) or nccl (CUDA)");
}

const char* backend_name(BackendKind kind) { return kind == BackendKind::kNccl ? "nccl" : "gloo"; }

Group create_group(const Store& store, int rank, int size, const GroupOptions& options) {
  return options.backend == BackendKind::kNccl ? create_nccl_group(store, rank, size, options)
                                               : create_gloo_group(store, rank, size, options);
}

namespace {

// Loads libtrireme_nccl.so once per process (it stays loaded) and returns its factory, or
// nullptr with the reason in *error.
NcclFactory nccl_factory(std::string* error) {
  static std::once_flag once;
  static NcclFactory factory = nullptr;
  static std::string load_error;
  std::call_once(once, [] {
    // Look next to libtrireme first, then on the loader's path.
    std::string path = "libtrireme_nccl.so";
    Dl_info self{};
    if (::dladdr(reinterpret_cast<void*>(&create_nccl_group), &self) && self.dli_fname) {
      const std::string dir = self.dli_fname;
      path = dir.substr(0, dir.rfind('/') + 1) + path;
    }
    void* handle = ::dlopen(path.c_str(), RTLD_NOW | RTLD_GLOBAL);
    if (!handle) {
      // Keep the first reason: a plugin that exists but cannot load (a missing CUDA
      // library) says more than "not found" from the fallback search.
      load_error = ::dlerror();
      handle = ::dlopen("libtrireme_nccl.so", RTLD_NOW | RTLD_GLOBAL);
      if (!handle) return;
    }
    factory = reinterpret_cast<NcclFactory>(::dlsym(handle, "trireme_create_nccl_group"));
    if (!factory) load_error = "libtrireme_nccl.so lacks trireme_create_nccl_group";
  });
  *error = load_error;
  return factory;
}

}  // namespace

Group create_nccl_group(const Store& store, int rank, int size, const GroupOptions& options) {
  std::string error;
  const NcclFactory factory = nccl_factory(&error);
  TRIREME_CHECK(factory, "the NCCL backend is not available (", error,
                "); build Trireme where CUDA and a CUDA libtorch are present, or use gloo");
  return factory(store, rank, size, options);
}

void require_cuda_devices(int count) {
  std::string error;
  TRIREME_CHECK(nccl_factory(&error), "--device cuda: the CUDA/NCCL backend is not available (",
                error, "); use --device cpu");
  const size_t visible = at::hasCUDA() ? at::getNumGPUs() : 0;
  TRIREME_CHECK(visible >= static_cast<size_t>(count), "--device cuda: ", count,
                " local ranks need ", count, " GPUs but CUDA sees ", visible,
                "; use --device cpu or fewer --nproc-per-node");
}

}  // namespace trireme::dist
