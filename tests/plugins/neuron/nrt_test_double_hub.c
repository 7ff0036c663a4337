/* The libnrt test double's hub (see nrt_test_double.c): in global rank 0's process, it gathers each
 * collective's contributions from its members, reduces them (f16/bf16 in f32, integers wrapping) and
 * answers every member; and the wire the members and the hub talk over. */
#define _GNU_SOURCE
#include "nrt_test_double.h"

#include <stdatomic.h>

int send_all(int fd, const void* data, size_t size) {
  const char* p = data;
  while (size > 0) {
    ssize_t n = send(fd, p, size, MSG_NOSIGNAL);
    if (n <= 0) {
      if (n < 0 && errno == EINTR) continue;
      return -1;
    }
    p += n, size -= (size_t)n;
  }
  return 0;
}
int recv_all(int fd, void* data, size_t size) {
  char* p = data;
  while (size > 0) {
    ssize_t n = recv(fd, p, size, 0);
    if (n <= 0) {
      if (n < 0 && errno == EINTR) continue;
      return -1;
    }
    p += n, size -= (size_t)n;
  }
  return 0;
}

int open_socket(const char* address, int listening) {
  char host[256];
  snprintf(host, sizeof(host), "%s", address);
  char* colon = strrchr(host, ':');
  if (colon == NULL) return -1;
  *colon = '\0';
  struct addrinfo hints = {0}, *found = NULL;
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = listening ? AI_PASSIVE : 0;
  if (getaddrinfo(host, colon + 1, &hints, &found) != 0) return -1;
  int fd = -1;
  const time_t give_up = time(NULL) + env_int("NRT_TEST_DOUBLE_CONNECT_TIMEOUT_S", 60);
  for (;;) {
    for (struct addrinfo* a = found; a != NULL && fd < 0; a = a->ai_next) {
      fd = socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol);
      if (fd < 0) continue;
      int one = 1;
      setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
      setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one)); /* a header, then data: no Nagle wait */
      if (listening ? bind(fd, a->ai_addr, a->ai_addrlen) == 0 && listen(fd, 128) == 0
                    : connect(fd, a->ai_addr, a->ai_addrlen) == 0)
        break;
      close(fd);
      fd = -1;
    }
    if (fd >= 0 || listening || time(NULL) >= give_up) break;
    usleep(20000); /* the hub is not listening yet */
  }
  freeaddrinfo(found);
  return fd;
}

/* f16 and bf16 to and from f32, rounding to nearest even. */
static float half_to_float(uint16_t h) {
  const uint32_t sign = (uint32_t)(h & 0x8000) << 16, exponent = (h >> 10) & 0x1f, mantissa = h & 0x3ff;
  float value;
  if (exponent == 0) value = ldexpf((float)mantissa, -24);
  else if (exponent == 31) value = mantissa ? NAN : INFINITY;
  else value = ldexpf((float)(mantissa | 0x400), (int)exponent - 25);
  uint32_t bits;
  memcpy(&bits, &value, 4);
  bits |= sign;
  memcpy(&value, &bits, 4);
  return value;
}
static uint16_t float_to_half(float f) {
  uint32_t bits;
  memcpy(&bits, &f, 4);
  const uint16_t sign = (uint16_t)((bits >> 16) & 0x8000);
  const float magnitude = fabsf(f);
  if (isnan(f)) return sign | 0x7e00;
  if (magnitude >= 65520.0f) return sign | 0x7c00;
  if (magnitude < ldexpf(1.0f, -14)) return sign | (uint16_t)lrintf(magnitude * ldexpf(1.0f, 24));
  int exponent;
  const float fraction = frexpf(magnitude, &exponent); /* magnitude = fraction * 2^exponent, fraction in [0.5, 1) */
  long mantissa = lrintf(ldexpf(fraction, 11));       /* 11 bits, rounded to nearest even */
  if (mantissa == 2048) mantissa = 1024, ++exponent;
  return sign | (uint16_t)(((exponent + 14) << 10) | (mantissa & 0x3ff));
}
static float bf16_to_float(uint16_t b) {
  uint32_t bits = (uint32_t)b << 16;
  float f;
  memcpy(&f, &bits, 4);
  return f;
}
static uint16_t float_to_bf16(float f) {
  uint32_t bits;
  memcpy(&bits, &f, 4);
  if (isnan(f)) return (uint16_t)((bits >> 16) | 0x40);
  bits += 0x7fff + ((bits >> 16) & 1);
  return (uint16_t)(bits >> 16);
}

/* out[i] = reduction over `n` inputs in order, accumulating floats in f32 and wrapping integers. */
static void reduce_all(void* out, char** in, int n, size_t count, int dtype, int op) {
#define REDUCE(T, W)                                                                         \
  for (size_t i = 0; i < count; ++i) {                                                       \
    T acc = ((T*)in[0])[i];                                                                  \
    for (int r = 1; r < n; ++r) {                                                            \
      T v = ((T*)in[r])[i];                                                                  \
      acc = op == OP_ADD ? (T)((W)acc + (W)v) : op == OP_MAX ? (v > acc ? v : acc) : (v < acc ? v : acc); \
    }                                                                                        \
    ((T*)out)[i] = acc;                                                                      \
  }
#define REDUCE_16(TO_FLOAT, FROM_FLOAT)                                                      \
  for (size_t i = 0; i < count; ++i) {                                                       \
    float acc = TO_FLOAT(((uint16_t*)in[0])[i]);                                             \
    for (int r = 1; r < n; ++r) {                                                            \
      float v = TO_FLOAT(((uint16_t*)in[r])[i]);                                             \
      acc = op == OP_ADD ? acc + v : op == OP_MAX ? (v > acc ? v : acc) : (v < acc ? v : acc); \
    }                                                                                        \
    ((uint16_t*)out)[i] = FROM_FLOAT(acc);                                                   \
  }
  switch (dtype) {
    case DT_F32: REDUCE(float, float) break;
    case DT_INT8: REDUCE(int8_t, uint8_t) break;
    case DT_UINT8: REDUCE(uint8_t, uint8_t) break;
    case DT_INT32: REDUCE(int32_t, uint32_t) break;
    case DT_INT64: REDUCE(int64_t, uint64_t) break;
    case DT_F16: REDUCE_16(half_to_float, float_to_half) break;
    case DT_BF16: REDUCE_16(bf16_to_float, float_to_bf16) break;
  }
#undef REDUCE
#undef REDUCE_16
}

/* Computes what every member of a completed operation receives. `in[r]` is member r's input. */
static char** outputs_of(const request_t* q, char** in) {
  char** out = calloc(q->group_n, sizeof(char*));
  const int n = (int)q->group_n;
  if (q->cc_op == CC_ALLGATHER) {
    char* all = malloc(q->out_bytes);
    for (int r = 0; r < n; ++r) memcpy(all + (size_t)r * q->in_bytes, in[r], q->in_bytes);
    for (int r = 0; r < n; ++r) out[r] = r == 0 ? all : memcpy(malloc(q->out_bytes), all, q->out_bytes);
  } else {
    char* reduced = malloc(q->in_bytes);
    reduce_all(reduced, in, n, q->in_bytes / dtype_bytes((int)q->dtype), (int)q->dtype, (int)q->op);
    for (int r = 0; r < n; ++r) {
      out[r] = malloc(q->out_bytes);
      memcpy(out[r], reduced + (q->cc_op == CC_REDUCESCATTER ? (size_t)r * q->out_bytes : 0), q->out_bytes);
    }
    free(reduced);
  }
  return out;
}

/* ---- the hub (global rank 0's process) ---- */

typedef struct pending {
  request_t request;   /* of the first member to arrive: the operation's key */
  int arrived;
  int fd[MAX_GROUP];   /* by member rank; -1 until it arrives */
  char* in[MAX_GROUP];
  struct pending* next;
} pending_t;

static int same_operation(const request_t* a, const request_t* b) {
  return a->group_n == b->group_n && a->instance == b->instance &&
         memcmp(a->group, b->group, a->group_n * sizeof(uint32_t)) == 0;
}

static void answer(pending_t* p, uint64_t status) {
  char** out = status == NRT_SUCCESS ? outputs_of(&p->request, p->in) : NULL;
  for (uint32_t r = 0; r < p->request.group_n; ++r) {
    if (p->fd[r] >= 0) {
      reply_t reply = {status, status == NRT_SUCCESS ? p->request.out_bytes : 0};
      send_all(p->fd[r], &reply, sizeof(reply));
      if (out != NULL) send_all(p->fd[r], out[r], p->request.out_bytes);
    }
    if (out != NULL) free(out[r]);
    free(p->in[r]);
  }
  free(out);
}

static struct {
  int listener, world;
  pthread_t thread;
  atomic_llong stop_after; /* 0 while serving; then the time (s) at which to stop waiting for members */
} hub = {-1, 0, 0, 0};

static void* hub_main(void* unused) {
  (void)unused;
  const int world = hub.world < 1 ? 1 : hub.world > MAX_GROUP ? MAX_GROUP : hub.world;
  int fds[MAX_GROUP], dead[MAX_GROUP] = {0};
  uint32_t member_of_fd[MAX_GROUP];
  int connected = 0;
  pending_t* pending = NULL;
  while (connected < world) { /* every member says hello with its global rank */
    int fd = accept(hub.listener, NULL, NULL);
    if (fd < 0) {
      if (errno == EINTR) continue;
      return NULL; /* closed by hub_stop */
    }
    uint32_t who = 0;
    if (recv_all(fd, &who, sizeof(who)) != 0 || who >= (uint32_t)world) {
      close(fd);
      continue;
    }
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    fds[connected] = fd, member_of_fd[connected] = who, ++connected;
  }
  struct pollfd polls[MAX_GROUP];
  for (;;) {
    for (int i = 0; i < world; ++i) polls[i] = (struct pollfd){dead[member_of_fd[i]] ? -1 : fds[i], POLLIN, 0};
    if (poll(polls, (nfds_t)world, 200) < 0 && errno != EINTR) break;
    int gone = 0;
    for (int i = 0; i < world; ++i) gone += dead[i];
    if (gone == world || (atomic_load(&hub.stop_after) != 0 && time(NULL) >= atomic_load(&hub.stop_after))) break;
    for (int i = 0; i < world; ++i) {
      if (polls[i].revents == 0) continue;
      request_t q;
      if (recv_all(fds[i], &q, sizeof(q)) != 0) { /* a member went away: fail what waits on it */
        dead[member_of_fd[i]] = 1;
        for (pending_t** p = &pending; *p != NULL;) {
          int involved = 0;
          for (uint32_t r = 0; r < (*p)->request.group_n; ++r) involved |= (*p)->request.group[r] == member_of_fd[i];
          if (!involved) { p = &(*p)->next; continue; }
          pending_t* gone = *p;
          *p = gone->next;
          answer(gone, NRT_FAILURE);
          free(gone);
        }
        continue;
      }
      char* input = malloc(q.in_bytes ? q.in_bytes : 1);
      if (recv_all(fds[i], input, q.in_bytes) != 0) { free(input); dead[member_of_fd[i]] = 1; continue; }
      int member_dead = 0;
      for (uint32_t r = 0; r < q.group_n; ++r) member_dead |= dead[q.group[r]];
      pending_t* p = pending;
      while (p != NULL && !same_operation(&p->request, &q)) p = p->next;
      if (p == NULL) {
        p = calloc(1, sizeof(*p));
        p->request = q;
        for (int r = 0; r < MAX_GROUP; ++r) p->fd[r] = -1;
        p->next = pending, pending = p;
      }
      p->fd[q.rank] = fds[i], p->in[q.rank] = input;
      /* Members that disagree on the operation get NRT_INVALID, as a mismatched collective would fail. */
      const int mismatch = q.cc_op != p->request.cc_op || q.dtype != p->request.dtype || q.op != p->request.op ||
                           q.in_bytes != p->request.in_bytes || q.out_bytes != p->request.out_bytes;
      if (member_dead || mismatch || ++p->arrived == (int)q.group_n) {
        for (pending_t** link = &pending; *link != NULL; link = &(*link)->next)
          if (*link == p) { *link = p->next; break; }
        answer(p, member_dead ? NRT_FAILURE : mismatch ? NRT_INVALID : NRT_SUCCESS);
        free(p);
      }
    }
  }
  while (pending != NULL) {
    pending_t* p = pending;
    pending = p->next;
    answer(p, NRT_FAILURE);
    free(p);
  }
  for (int i = 0; i < connected; ++i) close(fds[i]);
  return NULL;
}
int hub_start(const char* address, int world) {
  hub.listener = open_socket(address, 1);
  if (hub.listener < 0) return -1;
  hub.world = world;
  atomic_store(&hub.stop_after, 0);
  pthread_create(&hub.thread, NULL, hub_main, NULL);
  return 0;
}

void hub_stop(void) {
  if (hub.listener < 0) return;
  atomic_store(&hub.stop_after, (long long)time(NULL) + 30);
  shutdown(hub.listener, SHUT_RDWR);
  pthread_join(hub.thread, NULL);
  close(hub.listener);
  hub.listener = -1;
}
