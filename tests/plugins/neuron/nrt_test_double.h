/* What the parts of the libnrt test double (nrt_test_double.c) share: the runtime's codes, its tensor,
 * the wire between a member and the hub, and the calls each part makes into another. Internal to the
 * double: its library exports only the runtime's entry points (EXPORT). */
#pragma once
#include <errno.h>
#include <math.h>
#include <netdb.h>
#include <poll.h>
#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#define EXPORT __attribute__((visibility("default")))

enum { NRT_SUCCESS = 0, NRT_FAILURE = 1, NRT_INVALID = 2, NRT_RESOURCE = 4, NRT_TIMEOUT = 5,
       NRT_UNINITIALIZED = 13, NRT_EXEC_BAD_INPUT = 1002, NRT_EXEC_COMPLETED_WITH_NUM_ERR = 1003 };
enum { DT_INT8 = 0x2, DT_UINT8 = 0x3, DT_BF16 = 0x6, DT_F16 = 0x7, DT_INT32 = 0x8, DT_F32 = 0xA, DT_INT64 = 0xC };
enum { OP_ADD = 0, OP_MAX = 2, OP_MIN = 3 };
enum { CC_ALLGATHER = 0, CC_ALLREDUCE = 1, CC_REDUCESCATTER = 2 };
#define COLLECTIVES_XU 4ull
#define SEQ_MASK ((1ull << 48) - 1)
#define MAX_GROUP 64

typedef struct nrt_tensor {
  char* data;
  size_t size;
  int owns, placement;
  char name[64];
} nrt_tensor_t;

/* nrt_test_double.c: whether nrt_init ran (and nrt_close did not since); an integer from the environment;
 * the bytes of an element of a DT_* type (0 for a type the double does not know). */
int runtime_initialized(void);
int env_int(const char* name, int fallback);
size_t dtype_bytes(int dtype);

/* ---- the wire (nrt_test_double_hub.c) ---- */

/* What a member sends the hub, then its input; the hub answers a reply, then the member's output. */
typedef struct {
  uint32_t group_n, rank, cc_op, dtype, op, pad;
  uint64_t instance; /* how many collectives this member ran on this group before */
  uint64_t in_bytes, out_bytes;
  uint32_t group[MAX_GROUP];
} request_t;
typedef struct {
  uint64_t status, bytes;
} reply_t;

int send_all(int fd, const void* data, size_t size);
int recv_all(int fd, void* data, size_t size);
/* A TCP socket to, or (listening) on, "host:port"; connecting retries until the hub listens, for at most
 * NRT_TEST_DOUBLE_CONNECT_TIMEOUT_S (60 s). -1 on failure. */
int open_socket(const char* address, int listening);

/* The hub, in global rank 0's process: listens on `address` and serves `world` members on a thread of
 * its own. 0 once it listens, -1 if it cannot. */
int hub_start(const char* address, int world);
/* Lets the hub serve the members still connected for up to 30 s more, then ends it. */
void hub_stop(void);

/* nrt_test_double_collectives.c: ends the collectives queue and the hub (nrt_close). */
void stop_collectives(void);
