"""The glibc malloc settings `trireme run` gives its workers (launch/worker_env.h,
host_allocator_variables): freed tensor memory kept for reuse instead of being returned to
the kernel and faulted back in, zeroed, on the next step. The benchmarks give the Python
peers the same settings, so that a ratio compares the frameworks, not the allocators' settings."""

ALLOCATOR = {
    "MALLOC_MMAP_THRESHOLD_": "33554432",
    "MALLOC_TRIM_THRESHOLD_": "1073741824",
    "MALLOC_TOP_PAD_": "67108864",
}
