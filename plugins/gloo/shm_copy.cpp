// ShmGroup's copies between callers' buffers and the segment.
#include <dirent.h>
#include <fcntl.h>
#include <sched.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/uio.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <new>
#include <random>
#include <thread>
#include <vector>

#include "fingerprint.h"
#include "local_process.h"
#include "plugin_support.h"
#include "shm_internal.h"

namespace backplane::gloo_plugin {

#if defined(__SSE2__)
}  // namespace backplane::gloo_plugin
#include <emmintrin.h>
namespace backplane::gloo_plugin {
#endif

namespace shm_detail {

#if defined(__SSE2__)
// Copies a line (kLine bytes) at a time with 16-byte vector moves, ordinary or streaming stores, until
// less than a line is left; advances the pointers and `n` past what it copied.
template <bool streaming>
void copy_whole_lines(char*& dst, const char*& src, size_t& n) {
  for (; n >= kLine; n -= kLine, src += kLine, dst += kLine) {
    __m128i line[4];
    for (int i = 0; i < 4; ++i) line[i] = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + 16 * i));
    for (int i = 0; i < 4; ++i) {
      if constexpr (streaming) {
        _mm_stream_si128(reinterpret_cast<__m128i*>(dst + 16 * i), line[i]);
      } else {
        _mm_storeu_si128(reinterpret_cast<__m128i*>(dst + 16 * i), line[i]);
      }
    }
  }
}
#endif

// Whether this process runs on an AMD processor: its copies take other paths than on Intel (below).
static bool on_amd() {
#if defined(__SSE2__)
  static const bool amd = [] {
    __builtin_cpu_init();
    return __builtin_cpu_is("amd") != 0;
  }();
  return amd;
#else
  return false;
#endif
}

// Copies between a caller's buffer and the segment: memcpy, except on AMD, where glibc's `rep movsb`
// runs several times slower when source and destination lie a few bytes apart modulo 4096 (glibc bug
// 30994), the common case here (a malloc'd buffer 16 bytes into a page, a slot at a page's start); a
// loop of vector moves does not care. On Intel `rep movsb` is the faster
// (bench/results/design-choices.md#copies-on-amd-and-on-intel).
void copy_bytes(void* to, const void* from, size_t n) {
  if (n == 0) return;  // an empty block's buffer may be NULL, which memcpy may not be given
#if defined(__SSE2__)
  if (on_amd()) {  // avoid `rep movsb`
    auto* dst = static_cast<char*>(to);
    const auto* src = static_cast<const char*>(from);
    copy_whole_lines</*streaming=*/false>(dst, src, n);
    std::memcpy(dst, src, n);
    return;
  }
#endif
  std::memcpy(to, from, n);
}

// From this many bytes, copy_to_peers streams. Below it, one line's ordinary transfer costs less than
// draining a write-combining buffer (bench/results/design-choices.md#copies-on-amd-and-on-intel).
constexpr size_t kStreamingCopyBytes = 2048;

// Copies data into this rank's part of the segment, for its peers to read. On AMD, streaming stores: a
// peer that read the slot last time still holds its lines, which an ordinary store must take back from
// that peer's cache first, where a streaming store writes whole lines without reading them. On Intel,
// whose cores share one last-level cache, ordinary stores: the lines stay there for the peer to read,
// where streamed ones go out to memory and back (bench/results/design-choices.md#copies-on-amd-and-on-intel).
void copy_to_peers(void* to, const void* from, size_t n) {
  if (on_amd()) {
    copy_streaming(to, from, n);
  } else {
    copy_bytes(to, from, n);
  }
}

// An operation's output larger than the last-level cache (32 MiB on the machines measured) would only
// evict it: its lines are written once and not read back before they leave. An ordinary store first
// reads the line it writes; a streamed one does not, a third less memory traffic for a copy (or for a
// reduction's result: dtypes.h's Stores).
constexpr size_t kStreamingOutputBytes = size_t{32} << 20;

bool streams_output(size_t output_bytes) { return output_bytes > kStreamingOutputBytes; }

CopyFn output_copy(size_t output_bytes) { return streams_output(output_bytes) ? copy_streaming : copy_bytes; }

void copy_streaming(void* to, const void* from, size_t n) {
#if defined(__SSE2__)
  if (n >= kStreamingCopyBytes) {
    auto* dst = static_cast<char*>(to);
    const auto* src = static_cast<const char*>(from);
    const size_t head = (kLine - reinterpret_cast<std::uintptr_t>(dst) % kLine) % kLine;  // to a line's start
    copy_bytes(dst, src, head);
    dst += head, src += head, n -= head;
    copy_whole_lines</*streaming=*/true>(dst, src, n);  // dst is at a line's start: whole lines streamed
    copy_bytes(dst, src, n);
    _mm_sfence();  // streamed stores are weakly ordered: all of them land before the step is published
    return;
  }
#endif
  copy_bytes(to, from, n);
}

}  // namespace shm_detail

}  // namespace backplane::gloo_plugin
