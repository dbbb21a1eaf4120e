// The host side of the SIMT emulation runtime (simt_emu.cpp), for the
// launcher in emu_kernels.cpp.
#pragma once

#include <cstddef>
#include <cstdint>

#include "simt_emu.h"

namespace emu {

// A region of the checked arena: `bytes` at an address == align_offset mod
// 4096, with unmapped gigabytes around it. Every global access of a kernel
// must fall inside one region (and inside a writable one for stores).
void* arena_alloc(const char* name, size_t bytes, size_t align_offset, bool writable);
void arena_reset();
void configure(bool scramble, uint64_t seed);
// Runs entry(closure) as every thread of every block of the grid with
// dynamic_smem bytes of dynamic shared memory (at most kMaxDynamicShared);
// false (and last_error()) on the first checked failure, deadlock or
// divergence.
constexpr size_t kMaxDynamicShared = 227 * 1024;  // the largest opt-in limit (sm_90, sm_100)
// As on a GPU, dynamic_smem past 48 KiB minus static_smem is refused unless
// the kernel's cudaFuncAttributeMaxDynamicSharedMemorySize (set by
// set_max_dynamic_shared; max_dynamic_shared: 0 when unset) is at least it.
bool launch(const char* kernel, void (*entry)(void*), void* closure, dim3 grid, dim3 block, size_t dynamic_smem,
            const void* fn = nullptr, size_t static_smem = 0);
void set_max_dynamic_shared(const void* fn, size_t bytes);
size_t max_dynamic_shared(const void* fn);
void reset_max_dynamic_shared();
const char* last_error();
uint64_t shared_size();
void stats(uint64_t out[7]);

}  // namespace emu
