// What the conformance suite's files share: this rank's world, the cases (dtype × reduce op × size)
// and their inputs, and the skip for what a backend does not provide.
#pragma once

#include <gtest/gtest.h>

#include <cctype>
#include <cstdio>
#include <algorithm>
#include <cstring>
#include <set>
#include <string>
#include <vector>

#include "backplane/backplane.h"
#include "support/ranks.h"
#include "support/values.h"

namespace backplane::test {

struct World {
  bpl_runtime* runtime = nullptr;
  bpl_comm* comm = nullptr;
  int rank = 0;
  int size = 1;
  bpl_runtime_info info = BPL_RUNTIME_INFO_INIT;
};
inline World world;  // this rank's, set up by main

// 1 MiB and a bit for any dtype, and odd.
inline size_t large_count(bpl_dtype dtype) { return (1u << 20) / bpl_dtype_size(dtype) + 3; }

inline std::vector<size_t> sizes_for(bpl_dtype dtype) { return {0, 1, 37, large_count(dtype)}; }

// Skips (with the reason) what the backend reports it does not provide.
#define SKIP_UNLESS_SUPPORTED(coll, dtype, op)                                                                   \
  do {                                                                                                          \
    if (!(world.info.collectives & BPL_BIT(coll))) GTEST_SKIP() << world.info.backend << " lacks " << bpl_collective_name(coll); \
    if ((dtype) && !(world.info.dtypes & BPL_BIT(dtype))) GTEST_SKIP() << world.info.backend << " lacks dtype " << bpl_dtype_name(dtype); \
    if ((op) && !(world.info.reduce_ops & BPL_BIT(op))) GTEST_SKIP() << world.info.backend << " lacks op " << bpl_reduce_op_name(op); \
  } while (0)

#define EXPECT_OK(call) EXPECT_EQ((call), BPL_OK) << bpl_last_error()

struct Case {
  bpl_dtype dtype;
  bpl_reduce_op op;  // 0 for collectives without one
  size_t count;
};

inline std::string case_name(const ::testing::TestParamInfo<Case>& info) {
  std::string name = bpl_dtype_name(info.param.dtype);
  if (info.param.op) name += std::string("_") + bpl_reduce_op_name(info.param.op);
  return name + "_" + std::to_string(info.param.count);
}

inline std::vector<Case> reduction_cases() {
  std::vector<Case> cases;
  for (bpl_dtype dtype : kAllDtypes)
    for (bpl_reduce_op op : kAllOps)
      for (size_t count : sizes_for(dtype)) {
        if (defined_for(op, dtype)) cases.push_back({dtype, op, count});
      }
  return cases;
}

inline std::vector<Case> data_cases() {
  std::vector<Case> cases;
  for (bpl_dtype dtype : kAllDtypes)
    for (size_t count : sizes_for(dtype)) cases.push_back({dtype, 0, count});
  return cases;
}

inline Buffer input(const Case& c, int rank, size_t blocks = 1) {
  Buffer buffer(c.dtype, c.count * blocks);
  for (size_t i = 0; i < c.count * blocks; ++i) buffer.set(i, input_value(c.dtype, c.op, rank, i));
  return buffer;
}

}  // namespace backplane::test
