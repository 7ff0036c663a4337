#include <immintrin.h>
#include <sys/wait.h>
#include <unistd.h>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>
#include <algorithm>
static double now() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }
template <bool NT, int PF>
void copy_loop(char* d, const char* s, size_t n) {
  for (size_t i = 0; i < n; i += 64) {
    if (PF) _mm_prefetch(s + i + PF, _MM_HINT_T0);
    __m128i a = _mm_loadu_si128((const __m128i*)(s+i)), b = _mm_loadu_si128((const __m128i*)(s+i+16)),
            c = _mm_loadu_si128((const __m128i*)(s+i+32)), e = _mm_loadu_si128((const __m128i*)(s+i+48));
    if (NT) { _mm_stream_si128((__m128i*)(d+i), a); _mm_stream_si128((__m128i*)(d+i+16), b); _mm_stream_si128((__m128i*)(d+i+32), c); _mm_stream_si128((__m128i*)(d+i+48), e); }
    else { _mm_storeu_si128((__m128i*)(d+i), a); _mm_storeu_si128((__m128i*)(d+i+16), b); _mm_storeu_si128((__m128i*)(d+i+32), c); _mm_storeu_si128((__m128i*)(d+i+48), e); }
  }
  _mm_sfence();
}
// 4 pages interleaved, like glibc's large_memcpy_4x
template <bool NT>
void copy4(char* d, const char* s, size_t n) {
  const size_t P = 4096;
  for (size_t base = 0; base < n; base += 4 * P) {
    for (size_t off = 0; off < P; off += 64) {
      for (int k = 0; k < 4; ++k) {
        const char* sp = s + base + k * P + off; char* dp = d + base + k * P + off;
        _mm_prefetch(sp + 256, _MM_HINT_T0);
        __m128i a = _mm_loadu_si128((const __m128i*)(sp)), b = _mm_loadu_si128((const __m128i*)(sp+16)),
                c = _mm_loadu_si128((const __m128i*)(sp+32)), e = _mm_loadu_si128((const __m128i*)(sp+48));
        if (NT) { _mm_stream_si128((__m128i*)(dp), a); _mm_stream_si128((__m128i*)(dp+16), b); _mm_stream_si128((__m128i*)(dp+32), c); _mm_stream_si128((__m128i*)(dp+48), e); }
        else { _mm_storeu_si128((__m128i*)(dp), a); _mm_storeu_si128((__m128i*)(dp+16), b); _mm_storeu_si128((__m128i*)(dp+32), c); _mm_storeu_si128((__m128i*)(dp+48), e); }
      }
    }
  }
  _mm_sfence();
}
void sum_plain(float* o, const float* a, const float* b, size_t n) { for (size_t i = 0; i < n; ++i) o[i] = a[i] + b[i]; }
template <bool NT, int PF>
void sum_loop(float* o, const float* a, const float* b, size_t n) {
  for (size_t i = 0; i < n; i += 16) {
    if (PF) { _mm_prefetch((const char*)(a + i) + PF, _MM_HINT_T0); _mm_prefetch((const char*)(b + i) + PF, _MM_HINT_T0); }
    for (int k = 0; k < 16; k += 4) {
      __m128 x = _mm_add_ps(_mm_loadu_ps(a + i + k), _mm_loadu_ps(b + i + k));
      if (NT) _mm_stream_ps(o + i + k, x); else _mm_storeu_ps(o + i + k, x);
    }
  }
  _mm_sfence();
}
template <bool FENCE>
void nt_nofence(char* d, const char* s, size_t n) {
  for (size_t i = 0; i < n; i += 64) {
    __m128i a = _mm_loadu_si128((const __m128i*)(s+i)), b = _mm_loadu_si128((const __m128i*)(s+i+16)),
            c = _mm_loadu_si128((const __m128i*)(s+i+32)), e = _mm_loadu_si128((const __m128i*)(s+i+48));
    _mm_stream_si128((__m128i*)(d+i), a); _mm_stream_si128((__m128i*)(d+i+16), b); _mm_stream_si128((__m128i*)(d+i+32), c); _mm_stream_si128((__m128i*)(d+i+48), e);
  }
  if (FENCE) _mm_sfence();
}
template <bool FENCE, size_t BLOCK>
void sum_block(float* o, const float* a, const float* b, size_t n) {
  alignas(64) float blk[BLOCK / 4];
  for (size_t i = 0; i < n; i += BLOCK / 4) {
    sum_plain(blk, a + i, b + i, BLOCK / 4);
    nt_nofence<FENCE>((char*)(o + i), (const char*)blk, BLOCK);
  }
  _mm_sfence();
}
// reduce through a 16 KiB L1 block then 4-page copy
int main(int argc, char** argv) {
  size_t n = (argc > 1 ? atol(argv[1]) : 128) << 20;
  int procs = argc > 2 ? atoi(argv[2]) : 2;
  for (int p = 1; p < procs; ++p) if (fork() == 0) { procs = -1; break; }
  bool report = procs != -1;
  char* src = (char*)aligned_alloc(4096, n); memset(src, 1, n);
  char* dst = (char*)aligned_alloc(4096, n); memset(dst, 0, n);
  std::vector<char> hot(256 << 10, 1);
  const char* names[] = {"memcpy", "sse ord", "sse nt", "sse nt pf512", "sse ord pf512", "4page nt", "4page ord",
                         "sum plain (a=src, b=hot)", "sum nt pf512 (hot)", "sum ord pf512 (hot)", "sum plain (a=src,b=src)", "sum nt pf512 (src,src)",
                         "copy->hot ring memcpy", "copy->hot ring pf", "sum block16K nofence", "sum block16K fence", "sum block4K nofence", "sum block1K nofence", "sum nt nopf (hot)", "sum nt pf1024", "sum nt pf256"};
  for (int mode = 0; mode < 21; ++mode) {
    std::vector<double> ts;
    for (int rep = 0; rep < 5; ++rep) {
      double t0 = now();
      switch (mode) {
        case 0: memcpy(dst, src, n); break;
        case 1: copy_loop<false, 0>(dst, src, n); break;
        case 2: copy_loop<true, 0>(dst, src, n); break;
        case 3: copy_loop<true, 512>(dst, src, n); break;
        case 4: copy_loop<false, 512>(dst, src, n); break;
        case 5: copy4<true>(dst, src, n); break;
        case 6: copy4<false>(dst, src, n); break;
        case 7: for (size_t i = 0; i < n; i += hot.size()) sum_plain((float*)(dst + i), (const float*)(src + i), (const float*)hot.data(), hot.size() / 4); break;
        case 8: for (size_t i = 0; i < n; i += hot.size()) sum_loop<true, 512>((float*)(dst + i), (const float*)(src + i), (const float*)hot.data(), hot.size() / 4); break;
        case 9: for (size_t i = 0; i < n; i += hot.size()) sum_loop<false, 512>((float*)(dst + i), (const float*)(src + i), (const float*)hot.data(), hot.size() / 4); break;
        case 10: sum_plain((float*)dst, (const float*)src, (const float*)src, n / 4); break;
        case 11: sum_loop<true, 512>((float*)dst, (const float*)src, (const float*)src, n / 4); break;
        case 12: for (size_t i = 0; i < n; i += hot.size()) memcpy(hot.data(), src + i, hot.size()); break;
        case 13: for (size_t i = 0; i < n; i += hot.size()) copy_loop<false, 512>(hot.data(), src + i, hot.size()); break;
        case 14: for (size_t i = 0; i < n; i += hot.size()) sum_block<false, 16384>((float*)(dst + i), (const float*)(src + i), (const float*)hot.data(), hot.size() / 4); break;
        case 15: for (size_t i = 0; i < n; i += hot.size()) sum_block<true, 16384>((float*)(dst + i), (const float*)(src + i), (const float*)hot.data(), hot.size() / 4); break;
        case 16: for (size_t i = 0; i < n; i += hot.size()) sum_block<false, 4096>((float*)(dst + i), (const float*)(src + i), (const float*)hot.data(), hot.size() / 4); break;
        case 17: for (size_t i = 0; i < n; i += hot.size()) sum_block<false, 1024>((float*)(dst + i), (const float*)(src + i), (const float*)hot.data(), hot.size() / 4); break;
        case 18: for (size_t i = 0; i < n; i += hot.size()) sum_loop<true, 0>((float*)(dst + i), (const float*)(src + i), (const float*)hot.data(), hot.size() / 4); break;
        case 19: for (size_t i = 0; i < n; i += hot.size()) sum_loop<true, 1024>((float*)(dst + i), (const float*)(src + i), (const float*)hot.data(), hot.size() / 4); break;
        case 20: for (size_t i = 0; i < n; i += hot.size()) sum_loop<true, 256>((float*)(dst + i), (const float*)(src + i), (const float*)hot.data(), hot.size() / 4); break;
      }
      ts.push_back(now() - t0);
    }
    std::sort(ts.begin(), ts.end());
    if (report) printf("%-28s %4zu MiB  %7.2f ms  %5.2f GB/s(moved)\n", names[mode], n >> 20, ts[2] * 1e3, n / ts[2] / 1e9);
  }
  if (report) wait(nullptr);
}
