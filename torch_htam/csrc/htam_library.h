// What the sources of our libraries (build.OUR_LIBRARIES: cutlass_conv.cu, cutlass_gemm.cu) share:
// the parts a build compiles them in, and a call's bytes as the key of their caches.
#pragma once
#include <cstddef>
#include <cstdint>
#include <cstring>

// A library build compiles its source once per part on as many cores, with HTAM_PART = 0 ..
// HTAM_PARTS - 1 (build.OurLibrary.parts): each part defines the kernels whose index modulo
// HTAM_PARTS is its own (HTAM_MINE), and part 0 also the entry points. Compiled whole (no
// HTAM_PART: a probe's nvcc), a source defines them all. A kernel's function is hidden: the parts
// link it within the library, nothing outside calls it.
#if defined(HTAM_PART) && defined(HTAM_PARTS)
#define HTAM_MINE(i) ((i) % HTAM_PARTS == HTAM_PART)
#define HTAM_ENTRY_PART (HTAM_PART == 0)
#else
#define HTAM_MINE(i) 1
#define HTAM_ENTRY_PART 1
#endif
#define HTAM_HIDDEN __attribute__((visibility("hidden")))

// Hash and equality of a call struct as its bytes (FNV-1a). NOTE: only for structs without
// padding (each library static_asserts its call's size), whose every byte is a field.
template <class Call>
struct BytesHash {
  size_t operator()(const Call& k) const {
    const unsigned char* p = reinterpret_cast<const unsigned char*>(&k);
    size_t h = 1469598103934665603ull;
    for (size_t i = 0; i < sizeof(Call); ++i) h = (h ^ p[i]) * 1099511628211ull;
    return h;
  }
};
template <class Call>
struct BytesEq {
  bool operator()(const Call& a, const Call& b) const { return std::memcmp(&a, &b, sizeof(Call)) == 0; }
};

// Whether p starts a 16-byte TMA row: every tensor the CUTLASS kernels load or store must.
static inline bool htam_aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

// A CUTLASS run's status as a call's return (htam_abi.h): 0, or 4000 + the cutlass::Status. NOTE: not
// cudaGetLastError() after a failed run: CUTLASS's run() has read, and so cleared, it already.
template <class Status>
static inline int htam_cutlass_rc(Status st) { return st == Status::kSuccess ? 0 : 4000 + static_cast<int>(st); }
