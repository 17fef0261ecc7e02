// Live and peak bytes of CPU tensor memory in this process, counted by wrapping
// libtorch's CPU allocator (every CPU tensor's storage comes from it).
//
// install() puts the counting allocator in front of the current one; storages allocated
// before that are not counted, when allocated or freed. A step's peak activation memory
// is then read as: reset_peak() at the start of the step, peak_bytes() minus the bytes
// live at the start (and minus the gradients' bytes, which the step also allocates) at
// the end. Thread-safe (atomic counters). CUDA memory is not covered (use the caching
// allocator's statistics there).
#pragma once

#include <cstdint>

namespace trireme::obs {

class CpuMemory {
 public:
  // Idempotent. Not reversible: storages allocated while installed must be freed through it.
  static void install();
  static bool installed();
  static int64_t current_bytes();
  static int64_t peak_bytes();
  // Peak := current.
  static void reset_peak();
};

}  // namespace trireme::obs
