// probe: cross-memory read bandwidth at large sizes, direct vs bounced through a hot buffer with NT stores
#include <sys/uio.h>
#include <sys/wait.h>
#include <unistd.h>
#include <emmintrin.h>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>
#include <algorithm>
static double now() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }
static void nt_copy(char* d, const char* s, size_t n) {
  for (size_t i = 0; i + 64 <= n; i += 64) {
    __m128i a = _mm_loadu_si128((const __m128i*)(s+i)), b = _mm_loadu_si128((const __m128i*)(s+i+16)),
            c = _mm_loadu_si128((const __m128i*)(s+i+32)), e = _mm_loadu_si128((const __m128i*)(s+i+48));
    _mm_stream_si128((__m128i*)(d+i), a); _mm_stream_si128((__m128i*)(d+i+16), b);
    _mm_stream_si128((__m128i*)(d+i+32), c); _mm_stream_si128((__m128i*)(d+i+48), e);
  }
  _mm_sfence();
}
int main(int argc, char** argv) {
  size_t n = (argc > 1 ? atol(argv[1]) : 128) << 20;
  int busy = argc > 2 ? atoi(argv[2]) : 1;  // parent copies its own buffer meanwhile
  size_t bounce = (argc > 3 ? atol(argv[3]) : 256) << 10;
  char* src = (char*)aligned_alloc(4096, n); memset(src, 1, n);
  char* src2 = (char*)aligned_alloc(4096, n); memset(src2, 2, n);
  int p2c[2], c2p[2]; pipe(p2c); pipe(c2p);
  pid_t parent = getpid();
  pid_t child = fork();
  if (child == 0) {
    char* dst = (char*)aligned_alloc(4096, n); memset(dst, 0, n);
    std::vector<char> b(bounce);
    memset(b.data(), 0, bounce);
    const char* names[] = {"memcpy(local)", "nt_copy(local)", "vm_readv direct", "vm_readv 4MiB pieces", "vm_readv bounce+nt"};
    for (int mode = 0; mode < 5; ++mode) {
      std::vector<double> ts;
      for (int rep = 0; rep < 7; ++rep) {
        char go; write(c2p[1], "g", 1); read(p2c[0], &go, 1);
        double t0 = now();
        if (mode == 0) memcpy(dst, src2, n);
        else if (mode == 1) nt_copy(dst, src2, n);
        else if (mode == 2) { for (size_t d = 0; d < n;) { iovec l{dst + d, n - d}, r{src + d, n - d}; ssize_t k = process_vm_readv(parent, &l, 1, &r, 1, 0); if (k <= 0) { perror("readv"); return 1; } d += k; } }
        else if (mode == 3) { size_t piece = 4 << 20; for (size_t d = 0; d < n; d += piece) { size_t m = std::min(piece, n - d); iovec l{dst + d, m}, r{src + d, m}; process_vm_readv(parent, &l, 1, &r, 1, 0); } }
        else { for (size_t d = 0; d < n; d += bounce) { size_t m = std::min(bounce, n - d); iovec l{b.data(), m}, r{src + d, m}; process_vm_readv(parent, &l, 1, &r, 1, 0); nt_copy(dst + d, b.data(), m); } }
        ts.push_back(now() - t0);
        write(c2p[1], "d", 1);
      }
      std::sort(ts.begin(), ts.end());
      printf("%-22s %6zu MiB  median %7.2f ms  %5.2f GB/s  (min %.2f max %.2f)\n", names[mode], n >> 20, ts[3] * 1e3, n / ts[3] / 1e9, ts[0]*1e3, ts[6]*1e3);
      if (dst[n/2] != (mode < 2 ? 2 : 1)) printf("WRONG\n");
    }
    write(c2p[1], "q", 1);
    return 0;
  }
  char* mine = (char*)aligned_alloc(4096, n); memset(mine, 0, n);
  for (;;) {
    char c; read(c2p[0], &c, 1);
    if (c == 'q') break;
    write(p2c[1], "g", 1);
    if (busy) { memcpy(mine, src2, n); }
    read(c2p[0], &c, 1);
  }
  wait(nullptr);
}
