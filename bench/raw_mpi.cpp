// Raw MPI: the calls a user of MPI makes (blocking, or non-blocking and waited for), on MPI_COMM_WORLD's
// duplicate. bf16, which MPI lacks,
// travels as 16-bit words with a user-defined sum (what MPI users write for it).
#include "raw_library.h"

#ifdef BPL_BENCH_WITH_MPI
#include <c10/util/BFloat16.h>
#include <mpi.h>

#include <stdexcept>
#include <string>
#include <vector>

namespace backplane::bench {
namespace {

void bf16_sum(void* in, void* inout, int* length, MPI_Datatype*) {
  const auto* x = static_cast<const c10::BFloat16*>(in);
  auto* y = static_cast<c10::BFloat16*>(inout);
  for (int i = 0; i < *length; ++i) y[i] = static_cast<float>(x[i]) + static_cast<float>(y[i]);
}

void check(int code, const char* what) {
  if (code != MPI_SUCCESS) throw std::runtime_error(std::string("raw MPI: ") + what + " failed");
}

class RawMpi : public RawLibrary {
 public:
  RawMpi() {
    int initialized = 0;
    MPI_Initialized(&initialized);
    if (!initialized) throw std::runtime_error("raw MPI: MPI is not initialised (is the mpi backend running?)");
    check(MPI_Comm_dup(MPI_COMM_WORLD, &comm_), "MPI_Comm_dup");
    check(MPI_Op_create(&bf16_sum, 1, &bf16_sum_op_), "MPI_Op_create");
  }
  ~RawMpi() override {
    MPI_Op_free(&bf16_sum_op_);
    MPI_Comm_free(&comm_);
  }

  std::string description() const override {
    char version[MPI_MAX_LIBRARY_VERSION_STRING] = {};
    int length = 0;
    MPI_Get_library_version(version, &length);
    std::string text(version, static_cast<size_t>(length));
    return text.substr(0, text.find_first_of(",\n"));
  }

  bool set_nonblocking() override {
    nonblocking_ = true;
    return true;
  }

  void allreduce(void* buf, size_t count, bpl_dtype dtype) override {
    run("MPI_Allreduce", [&](MPI_Request* r) {
      const int n = static_cast<int>(count);
      return r ? MPI_Iallreduce(MPI_IN_PLACE, buf, n, type(dtype), sum(dtype), comm_, r)
               : MPI_Allreduce(MPI_IN_PLACE, buf, n, type(dtype), sum(dtype), comm_);
    });
  }
  void allgather(const void* send, void* recv, size_t count, bpl_dtype dtype) override {
    run("MPI_Allgather", [&](MPI_Request* r) {
      const int n = static_cast<int>(count);
      return r ? MPI_Iallgather(send, n, type(dtype), recv, n, type(dtype), comm_, r)
               : MPI_Allgather(send, n, type(dtype), recv, n, type(dtype), comm_);
    });
  }
  void reduce_scatter(void* send, void* recv, size_t recvcount, bpl_dtype dtype) override {
    run("MPI_Reduce_scatter_block", [&](MPI_Request* r) {
      const int n = static_cast<int>(recvcount);
      return r ? MPI_Ireduce_scatter_block(send, recv, n, type(dtype), sum(dtype), comm_, r)
               : MPI_Reduce_scatter_block(send, recv, n, type(dtype), sum(dtype), comm_);
    });
  }
  void broadcast(void* buf, size_t count, bpl_dtype dtype, int root) override {
    run("MPI_Bcast", [&](MPI_Request* r) {
      const int n = static_cast<int>(count);
      return r ? MPI_Ibcast(buf, n, type(dtype), root, comm_, r) : MPI_Bcast(buf, n, type(dtype), root, comm_);
    });
  }
  void alltoall(const void* send, void* recv, size_t count, bpl_dtype dtype) override {
    run("MPI_Alltoall", [&](MPI_Request* r) {
      const int n = static_cast<int>(count);
      return r ? MPI_Ialltoall(send, n, type(dtype), recv, n, type(dtype), comm_, r)
               : MPI_Alltoall(send, n, type(dtype), recv, n, type(dtype), comm_);
    });
  }
  void reduce(const void* send, void* recv, size_t count, bpl_dtype dtype, int root) override {
    run("MPI_Reduce", [&](MPI_Request* r) {
      const int n = static_cast<int>(count);
      return r ? MPI_Ireduce(send, recv, n, type(dtype), sum(dtype), root, comm_, r)
               : MPI_Reduce(send, recv, n, type(dtype), sum(dtype), root, comm_);
    });
  }
  void gather(const void* send, void* recv, size_t count, bpl_dtype dtype, int root) override {
    run("MPI_Gather", [&](MPI_Request* r) {
      const int n = static_cast<int>(count);
      return r ? MPI_Igather(send, n, type(dtype), recv, n, type(dtype), root, comm_, r)
               : MPI_Gather(send, n, type(dtype), recv, n, type(dtype), root, comm_);
    });
  }
  void scatter(const void* send, void* recv, size_t count, bpl_dtype dtype, int root) override {
    run("MPI_Scatter", [&](MPI_Request* r) {
      const int n = static_cast<int>(count);
      return r ? MPI_Iscatter(send, n, type(dtype), recv, n, type(dtype), root, comm_, r)
               : MPI_Scatter(send, n, type(dtype), recv, n, type(dtype), root, comm_);
    });
  }
  void allgatherv(const void* send, void* recv, size_t count, bpl_dtype dtype) override {
    const std::vector<int> counts(static_cast<size_t>(size()), static_cast<int>(count)), displs = prefix_sums(counts);
    run("MPI_Allgatherv", [&](MPI_Request* r) {
      const int n = static_cast<int>(count);
      return r ? MPI_Iallgatherv(send, n, type(dtype), recv, counts.data(), displs.data(), type(dtype), comm_, r)
               : MPI_Allgatherv(send, n, type(dtype), recv, counts.data(), displs.data(), type(dtype), comm_);
    });
  }
  void alltoallv(const void* send, void* recv, size_t count, bpl_dtype dtype) override {
    const std::vector<int> counts(static_cast<size_t>(size()), static_cast<int>(count)), displs = prefix_sums(counts);
    run("MPI_Alltoallv", [&](MPI_Request* r) {
      return r ? MPI_Ialltoallv(send, counts.data(), displs.data(), type(dtype), recv, counts.data(), displs.data(),
                                type(dtype), comm_, r)
               : MPI_Alltoallv(send, counts.data(), displs.data(), type(dtype), recv, counts.data(), displs.data(),
                               type(dtype), comm_);
    });
  }
  void send(const void* buf, size_t bytes, int peer) override {
    run("MPI_Send", [&](MPI_Request* r) {
      const int n = static_cast<int>(bytes);
      return r ? MPI_Isend(buf, n, MPI_BYTE, peer, 0, comm_, r) : MPI_Send(buf, n, MPI_BYTE, peer, 0, comm_);
    });
  }
  void recv(void* buf, size_t bytes, int peer) override {
    run("MPI_Recv", [&](MPI_Request* r) {
      const int n = static_cast<int>(bytes);
      return r ? MPI_Irecv(buf, n, MPI_BYTE, peer, 0, comm_, r) : MPI_Recv(buf, n, MPI_BYTE, peer, 0, comm_, MPI_STATUS_IGNORE);
    });
  }
  void barrier() override {
    run("MPI_Barrier", [&](MPI_Request* r) { return r ? MPI_Ibarrier(comm_, r) : MPI_Barrier(comm_); });
  }

 private:
  // call(nullptr) makes the blocking call; call(&request) posts the non-blocking one, waited for here.
  template <typename Call>
  void run(const char* what, Call&& call) {
    if (!nonblocking_) return check(call(nullptr), what);
    MPI_Request request = MPI_REQUEST_NULL;
    check(call(&request), what);
    check(MPI_Wait(&request, MPI_STATUS_IGNORE), what);
  }

  MPI_Datatype type(bpl_dtype dtype) const { return dtype == BPL_DTYPE_BF16 ? MPI_UINT16_T : MPI_FLOAT; }
  int size() const {
    int n = 1;
    MPI_Comm_size(comm_, &n);
    return n;
  }
  static std::vector<int> prefix_sums(const std::vector<int>& counts) {
    std::vector<int> displs(counts.size(), 0);
    for (size_t i = 1; i < counts.size(); ++i) displs[i] = displs[i - 1] + counts[i - 1];
    return displs;
  }
  MPI_Op sum(bpl_dtype dtype) const { return dtype == BPL_DTYPE_BF16 ? bf16_sum_op_ : MPI_SUM; }

  MPI_Comm comm_ = MPI_COMM_NULL;
  MPI_Op bf16_sum_op_ = MPI_OP_NULL;
  bool nonblocking_ = false;
};

}  // namespace

std::unique_ptr<RawLibrary> open_raw_mpi() { return std::make_unique<RawMpi>(); }

}  // namespace backplane::bench
#else
std::unique_ptr<backplane::bench::RawLibrary> backplane::bench::open_raw_mpi() { return nullptr; }
#endif
